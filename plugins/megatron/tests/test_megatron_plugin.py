"""The megatron plugin is discoverable, declines foreign objects and refuses clearly."""

from __future__ import annotations

import pytest


def test_registered_under_entry_point_group() -> None:
    from scout_core.testing import installed_plugins

    names = set(installed_plugins())
    assert "megatron" in names


def test_declines_foreign_objects() -> None:
    import torch
    from scout_megatron import plugin

    assert not plugin.handles(torch.nn.Linear(2, 2))
    assert not plugin.handles(object())
    assert not plugin.handles([torch.nn.Linear(2, 2)])


def test_enable_refuses_with_clear_error() -> None:
    from scout_megatron import plugin

    from scout_core import PluginNotReadyError

    with pytest.raises(PluginNotReadyError, match="not built yet"):
        plugin.enable(object(), config=None, callback=None)
