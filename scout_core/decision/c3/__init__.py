"""C3, Consensus Collective Communication (paper §5): SCOUT's decision layer.

Peers of an equivalent group each turn their diagnostic object into fixed-size
evidence, one AllGather gives every peer the same evidence table, and every peer
applies the same deterministic rule locally, so all of them return the same
``(status, bitmap, evidence)`` together with the ordered peer → global-rank map.

* :mod:`scout_core.decision.c3.rule`: the pure decision rule (exact strict majority,
  statistical robust outliers), testable without a process group.
* :mod:`scout_core.decision.c3.collective`: the wire format and the one-AllGather
  :func:`exchange` that carries several surfaces at once.
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
