"""C3, Consensus Collective Communication (paper §5): SCOUT's decision layer.

Peers of an equivalent group turn their diagnostic object into fixed-size evidence; one
AllGather gives every peer the same table, and the same deterministic rule runs on each, so
all return the same ``(status, bitmap, evidence)`` and the ordered peer → global-rank map.
:mod:`.rule` is the pure rule; :mod:`.collective` the wire format and :func:`exchange`.
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
    # the rule
    "Decision",
    "decide_exact",
    "decide_statistical",
    "robust_scale",
    # the collective
    "DEFAULT_KAPPA",
    "ROW_WORDS",
    "C3Result",
    "Evidence",
    "Surface",
    "exchange",
]
