"""Megatron-Bridge's real callback API (0.3.1 on Python 3.11, 0.6.2 on 3.12), loaded from
the installed file on CPU, and the stand-in loop checked against Bridge's own ``train()``."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Any

import pytest

from scout_core.testing import run_ranks

ENV = {"OMP_NUM_THREADS": "1"}

EVENTS = {
    f"on_{phase}_{what}"
    for phase in ("train", "eval", "test")
    for what in ("start", "step_start", "step_end", "end")
}
NEW_EVENTS = {"0.3.1": set(), "0.6.2": {"on_data_init_start", "on_checkpoint_save"}}
"""Events beyond the twelve of 0.3.1, by the Bridge release each environment installs."""
TRAIN_EVENTS = ["on_train_start", "on_train_step_start", "on_train_step_end", "on_train_end"]


@pytest.fixture(scope="module")
def api() -> Any:
    from scout_megatron.bridge import bridge_callbacks, callbacks_file

    from scout_core import UnsupportedSetupError

    try:
        callbacks_file()
    except UnsupportedSetupError as exc:  # bootstrap installs Bridge: its absence is a failure
        pytest.fail(str(exc))
    return bridge_callbacks()


def test_bridge_api_facts(api: Any) -> None:
    from scout_megatron.bridge import bridge_version

    version = bridge_version()
    assert version in NEW_EVENTS
    assert set(api.VALID_EVENTS) == EVENTS | NEW_EVENTS[version]
    assert hasattr(api.Callback, "on_checkpoint_save") == (version != "0.3.1")
    for event in api.VALID_EVENTS:
        params = list(inspect.signature(getattr(api.Callback, event)).parameters)
        assert params == ["self", "context"]
    fields = [f.name for f in dataclasses.fields(api.CallbackContext)]
    assert fields == [
        "state",
        "model",
        "user_state",
        "optimizer",
        "scheduler",
        "loss_dict",
        "grad_norm",
        "skipped_iter",
        "total_loss_dict",
    ]
    for name in ("add", "register", "fire", "has_callbacks", "list_callbacks", "user_state"):
        assert hasattr(api.CallbackManager, name)


def test_loader_returns_one_module_and_prefers_bridge_own(api: Any) -> None:
    import sys

    from scout_megatron.bridge import BRIDGE_MODULE, bridge_callbacks

    assert bridge_callbacks() is api
    assert BRIDGE_MODULE not in sys.modules  # loaded privately, Bridge's name untouched
    sys.modules[BRIDGE_MODULE] = api  # as after Bridge's own import
    try:
        assert bridge_callbacks() is api
    finally:
        del sys.modules[BRIDGE_MODULE]


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_real_callback_manager_drives_a_tp2_training_loop(api: Any) -> None:
    from mg_bridge_scenarios import bridge_loop_tp2

    results = run_ranks(bridge_loop_tp2, 2, args=(3,), timeout_s=170, env=ENV)
    for out in results:
        assert out["events"] == [
            ["on_train_start", 0],
            ["on_train_step_start", 0],
            ["on_train_step_end", 0],
            ["on_train_step_start", 1],
            ["on_train_step_end", 1],
            ["on_train_step_start", 2],
            ["on_train_step_end", 2],
            ["on_train_end", 3],
        ]
        assert out["functional"] == [0, 1, 2] and out["final_step"] == 3
        assert out["user_state"] == {"layers": [1, 2], "inner": ["AdamW"]}
        assert out["n_losses"] == 3
        assert out["active"] == [
            "on_train_end",
            "on_train_start",
            "on_train_step_end",
            "on_train_step_start",
        ]
        assert out["same_bits"]


@pytest.mark.usefixtures("megatron_core")
def test_stand_in_loop_fires_what_bridge_train_fires(api: Any) -> None:
    """The stand-in loop against the call sites of Bridge's own ``train()`` (parsed from
    the installed ``train.py``): the same training events in the same order, the same
    context keywords (the stand-in passes the ones beyond state, model, user_state,
    optimizer and scheduler explicitly), and the step counter incremented between
    ``on_train_step_end`` and the next iteration in both. A Bridge release that
    renames, drops, reorders or re-keys one of them fails here."""
    from scout_megatron.testing import bridge_loop
    from scout_megatron.testing.bridge_source import bridge_file, fire_sites, step_increments

    train = bridge_file("train.py")
    theirs = [s for s in fire_sites(train, "train") if s.event.startswith("on_train")]
    mine = fire_sites(Path(bridge_loop.__file__), "run_bridge_loop")
    assert [s.event for s in theirs] == TRAIN_EVENTS
    assert [s.event for s in mine] == TRAIN_EVENTS
    assert {s.event for s in fire_sites(train, "train")} <= set(api.VALID_EVENTS)
    common = {"state", "model", "user_state", "optimizer", "scheduler"}
    context = {f.name for f in dataclasses.fields(api.CallbackContext)}
    for bridge_site, loop_site in zip(theirs, mine, strict=True):
        assert bridge_site.keywords <= context
        assert bridge_site.keywords == loop_site.keywords | common, bridge_site.event
    step_end, train_end = theirs[2].line, theirs[3].line
    assert [line for line in step_increments(train, "train") if step_end < line < train_end]
    ours = step_increments(Path(bridge_loop.__file__), "run_bridge_loop")
    assert [line for line in ours if mine[2].line < line < mine[3].line]


@pytest.mark.usefixtures("megatron_core")
def test_every_event_the_scout_callback_takes_is_fired_by_bridge(api: Any) -> None:
    """Each Bridge event ScoutCallback overrides has a call site in Bridge's training or
    checkpointing source (0.6.2 fires on_checkpoint_save from its save)."""
    from scout_megatron import ScoutCallback
    from scout_megatron.testing.bridge_source import bridge_file, fire_sites

    taken = {
        e for e in api.VALID_EVENTS if getattr(ScoutCallback, e) is not getattr(api.Callback, e)
    }
    assert set(TRAIN_EVENTS) <= taken
    fired = {
        s.event for name in ("train.py", "checkpointing.py") for s in fire_sites(bridge_file(name))
    }
    assert taken <= fired, taken - fired
