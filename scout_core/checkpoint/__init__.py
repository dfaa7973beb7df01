"""Gate checkpoints: in-memory generations, durable DCP persistence and recovery.

* :mod:`.state`: one rank's training state as a tree (capture, flatten, restore);
* :mod:`.memory`: host-memory generations (latest / candidate / verified), capture
  overlapped with training (a side stream on CUDA, a thread on CPU);
* :mod:`.replicas`: optional peer replication of a generation;
* :mod:`.durable`: DCP shards, JSON manifests, atomic commit, consistent loading;
* :mod:`.coordinator`: Algorithm 3 carried out once, over a ``GenerationStore``;
* :mod:`.host_store`: the store of host-memory generations, replicas, durable store;
* :mod:`.recovery`: applying a restored tree (agreed), a fresh process from disk;
* :mod:`.catalog`: what a replay boundary means for a gate (catalog slots, outcome);
* :mod:`.session_gate`: what a session's two gates share (boundaries, sweep);
* :mod:`.attach`: the in-memory gate of a live session (:class:`GateHandle`);
* :mod:`.io`: the ``CheckpointIO`` protocol for checkpoints a framework owns;
* :mod:`.certification`: the tag ledger and its JSON sidecar;
* :mod:`.framework_gate`: the store and gate of a framework's own checkpoints;
* :mod:`.dcp_store`: the core's own checkpoints as a ``CheckpointIO`` (DCP, JSON);
* :mod:`.records`: the one writer of ``scout.checkpoint/1`` records.

The decision logic itself lives in :mod:`scout_core.decision.gate`.
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
from scout_core.checkpoint.durable import DurableStore, Generation, scan
from scout_core.checkpoint.framework_gate import FrameworkGate
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
