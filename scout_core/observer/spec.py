"""What a trainer tells its observer: one JSON object, read from an inherited descriptor.

The observer is a fresh interpreter, so everything it needs travels as one JSON object
(:class:`ObserverSpec`) in an inherited descriptor; the other inherited descriptors are
named there by number.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from scout_core.topology.mesh import MeshLayout

__all__ = ["ObserverSpec", "layout_from_json", "layout_to_json"]


def layout_to_json(layout: MeshLayout | None) -> dict[str, Any] | None:
    if layout is None:
        return None
    return {
        "sizes": list(layout.sizes),
        "order": [a.value for a in layout.order],
        "grid": None if layout.grid is None else list(layout.grid),
    }


def layout_from_json(data: dict[str, Any] | None) -> MeshLayout | None:
    if data is None:
        return None
    grid = data["grid"]
    return MeshLayout(
        sizes=tuple(data["sizes"]),
        order=tuple(data["order"]),
        grid=None if grid is None else tuple(grid),
    )


@dataclass(frozen=True)
class ObserverSpec:
    """Everything an observer is told by its trainer."""

    rank: int
    peers: tuple[int, ...]
    """The ranks this rank is compared with, itself included, ascending."""
    groups: int
    """How many such comparison groups the job has (each posts once per round)."""
    world_size: int
    layout: dict[str, Any] | None
    """The job's mesh layout (:func:`layout_to_json`), or None: compare ``peers`` only."""
    store_addr: str
    store_port: int
    trainer_pid: int
    fds: tuple[int, int, int, int]  # memory, event read, event write, control write
    hang_timeout_s: float
    stage_timeout_s: float
    join_timeout_s: float
    on_hang: str
    hang_exit_code: int
    report_dir: str
    run_id: str
    incarnation: int = 0
    """0 for the first observer of this rank; +1 for each restart by its trainer."""

    @property
    def observed(self) -> int:
        """How many ranks are observed in the job."""
        return self.world_size if self.layout is not None else len(self.peers)

    def to_json(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def from_json(cls, text: str) -> ObserverSpec:
        data = json.loads(text)
        data["peers"] = tuple(data["peers"])
        data["fds"] = tuple(data["fds"])
        return cls(**data)
