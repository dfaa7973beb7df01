"""The public API is exactly what ``scout_core.__all__`` lists; renaming breaks users."""

from __future__ import annotations

import pytest

import scout_core

EXPECTED = {
    "enable",
    "Config",
    "C3Result",
    "Surface",
    "exchange",
    "Record",
    "Report",
    "EvidenceWriter",
    "load_report",
    "attach_gate",
    "restore_from_disk",
    "Axis",
    "MeshAddress",
    "MeshLayout",
    "Failure",
    "Mode",
    "Scope",
    "Status",
    "ScoutError",
    "ConfigError",
    "UnsupportedSetupError",
    "PluginNotReadyError",
    "EvidenceError",
    "ProtocolError",
    "CheckpointError",
}


def test_exported_names_are_pinned() -> None:
    assert set(scout_core.__all__) == EXPECTED
    for name in EXPECTED:
        assert getattr(scout_core, name) is not None, name


def test_the_gate_functions_are_the_checkpoint_modules_own() -> None:
    from scout_core import attach_gate, restore_from_disk
    from scout_core.checkpoint import attach, recovery

    assert attach_gate is attach.attach_gate
    assert restore_from_disk is recovery.restore_from_disk
    with pytest.raises(AttributeError, match="no attribute 'attach_gates'"):
        scout_core.attach_gates  # noqa: B018  # a misspelt name is an AttributeError


def test_submodules_are_not_shadowed() -> None:
    import importlib

    # Subpackages by role are modules: no re-export may shadow a submodule's name.
    for name in (
        "topology",
        "decision",
        "integration",
        "records",
        "report",
        "replay",
        "observer",
        "checkpoint",
        "config",
        "testing",
    ):
        module = importlib.import_module(f"scout_core.{name}")
        assert getattr(scout_core, name) is module, name


def test_enable_refuses_an_unknown_object_and_names_it() -> None:
    with pytest.raises(scout_core.UnsupportedSetupError, match=r"no plugin handles builtins\.dict"):
        scout_core.enable({})


def test_enable_plain_torch_needs_an_optimizer() -> None:
    import torch

    with pytest.raises(scout_core.UnsupportedSetupError, match=r"torch\.optim\.Optimizer"):
        scout_core.enable(torch.nn.Linear(2, 2), None)


def test_enable_accepts_a_mapping_and_names_bad_keys() -> None:
    from scout_core import _resolve_config

    assert _resolve_config({"replay_interval": 7}).replay_interval == 7
    with pytest.raises(scout_core.ConfigError, match=r"replay_intervall"):
        _resolve_config({"replay_intervall": 7})


def test_enable_says_what_config_it_takes() -> None:
    import torch

    with pytest.raises(scout_core.ConfigError, match=r"a mapping of its keys"):
        scout_core.enable(torch.nn.Linear(2, 2), torch.optim.SGD([torch.zeros(1)]), config=3)
