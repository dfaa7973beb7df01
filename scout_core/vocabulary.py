"""The words SCOUT's decisions are made of, named once.

Each is a ``str`` enum whose value is exactly what appears in evidence JSON, so
``Status("agree")`` round-trips a record field.
"""

from __future__ import annotations

from enum import Enum

__all__ = ["Failure", "Mode", "Scope", "Status"]


class Mode(str, Enum):
    """How C3 compares the peers' evidence."""

    EXACT = "exact"
    """Deterministic values (signatures, progress, fingerprints): strict majority wins."""
    STATISTICAL = "statistical"
    """Timings: robust outliers around the median (MAD, then IQR, then range)."""


class Status(str, Enum):
    """Outcome of one C3 surface, identical on every peer."""

    AGREE = "agree"
    ATTRIBUTED = "attributed"
    INCONCLUSIVE = "inconclusive"


class Scope(str, Enum):
    """How far a verdict can point: a rank, a peer group, a machine or the whole job."""

    RANK = "rank"
    GROUP = "group"
    MACHINE = "machine"
    JOB = "job"


class Failure(str, Enum):
    """The failure a verdict reports; ``None`` in a record means no failure."""

    SDC = "sdc"
    STRAGGLER = "straggler"
    COMM_STRAGGLER = "comm_straggler"
    HANG = "hang"
    PROTOCOL_MISMATCH = "protocol_mismatch"
    GROUP_STALL = "group_stall"
    INPUT_STALL = "input_stall"
    CHECKPOINT_STALL = "checkpoint_stall"
