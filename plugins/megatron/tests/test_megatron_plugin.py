"""The megatron plugin's facts and switches, without a process group.

Whether SCOUT is on is decided before anything is attached: an explicit config, a
Megatron-LM ``--scout-*`` flag, a Bridge config's ``env_vars``, or the environment
(``SCOUT_CONFIG`` / ``SCOUT_ENABLED``); off by default.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from scout_core import Config, ConfigError, UnsupportedSetupError


@pytest.fixture
def environ(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A private copy of the environment without SCOUT_* (callbacks_from writes into it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCOUT_")}
    monkeypatch.setattr(os, "environ", env)
    return env


def test_registered_plugin_facts_and_foreign_objects() -> None:
    import scout_megatron

    from scout_core.testing import installed_plugins

    plugin = scout_megatron.plugin
    assert installed_plugins()["megatron"] is plugin
    assert (plugin.name, plugin.framework, plugin.supported) == (
        "megatron",
        "megatron-core",
        ">=0.16,<0.20",
    )
    from scout_megatron.versions import TESTED

    assert plugin.gates_checkpoints and plugin.framework_version() in TESTED
    assert not plugin.handles(torch.nn.Linear(2, 2))
    assert not plugin.handles(object()) and not plugin.handles([torch.nn.Linear(2, 2)])
    chunks = [torch.nn.Linear(2, 2)]
    assert plugin.key(chunks) is chunks[0] and plugin.key(chunks[0]) is chunks[0]


def test_enable_needs_the_optimizer() -> None:
    from scout_megatron import plugin

    with pytest.raises(UnsupportedSetupError, match="and their MegatronOptimizer"):
        plugin.enable([torch.nn.Linear(2, 2)], config=Config())


def test_attach_when_off_attaches_nothing(environ: dict[str, str]) -> None:
    import scout_megatron

    chunks = [torch.nn.Linear(2, 2)]
    opt = torch.optim.SGD(chunks[0].parameters(), lr=0.1)
    session = scout_megatron.attach(chunks, opt)  # no config, no SCOUT_*: off
    assert not session.enabled and session.adapter is None
    assert scout_megatron.session_of(chunks) is session
    assert scout_megatron.attach(chunks, opt) is session  # idempotent
    assert not chunks[0]._forward_hooks and not chunks[0]._forward_pre_hooks
    session.close()
    assert scout_megatron.session_of(chunks) is None
    with pytest.raises(UnsupportedSetupError, match="model chunks"):
        scout_megatron.attach([object()], opt)


def test_callbacks_from_is_empty_when_off(environ: dict[str, str], tmp_path: Path) -> None:
    import scout_megatron

    assert scout_megatron.callbacks_from() == []
    assert scout_megatron.callbacks_from(Config(enabled=False)) == []
    assert scout_megatron.callbacks_from(SimpleNamespace(env_vars={})) == []
    path = tmp_path / "scout.toml"
    path.write_text("enabled = false\n", encoding="utf-8")
    assert scout_megatron.callbacks_from(str(path)) == []


def test_callbacks_from_env_and_bridge_env_vars(environ: dict[str, str], tmp_path: Path) -> None:
    import scout_megatron

    environ["SCOUT_ENABLED"] = "1"
    (callback,) = scout_megatron.callbacks_from()
    assert isinstance(callback, scout_megatron.ScoutCallback) and callback.config.enabled
    del environ["SCOUT_ENABLED"]
    path = tmp_path / "scout.toml"
    path.write_text("replay_interval = 7\n", encoding="utf-8")
    bridge_cfg: Any = SimpleNamespace(env_vars={"SCOUT_CONFIG": str(path), "OTHER": "x"})
    (callback,) = scout_megatron.callbacks_from(bridge_cfg)
    assert callback.config.replay_interval == 7
    assert environ["SCOUT_CONFIG"] == str(path) and "OTHER" not in environ  # SCOUT_* only
    environ["SCOUT_REPLAY_INTERVAL"] = "3"  # the environment wins, as in Bridge (setdefault)
    bridge_cfg.env_vars["SCOUT_REPLAY_INTERVAL"] = "9"
    (callback,) = scout_megatron.callbacks_from(bridge_cfg)
    assert callback.config.replay_interval == 3
    environ["SCOUT_KAPPA"] = "-1"
    with pytest.raises(ConfigError, match="kappa"):
        scout_megatron.callbacks_from(bridge_cfg)
    with pytest.raises(UnsupportedSetupError, match="callbacks_from takes"):
        scout_megatron.callbacks_from(42)


def test_scout_callback_is_a_bridge_callback_on_its_events(environ: dict[str, str]) -> None:
    import scout_megatron
    from scout_megatron.bridge import bridge_callbacks

    api = bridge_callbacks()
    callback = scout_megatron.ScoutCallback(Config())
    assert isinstance(callback, api.Callback)
    manager = api.CallbackManager()
    manager.add([callback])
    active = {event for event in api.VALID_EVENTS if manager.has_callbacks(event)}
    train = {"on_train_start", "on_train_step_start", "on_train_step_end", "on_train_end"}
    # Bridge 0.5 on fires on_checkpoint_save (the callback records the save); 0.3.1 has none.
    saves = {"on_checkpoint_save"} & set(api.VALID_EVENTS)
    assert active == train | saves
    assert callable(callback.on_checkpoint_save)
