"""``CheckpointIO``: how one framework writes and reads its own checkpoints, by tag.

Contract: the protocol names the framework facts the core needs about one checkpoint
directory; :class:`~scout_core.checkpoint.framework_gate.FrameworkGate` does the rest. Every
method that reads or writes is collective: every rank calls it at the same point with the
same tag. :func:`scout_core.testing.check_checkpoint_io` checks implementations (docs/plugins.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

__all__ = ["CheckpointIO", "Recovered"]


@runtime_checkable
class CheckpointIO(Protocol):
    """One framework's checkpoints in one directory."""

    @property
    def directory(self) -> str:
        """Where its tags live; SCOUT's certification sidecar goes there too."""
        ...

    def tag_for(self, step: int) -> str:
        """The tag the framework gives the checkpoint taken at SCOUT step ``step`` (the
        0-based iteration whose optimizer update just completed); distinct per step."""
        ...

    def save(self, tag: str) -> bool:
        """Write the framework checkpoint ``tag``; True if it was written. A failed save
        leaves every earlier tag loadable. Collective."""
        ...

    def load(self, tag: str | None) -> Any:
        """Restore training state from ``tag`` (None: the framework's default, such as its
        "latest"); return the framework's load result. Raises
        :class:`~scout_core.errors.CheckpointError` for a missing tag. Collective."""
        ...

    def restored_step(self) -> int:
        """After :meth:`load`: the SCOUT step the restored state belongs to (the
        framework's own step counter, as a 0-based iteration; -1 before any step)."""
        ...

    def list_tags(self) -> Sequence[str]:
        """The complete checkpoints present, oldest first."""
        ...

    def writes_metadata(self) -> bool:
        """Whether this rank writes SCOUT's sidecar (it writes the framework's "latest")."""
        ...


class Recovered(NamedTuple):
    """What :meth:`FrameworkGate.recover` (and ``load``) restored."""

    tag: str
    step: int
    role: str
    """What the retrieval selected: ``verified`` or ``latest``."""
    reason: str
