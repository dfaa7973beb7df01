"""The ``scout.plugins`` entry point ``torchtitan``: TorchTitan facts on the core's plugin base.

Contract: :class:`TitanPlugin` attaches to TorchTitan's ``Trainer``, where every fact lives
(``parallel_dims``, ``model_parts``, ``optimizers``, ``checkpointer``); the core owns the lifecycle.
Importing it imports no TorchTitan module. docs/torchtitan.md, "Switching it on".
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from scout_core import CheckpointError, Config, Failure, UnsupportedSetupError
from scout_core.plugin_api import FrameworkGate, FrameworkPlugin, Recovered, Session
from scout_core.plugin_api import recover as recover_through
from scout_torchtitan.versions import SUPPORTED_RANGE

__all__ = ["SECTION", "TitanPlugin", "plugin", "recover", "session_of"]

SECTION = "--override.imports scout_torchtitan.overrides.scout"
"""How configuration errors name where the SCOUT settings came from."""


class TitanPlugin(FrameworkPlugin):
    """TorchTitan 0.3 facts: the trainer's layout, modules, optimizers and checkpoints."""

    name: ClassVar[str] = "torchtitan"
    distribution: ClassVar[str] = "scout-torchtitan"
    framework: ClassVar[str] = "torchtitan"
    supported: ClassVar[str] = SUPPORTED_RANGE
    prefixes: ClassVar[tuple[str, ...]] = ("torchtitan.",)
    section_name: ClassVar[str] = SECTION
    gates_checkpoints: ClassVar[bool] = True

    def __init__(self) -> None:
        super().__init__()
        self._managers: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()

    def check_version(self, version: str | None = None) -> str:
        """The base's check (``torchtitan`` 0.3.x) in TorchTitan's wording, which tells 0.2 and
        older apart and accepts a 0.3-API source checkout reporting ``0.0.0`` (:mod:`.versions`)."""
        from scout_torchtitan.versions import check_version

        return check_version(version)

    def build_adapter(
        self, obj: Any, config: Config, *args: Any, manager: Any = None, **kwargs: Any
    ) -> Any:
        from scout_torchtitan.adapter import TitanAdapter, require_trainer

        require_trainer(obj)
        if args or kwargs:
            extra = [type(a).__name__ for a in args] + sorted(kwargs)
            raise UnsupportedSetupError(
                "scout.enable(trainer) takes only TorchTitan's Trainer (its model parts, "
                f"optimizers and meshes are read from it); unexpected: {', '.join(extra)}"
            )
        if manager is not None:
            self._managers[obj] = manager
        return TitanAdapter(obj, config)

    def config_section(self, obj: Any) -> Mapping[str, Any] | None:
        """A ``ScoutTrainer``'s ``scout`` section, or the settings on SCOUT's checkpoint config."""
        cfg = getattr(obj, "config", None)
        checkpoint = getattr(cfg, "checkpoint", None)
        for found in (getattr(cfg, "scout", None), getattr(checkpoint, "scout", None)):
            if isinstance(found, Config):
                return found.to_dict()
        return None

    def manager_of(self, trainer: Any) -> Any:
        """The checkpoint manager SCOUT was enabled with (or the trainer's), if any."""
        found = self._managers.get(trainer)
        return found if found is not None else getattr(trainer, "checkpointer", None)

    def wire_checkpoints(self, obj: Any, gate: FrameworkGate) -> Callable[[], None]:
        from scout_torchtitan.gating import wire

        manager = self.manager_of(obj)
        if manager is None:
            return lambda: None
        return wire(manager, gate)


plugin = TitanPlugin()


def session_of(trainer: Any) -> Session | None:
    """The SCOUT session attached to ``trainer`` (also a disabled one), or None."""
    return plugin.session_of(trainer)


def recover(trainer: Any, failure: Failure | str | None) -> Recovered:
    """Load the checkpoint SCOUT's gate trusts after ``failure`` (docs/checkpoint_gate.md,
    "Retrieval"). Collective. Restores the trainer's state (model, optimizer, schedulers, data
    loader, step) in place through TorchTitan's own load; writes a ``scout.checkpoint/1`` record."""
    from scout_torchtitan.checkpoint_io import TitanCheckpointIO
    from scout_torchtitan.gating import raw_load_of

    manager = getattr(trainer, "checkpointer", None) or plugin.manager_of(trainer)
    if manager is None or not getattr(manager, "enable", False):
        raise CheckpointError("scout_torchtitan.recover needs TorchTitan checkpointing enabled")
    io = TitanCheckpointIO(manager, load=raw_load_of(manager))
    return recover_through(trainer, failure, io, what="trainer")
