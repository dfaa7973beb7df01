"""TorchTitan's own checkpoints, gated by the core: save, load and recover.

Contract: :func:`gated_save` / :func:`gated_load` route TorchTitan's ``_save`` / ``_load`` hooks
through the core's ``FrameworkGate``: TorchTitan's policy decides whether to save, the gate writes
synchronously or refuses while an SDC awaits recovery, and a load of ``-1`` picks the newest
verified tag; the step-0 seed and model-only export go uncertified. SCOUT's manager overrides the
hooks; :func:`wire` shadows them on a stock manager. Docs: docs/torchtitan.md, "Checkpoint gating".
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from scout_core.plugin_api import FrameworkGate, shadow_methods
from scout_torchtitan.checkpoint_io import TitanCheckpointIO

__all__ = ["GatedManager", "gated_load", "gated_save", "raw_load_of", "wire"]

log = logging.getLogger(__name__)

RawSave = Callable[[int, bool], bool]
RawLoad = Callable[[int], bool]


@runtime_checkable
class GatedManager(Protocol):
    """SCOUT's own checkpoint manager (:class:`~scout_torchtitan.manager.ScoutManagerMixin`):
    it asks :func:`gated_save` / :func:`gated_load` itself while ``scout_gate`` is set."""

    scout_gate: FrameworkGate | None


def gated_save(
    manager: Any, gate: FrameworkGate, curr_step: int, last_step: bool, raw: RawSave
) -> bool:
    """TorchTitan's ``_save`` through SCOUT's gate (module doc); ``raw`` is TorchTitan's own."""
    if not manager._should_save(curr_step, last_step):
        return False
    export = bool(last_step and getattr(manager, "last_save_model_only", False))
    if curr_step == 0 or export:
        if export and gate.pending is not None:
            log.warning(
                "not exporting the model at step %d: replay found %s at step %d and "
                "training has not been restored since",
                curr_step,
                gate.pending.failure,
                gate.pending.found_at,
            )
            return False
        return bool(raw(curr_step, last_step))
    io = TitanCheckpointIO(manager, load=raw_load_of(manager))
    return gate.save(io, f"step-{curr_step}")


def gated_load(manager: Any, gate: FrameworkGate, step: int, raw: RawLoad) -> bool:
    """TorchTitan's ``_load`` through SCOUT's gate (module doc); ``raw`` is TorchTitan's own."""
    io = TitanCheckpointIO(manager, load=raw)
    if step == 0 or (step == -1 and not io.list_tags()):
        return bool(raw(step))
    return bool(gate.load(io, None if step == -1 else f"step-{step}"))


def raw_load_of(manager: Any) -> RawLoad:
    raw: RawLoad | None = getattr(manager, "scout_raw_load", None)
    return raw if raw is not None else _class_method(manager, "_load")


def _class_method(manager: Any, name: str) -> Any:
    """The manager class's own method ``name``, bound (instance shadows bypassed)."""
    return getattr(type(manager), name).__get__(manager)


def wire(manager: Any, gate: FrameworkGate) -> Callable[[], None]:
    """Route ``manager``'s saves and loads through ``gate``; returns the undo. A disabled manager
    (no ``--checkpoint.enable``) never saves or loads: nothing to wire."""
    if not getattr(manager, "enable", False):
        log.info("TorchTitan checkpointing is off; the checkpoint gate has nothing to gate")
        return lambda: None
    TitanCheckpointIO(manager)  # refuses managers it cannot write through, by name
    if isinstance(manager, GatedManager):
        manager.scout_gate = gate

        def forget() -> None:
            if manager.scout_gate is gate:
                manager.scout_gate = None

        return forget
    save, load = _class_method(manager, "_save"), _class_method(manager, "_load")

    def _save(curr_step: int, last_step: bool = False) -> bool:
        return gated_save(manager, gate, curr_step, last_step, save)

    def _load(step: int = -1) -> bool:
        return gated_load(manager, gate, step, load)

    return shadow_methods(manager, _save=_save, _load=_load)
