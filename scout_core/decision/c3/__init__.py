"""C3, Consensus Collective Communication (paper §5): SCOUT's decision layer.

Peers of an equivalent group turn what they saw into fixed-size evidence; one AllGather gives all
the same table and each runs the same deterministic rule, so all return the same ``(status, bitmap,
evidence)`` and peer → global-rank map. :mod:`.rule` is the rule, :mod:`.collective` the wire.
"""

from __future__ import annotations

from scout_core.decision.c3.collective import (
    DEFAULT_KAPPA,
    ROW_WORDS,
    C3Result,
    Evidence,
    Surface,
    exchange,
)
from scout_core.decision.c3.rule import Decision, decide_exact, decide_statistical, robust_scale

__all__ = [
    "Decision",
    "decide_exact",
    "decide_statistical",
    "robust_scale",
    "DEFAULT_KAPPA",
    "ROW_WORDS",
    "C3Result",
    "Evidence",
    "Surface",
    "exchange",
]
