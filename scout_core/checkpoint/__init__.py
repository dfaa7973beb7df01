"""Gate checkpoints: in-memory generations, durable DCP persistence and recovery.

What each module does: the table at the top of docs/checkpoint_gate.md. The decision
logic itself lives in :mod:`scout_core.decision.gate`.
"""

from __future__ import annotations

from scout_core.checkpoint.attach import GateHandle, attach_gate
from scout_core.checkpoint.coordinator import (
    BoundaryResult,
    CheckpointCoordinator,
    CheckpointGate,
    GateCoordinator,
    GenerationStore,
)
from scout_core.checkpoint.dcp_store import DcpCheckpointIO
from scout_core.checkpoint.durable import DurableStore
from scout_core.checkpoint.framework_gate import FrameworkGate
from scout_core.checkpoint.generations import Generation, scan
from scout_core.checkpoint.io import CheckpointIO, Recovered
from scout_core.checkpoint.memory import InMemoryCheckpoints, Snapshot
from scout_core.checkpoint.recovery import Restored, default_rng_streams, restore_from_disk
from scout_core.checkpoint.replicas import PeerReplica, fetch_from_peer, replicate_to_peer

__all__ = [
    "GateHandle",
    "attach_gate",
    "BoundaryResult",
    "CheckpointCoordinator",
    "CheckpointGate",
    "GateCoordinator",
    "GenerationStore",
    "CheckpointIO",
    "DcpCheckpointIO",
    "FrameworkGate",
    "Recovered",
    "DurableStore",
    "Generation",
    "scan",
    "InMemoryCheckpoints",
    "PeerReplica",
    "Snapshot",
    "fetch_from_peer",
    "replicate_to_peer",
    "Restored",
    "default_rng_streams",
    "restore_from_disk",
]
