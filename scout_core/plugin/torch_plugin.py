"""The plain-PyTorch plugin: ``scout.enable(model, optimizer)`` on the core's own seam.

DDP, FSDP2, HSDP and DeviceMesh jobs need no framework plugin, but they go through the same
:class:`~scout_core.plugin.base.FrameworkPlugin` lifecycle as the framework plugins; the
facts are :class:`~scout_core.plugin.torch_adapter.TorchAdapter`'s. The explicit call is
the request for SCOUT, so it is enabled when nothing configures it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from scout_core.config import Config
from scout_core.errors import UnsupportedSetupError
from scout_core.integration.discovery import discover, unwrap
from scout_core.plugin.base import FrameworkPlugin
from scout_core.plugin.torch_adapter import TorchAdapter

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from scout_core.records.record import Record
    from scout_core.session import Session
    from scout_core.topology.mesh import MeshLayout

__all__ = ["TorchPlugin", "check_optimizers", "enable_torch", "plugin"]


def check_optimizers(optimizer: object) -> list[torch.optim.Optimizer]:
    """``optimizer`` as a list of optimizers; :class:`UnsupportedSetupError` otherwise."""
    given = list(optimizer) if isinstance(optimizer, Sequence) else [optimizer]
    found = [o for o in given if isinstance(o, torch.optim.Optimizer)]
    if not found or len(found) != len(given):
        raise UnsupportedSetupError(
            "scout.enable(model, optimizer): plain PyTorch needs the torch.optim.Optimizer "
            f"(or a list of them) that trains the model, got {type(optimizer).__name__}"
        )
    return found


class TorchPlugin(FrameworkPlugin):
    """``scout.enable(model, optimizer, mesh=None)`` for plain PyTorch models."""

    name: ClassVar[str] = "torch"
    distribution: ClassVar[str] = "scout"
    framework: ClassVar[str] = "torch"
    supported: ClassVar[str] = ">=2.11"
    prefixes: ClassVar[tuple[str, ...]] = ("torch.",)
    section_name: ClassVar[str] = "scout.enable config"
    enabled_by_default: ClassVar[bool] = True

    def handles(self, obj: object) -> bool:
        return isinstance(obj, nn.Module)

    def key(self, obj: Any) -> object:
        return unwrap(obj)

    def build_adapter(
        self,
        obj: Any,
        config: Config,
        *args: Any,
        mesh: DeviceMesh | MeshLayout | None = None,
        **kwargs: Any,
    ) -> TorchAdapter:
        if not isinstance(obj, nn.Module):
            raise UnsupportedSetupError(
                f"the plain-PyTorch path attaches to a torch.nn.Module, got {type(obj).__name__}"
            )
        if len(args) != 1 or kwargs:
            extra = sorted(kwargs)
            raise UnsupportedSetupError(
                "scout.enable(model, optimizer, mesh=None): plain PyTorch takes the model, its "
                f"optimizer(s) and an optional mesh; got {len(args)} positional argument(s)"
                + (f" and {', '.join(extra)}" if extra else "")
            )
        optimizers = check_optimizers(args[0])
        root = unwrap(obj)
        found = discover(
            root, layers=config.layers, embedding=config.embedding, lm_head=config.lm_head
        )
        return TorchAdapter(obj, optimizers, found, mesh=mesh)


plugin = TorchPlugin()
"""The core's plain-PyTorch plugin, tried after every installed framework plugin declined."""


def enable_torch(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer],
    config: Config | None = None,
    *,
    callback: Callable[[Record], None] | None = None,
    mesh: DeviceMesh | MeshLayout | None = None,
) -> Session:
    """``scout.enable(model, optimizer, config=config, mesh=mesh)`` for plain PyTorch, typed.

    Collective; a missing configured module path (``ConfigError``) or a setup it cannot watch
    (``UnsupportedSetupError``) raises before anything is attached."""
    check_optimizers(optimizer)
    return plugin.enable(model, optimizer, config=config, callback=callback, mesh=mesh)
