"""Megatron checkpoints through SCOUT's checkpoint gate: save, load, recover.

Contract: each function takes a ``MegatronCheckpointIO``, whose model chunks name the session,
and every rank calls it at the same point (collective). :func:`save_checkpoint` is refused
(False, nothing written) while an SDC awaits recovery; :func:`load_checkpoint` without a tag
loads the newest verified tag; :func:`recover` loads the tag the gate trusts after a failure;
:func:`record_save` records a save Bridge or Megatron-LM made itself. Without an enabled
session they act on the IO directly. Docs: docs/megatron.md, "Checkpoints through the gate".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from scout_core import CheckpointError, Failure
from scout_core.plugin_api import FrameworkGate, Recovered
from scout_core.plugin_api import gate_of as gate_on
from scout_core.plugin_api import recover as recover_through
from scout_megatron.checkpoint import MegatronCheckpointIO, tag_of

__all__ = [
    "RecordedSave",
    "gate_of",
    "load_checkpoint",
    "record_save",
    "recover",
    "save_checkpoint",
]


def gate_of(model: Any) -> FrameworkGate | None:
    """The checkpoint gate of the SCOUT session on these model chunks, or None."""
    return gate_on(model)


def save_checkpoint(io: MegatronCheckpointIO, iteration: int | None = None) -> bool:
    """Save Megatron iteration ``iteration`` (default: the gate's last completed step + 1)
    through the gate; True when written. Collective."""
    gate = gate_of(io.chunks)
    tag = None if iteration is None else tag_of(iteration)
    if gate is None:
        if tag is None:
            raise CheckpointError("save_checkpoint without a SCOUT session needs iteration=")
        return io.save(tag)
    return gate.save(io, tag)


def load_checkpoint(io: MegatronCheckpointIO, tag: str | None = None) -> int:
    """Load ``tag`` (default: the newest verified one); returns the iteration loaded.
    ``CheckpointError`` when there is nothing to load. Collective."""
    gate = gate_of(io.chunks)
    out = io.load(tag) if gate is None else gate.load(io, tag)
    return int(out)


def recover(io: MegatronCheckpointIO, failure: Failure | str | None) -> Recovered:
    """Load the tag the gate trusts after ``failure`` from ``io``'s directory; returns
    ``Recovered(tag, step, role, reason)`` and writes a retrieve record. Collective."""
    return recover_through(io.chunks, failure, io, what="model chunks")


class RecordedSave:
    """A checkpoint IO whose ``save`` records a checkpoint the framework already wrote (True
    when ``tag`` is complete in the directory); the rest is the wrapped IO's."""

    def __init__(self, io: MegatronCheckpointIO) -> None:
        self.io = io

    @property
    def directory(self) -> str:
        return self.io.directory

    def tag_for(self, step: int) -> str:
        return self.io.tag_for(step)

    def save(self, tag: str) -> bool:
        return tag in self.io.list_tags()

    def load(self, tag: str | None) -> Any:
        return self.io.load(tag)

    def restored_step(self) -> int:
        return self.io.restored_step()

    def list_tags(self) -> Sequence[str]:
        return self.io.list_tags()

    def writes_metadata(self) -> bool:
        return self.io.writes_metadata()


def record_save(io: MegatronCheckpointIO, iteration: int) -> bool:
    """Record in the gate's ledger the checkpoint of ``iteration`` the framework just wrote;
    False when refused (an SDC awaits recovery) or without a gate. Collective."""
    gate = gate_of(io.chunks)
    if gate is None:
        return False
    return gate.save(RecordedSave(io), tag_of(iteration))
