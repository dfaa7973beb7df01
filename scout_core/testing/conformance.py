"""The one conformance test every framework plugin runs against its plugin and adapter.

A plugin's own test suite builds a real (tiny) job of its framework and calls::

    from scout_core.testing import check_adapter, check_plugin
    check_plugin(plugin, engine)             # the plugin contract (and its entry point)
    check_adapter(adapter)                   # the adapter protocol, inside a process group

(:func:`scout_core.testing.check_checkpoint_io` is the same for a ``CheckpointIO``.)

Each check raises ``AssertionError`` with a message naming the broken part of the
contract, so a plugin test needs no assertions of its own for the protocol.
"""

from __future__ import annotations

import contextlib
from typing import Any

from scout_core.integration.adapter import ROLES, FrameworkAdapter, ModuleRef, Ownership, role_of
from scout_core.integration.registry import ScoutPlugin, discover
from scout_core.integration.versions import VersionRange
from scout_core.plugin.base import FrameworkPlugin

__all__ = ["check_adapter", "check_plugin", "installed_plugins"]


def installed_plugins() -> dict[str, object]:
    """Entry-point name → plugin object, for every plugin ``scout.plugins`` loads now."""
    return {p.name: p.plugin for p in discover(refresh=True)}


def check_plugin(plugin: object, obj: object, *, registered: bool = True) -> None:
    """``plugin`` follows the plugin contract, claims ``obj`` and declines foreign objects.

    A :class:`FrameworkPlugin` must also declare its facts (distribution, framework,
    a parsable ``supported`` range the installed framework satisfies, prefixes, the
    section name); with ``registered`` it must be what its ``scout.plugins`` entry
    point loads.
    """
    assert isinstance(plugin, ScoutPlugin), f"{plugin!r} lacks name/handles/enable"
    assert isinstance(plugin.name, str) and plugin.name, "plugin.name must be a non-empty str"
    assert plugin.handles(obj), f"plugin {plugin.name!r} does not claim {type(obj).__name__}"
    for foreign in (object(), 3, "engine", None):
        assert not plugin.handles(foreign), f"plugin {plugin.name!r} claims {foreign!r}"
    if isinstance(plugin, FrameworkPlugin):
        for attr in ("distribution", "framework", "supported", "section_name"):
            value = getattr(type(plugin), attr, None)
            assert isinstance(value, str) and value, f"{plugin.name}: {attr} must be a str"
        assert plugin.prefixes and all(p.endswith(".") for p in plugin.prefixes), (
            f"{plugin.name}: prefixes must be module prefixes ending in '.', got {plugin.prefixes}"
        )
        VersionRange.parse(plugin.supported)
        plugin.check_version()
    if registered:
        found = installed_plugins().get(plugin.name)
        assert found is plugin, (
            f"the scout.plugins entry point {plugin.name!r} loads {found!r}, not {plugin!r}"
        )


def _check_modules(adapter: FrameworkAdapter) -> None:
    layers = list(adapter.repeated_layers())
    assert layers, "repeated_layers() is empty: replay needs at least one repeated block"
    paths = [ref.path for ref in layers]
    assert len(set(paths)) == len(paths), f"repeated layer paths repeat: {paths}"
    kinds = {type(ref.module) for ref in layers}
    assert len(kinds) == 1, f"repeated layers mix classes: {sorted(k.__name__ for k in kinds)}"
    for role, ref in adapter.special_modules().items():
        assert isinstance(ref, ModuleRef), f"special module {role!r} is not a ModuleRef"
        assert role_of(role) in ROLES, f"unknown role {role!r}"


def _check_rng(adapter: FrameworkAdapter) -> None:
    import torch

    streams = list(adapter.rng_streams())
    names = [s.name for s in streams]
    assert "cpu" in names, f"rng_streams() must include the CPU stream, got {names}"
    for stream in streams:
        before = stream.get()
        assert isinstance(before, torch.Tensor), f"rng stream {stream.name!r} get() not a tensor"
        assert before.dtype == torch.uint8 and before.device.type == "cpu", (
            f"rng stream {stream.name!r} state must be a CPU uint8 tensor"
        )
        stream.set(before.clone())
        assert torch.equal(stream.get(), before), f"rng stream {stream.name!r} set/get differ"


def check_adapter(adapter: Any) -> None:
    """Check every part of the adapter protocol; call inside an initialised process group."""
    import torch
    import torch.distributed as dist

    assert isinstance(adapter, FrameworkAdapter), f"{adapter!r} does not follow FrameworkAdapter"
    layout = adapter.layout()
    rank = adapter.rank()
    if dist.is_initialized():
        assert layout.world_size == dist.get_world_size(), (
            f"layout covers {layout.world_size} ranks, the job has {dist.get_world_size()}"
        )
        assert rank == dist.get_rank(), f"rank() = {rank}, torch.distributed says {dist.get_rank()}"
    assert adapter.address() == layout.address(rank), "address() disagrees with layout.address()"
    for name, group in adapter.training_groups().items():
        assert group is not None, f"training group {name!r} is None"
    _check_modules(adapter)
    optimizers = list(adapter.optimizers())
    for opt in optimizers:
        assert isinstance(opt, torch.optim.Optimizer), f"{type(opt).__name__} is not an Optimizer"
    assert isinstance(adapter.optimizer_ownership(), Ownership), "ownership must be an Ownership"
    _check_rng(adapter)
    steps = list(adapter.steps_per_iteration())
    assert len(steps) == len(optimizers), (
        f"steps_per_iteration() gives {len(steps)} counts for {len(optimizers)} optimizers"
    )
    assert all(isinstance(n, int) and n >= 1 for n in steps), (
        f"steps_per_iteration() must be ints >= 1, got {steps}"
    )
    assert not hasattr(adapter, "step"), "adapters do not count steps: the driver owns the clock"
    ref = adapter.repeated_layers()[0]
    cm = adapter.materialize(ref)
    assert isinstance(cm, contextlib.AbstractContextManager), "materialize() must return a context"
    with cm:
        for p in ref.module.parameters():
            assert not p.is_meta, f"{ref.path}: parameter still on meta inside materialize()"
