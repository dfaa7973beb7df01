"""``scout c3-round``: one C3 round across local ranks, printed as a verdict.

Every rank builds the same seeded tensor; one rank flips a low-mantissa bit. The ranks
exchange 64-bit signatures and a timing in ONE C3 AllGather on a diagnostic Gloo group,
each applies the decision rule locally, and rank 0 prints the common verdict: the
smallest end-to-end use of the core.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["main", "round_on_rank"]


def round_on_rank(odd_rank: int) -> dict[str, Any]:
    """Body run on every rank by :func:`main` (module-level so ranks can import it)."""
    import torch
    import torch.distributed as dist

    from scout_core.decision.c3 import Surface, exchange
    from scout_core.decision.signature import signature
    from scout_core.testing.injectors import flip_bit
    from scout_core.vocabulary import Mode

    rank, world = dist.get_rank(), dist.get_world_size()
    ranks = list(range(world))
    group = dist.new_group(ranks, backend="gloo")  # a diagnostic group, never WORLD
    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(256, 64, generator=gen)
    if rank == odd_rank:
        flip_bit(x, index=777, bit=0)  # one low-mantissa bit: a near-invisible SDC
    start = time.monotonic()
    y = torch.tanh(x @ x.T)
    elapsed = time.monotonic() - start
    results = exchange(
        [
            Surface("layer/demo/forward", Mode.EXACT, signature(y)),
            Surface("layer/demo/t_M", Mode.STATISTICAL, elapsed),
        ],
        group=group,
        ranks=ranks,
    )
    out = results["layer/demo/forward"]
    return {
        "status": out.status.value,
        "outliers": list(out.outliers),
        "bitmap": [int(b) for b in out.bitmap],
        "evidence": [
            f"{v & (2**64 - 1):016x}" if isinstance(v, int) else "missing" for v in out.evidence
        ],
        "timing_status": results["layer/demo/t_M"].status.value,
    }


def main(*, ranks: int = 4, odd_rank: int = 2) -> int:
    """Run one round on ``ranks`` local ranks; exit 0 when the verdict is the expected one."""
    from scout_core.testing.harness import run_ranks

    if ranks < 3:
        print("scout c3-round: rank attribution needs at least 3 ranks")
        return 2
    results = run_ranks(round_on_rank, ranks, args=(odd_rank,), timeout_s=120)
    first = results[0]
    print(f"C3 round across {ranks} ranks (Gloo, CPU), exact mode, surface layer/demo/forward")
    for r, sig in enumerate(first["evidence"]):
        flag = "  <- outlier" if first["bitmap"][r] else ""
        print(f"  rank {r}: signature {sig}{flag}")
    same = all(res == first for res in results)
    print(
        f"verdict: {first['status']}, outliers {first['outliers']}; identical on every rank: {same}"
    )
    expected = [odd_rank] if 0 <= odd_rank < ranks else []
    return 0 if same and first["outliers"] == expected else 1
