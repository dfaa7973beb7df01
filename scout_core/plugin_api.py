"""The published plugin interface: everything a framework plugin may use from the core.

Contract: a framework plugin imports only the names in ``scout_core.__all__``, in this
module's ``__all__`` and, in its tests and examples, in ``scout_core.testing.__all__``
(``tests/unit/test_import_rules.py`` enforces it); anything else in the core may change
without notice. How the pieces fit: docs/plugins.md.
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
from scout_core.plugin.base import (
    FrameworkPlugin,
    agree_or_raise,
    gate_of,
    recover,
    shadow_methods,
    swapped_attributes,
)
from scout_core.plugin.torch_adapter import TorchAdapter, hook_free_twin, param_items
from scout_core.replay.boundary import Boundary
from scout_core.replay.taps import injected_delay
from scout_core.session import Session
from scout_core.topology.groups import (
    PeerGroup,
    create_peer_groups,
    diagnostic_group,
    diagnostic_groups,
    group_ranks,
)

__all__ = [
    # the plugin base
    "FrameworkPlugin",
    "PendingPlugin",
    "check_version",
    "gate_of",
    "recover",
    "agree_or_raise",
    "shadow_methods",
    "swapped_attributes",
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
    "group_ranks",
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
