"""Plugin discovery: entry points load, broken plugins are logged and skipped."""

from __future__ import annotations

import logging
from importlib import metadata
from typing import Any

import pytest
import torch

from scout_core.errors import PluginNotReadyError, UnsupportedSetupError
from scout_core.integration import registry as plugins
from scout_core.integration.pending import PendingPlugin, object_from


class _GoodPlugin:
    name = "good"

    def handles(self, obj: object) -> bool:
        return isinstance(obj, str) and obj == "good-engine"

    def enable(self, obj: object, *args: Any, **kwargs: Any) -> str:
        return f"enabled {obj}"


GOOD = _GoodPlugin()
NOT_A_PLUGIN = 42


def _fake_entry_points(values: dict[str, str]) -> Any:
    eps = [
        metadata.EntryPoint(name=n, value=v, group=plugins.ENTRY_POINT_GROUP)
        for n, v in values.items()
    ]

    def entry_points(*, group: str) -> list[metadata.EntryPoint]:
        assert group == plugins.ENTRY_POINT_GROUP
        return eps

    return entry_points


def test_broken_plugins_are_logged_and_skipped(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(
        plugins.metadata,
        "entry_points",
        _fake_entry_points(
            {
                "aa_missing_module": "no_such_module_xyz:plugin",
                "bb_not_protocol": f"{__name__}:NOT_A_PLUGIN",
                "cc_good": f"{__name__}:GOOD",
            }
        ),
    )
    with caplog.at_level(logging.WARNING, logger="scout_core.integration"):
        found = plugins.discover(refresh=True)
    try:
        assert [p.name for p in found] == ["cc_good"]
        assert "aa_missing_module" in caplog.text and "bb_not_protocol" in caplog.text
        selected = plugins.select_plugin("good-engine")
        assert selected is not None and selected.plugin is GOOD
        assert plugins.select_plugin("other") is None
    finally:
        plugins.discover(refresh=True)  # restore the real registry for other tests


def test_installed_plugins_claim_only_their_framework() -> None:
    found = {p.name: p.plugin for p in plugins.discover(refresh=True)}
    assert {"deepspeed", "megatron", "torchtitan"} <= set(found)
    model = torch.nn.Linear(2, 2)
    assert plugins.select_plugin(model) is None


def test_object_from_checks_the_class_module_without_importing() -> None:
    assert object_from(torch.nn.Linear(2, 2), ("torch.",))
    assert object_from([torch.nn.Linear(2, 2)], ("torch.nn",))
    assert not object_from(torch.nn.Linear(2, 2), ("deepspeed.",))
    assert not object_from([], ("torch.",))


def test_pending_plugin_refuses_by_name() -> None:
    pending = PendingPlugin("torch", ("torch.",), "scout-example")
    assert pending.handles(torch.nn.Linear(2, 2))
    with pytest.raises(PluginNotReadyError, match="scout-example is installed but"):
        pending.enable(torch.nn.Linear(2, 2))
    assert issubclass(PluginNotReadyError, UnsupportedSetupError)
