"""Megatron-Bridge 0.3.1's real callback API, loaded from the installed file on CPU."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest

from scout_core.testing import run_ranks

ENV = {"OMP_NUM_THREADS": "1"}

EVENTS = {
    f"on_{phase}_{what}"
    for phase in ("train", "eval", "test")
    for what in ("start", "step_start", "step_end", "end")
}


@pytest.fixture(scope="module")
def api() -> Any:
    from scout_megatron.bridge import bridge_callbacks, callbacks_file

    from scout_core import UnsupportedSetupError

    try:
        callbacks_file()
    except UnsupportedSetupError as exc:
        pytest.skip(str(exc))
    return bridge_callbacks()


def test_bridge_0_3_api_facts(api: Any) -> None:
    from scout_megatron.bridge import bridge_version

    assert bridge_version() == "0.3.1"
    assert set(api.VALID_EVENTS) == EVENTS
    assert not hasattr(api.Callback, "on_checkpoint_save")
    for event in EVENTS:
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
