"""The published plugin interface: everything a framework plugin may use from the core.

A framework plugin (``scout-deepspeed``, ``scout-megatron``, ``scout-torchtitan``)
imports only the names in ``scout_core.__all__``, in this module's ``__all__`` and,
in its tests and examples, in ``scout_core.testing.__all__``; a test walks every
file under ``plugins/`` and ``examples/`` and enforces it. Anything else in the core
may change without notice. ``docs/plugins.md`` explains how the pieces fit.

* The plugin base: :class:`FrameworkPlugin` (plus :class:`PendingPlugin` for a
  registered plugin whose adapter is not built yet); :func:`check_version`, the
  version-range check it runs; :func:`gate_of` and :func:`recover`, the gate of a
  framework's own checkpoints on an object and recovery through it.
* The adapter side: :class:`FrameworkAdapter`, :class:`AdapterBase`,
  :class:`ModuleRef`, :class:`Ownership`, :class:`RngStream`, the RNG helpers, layer
  discovery, and the plain-PyTorch adapter (:class:`TorchAdapter`, for DTensor-based
  frameworks to build on) with its hook-free replay helpers.
* SCOUT's own groups and what ranks agree on: :class:`PeerGroup`,
  :func:`create_peer_groups` (the groups replay makes for a layout),
  :func:`diagnostic_group`, :func:`diagnostic_groups`, :func:`all_ok`,
  :func:`any_flag`, :func:`min_max`, :func:`same_value`.
* Fault injection seen from a plugin's own timed diagnostic collective:
  :func:`injected_delay` (tests register delays through ``scout_core.testing``).
* Checkpoints the framework owns: :class:`CheckpointIO`, :class:`FrameworkGate`,
  :class:`Recovered`, and the core's own :class:`DcpCheckpointIO`.
* The session and its events: :class:`Session`, :class:`Boundary`.
"""

from __future__ import annotations

from scout_core.checkpoint.dcp_store import DcpCheckpointIO
from scout_core.checkpoint.framework_gate import FrameworkGate
from scout_core.checkpoint.io import CheckpointIO, Recovered
from scout_core.decision.agreement import all_ok, any_flag, min_max, same_value
from scout_core.integration.adapter import FrameworkAdapter, ModuleRef, Ownership, RngStream
from scout_core.integration.adapter_base import (
    AdapterBase,
    cpu_rng,
    default_rng_streams,
    device_rng,
)
from scout_core.integration.discovery import Discovered, find_embedding, find_lm_head, unwrap
from scout_core.integration.discovery import discover as discover_modules
from scout_core.integration.pending import PendingPlugin
from scout_core.integration.versions import check_version
from scout_core.plugin.base import FrameworkPlugin, gate_of, recover
from scout_core.plugin.torch_adapter import TorchAdapter, hook_free_twin, param_items
from scout_core.replay.boundary import Boundary
from scout_core.replay.taps import injected_delay
from scout_core.session import Session
from scout_core.topology.groups import (
    PeerGroup,
    create_peer_groups,
    diagnostic_group,
    diagnostic_groups,
)

__all__ = [
    # the plugin base
    "FrameworkPlugin",
    "PendingPlugin",
    "check_version",
    "gate_of",
    "recover",
    # the adapter side
    "FrameworkAdapter",
    "AdapterBase",
    "ModuleRef",
    "Ownership",
    "RngStream",
    "cpu_rng",
    "device_rng",
    "default_rng_streams",
    "Discovered",
    "discover_modules",
    "unwrap",
    "find_embedding",
    "find_lm_head",
    "hook_free_twin",
    "param_items",
    "TorchAdapter",
    # SCOUT's groups and agreement
    "PeerGroup",
    "create_peer_groups",
    "diagnostic_group",
    "diagnostic_groups",
    "all_ok",
    "any_flag",
    "min_max",
    "same_value",
    # fault injection, seen from a plugin
    "injected_delay",
    # checkpoints the framework owns
    "CheckpointIO",
    "FrameworkGate",
    "Recovered",
    "DcpCheckpointIO",
    # session and events
    "Session",
    "Boundary",
]
