"""C3 exchange latency against the bare AllGather it is built on.

    python benchmarks/c3_latency.py [--world 4] [--surfaces 8] [--iters 200] [--warmup 30]

Spawns ``--world`` local Gloo ranks (the test harness: a process per rank, a
harness-hosted store). On one diagnostic group every rank times, interleaved,

* ``exchange`` of ``--surfaces`` exact 64-bit surfaces: encode, the one
  AllGather, decode and the strict-majority rule on every surface; and
* a raw ``all_gather_single`` of the same bytes (a preallocated
  :data:`~scout_core.decision.c3.ROW_WORDS`-word row, which is what ``exchange`` sends),
  and, for reference, of just the words the surfaces use (the unpadded row).

It also reports ``local_overhead_us``: what ``exchange`` costs beyond the
AllGather itself, measured on a one-rank group where communication is a copy.
On a busy machine with fewer cores than ranks the AllGather is dominated by
scheduling and the ratio says little; this number is the part ``exchange`` adds.

The order of the two alternates every iteration so neither always runs on a
freshly woken group. Each rank reports medians over ``--iters`` iterations after
``--warmup``; the script prints one JSON object with the medians of all ranks'
samples pooled and ``ratio_vs_raw`` = exchange / raw (goal: at most 1.1).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent


def rank_body(n_surfaces: int, iters: int, warmup: int) -> dict[str, Any]:
    """Runs on every rank: time exchange and raw AllGathers, interleaved."""
    import torch
    import torch.distributed as dist

    from scout_core.decision.c3 import ROW_WORDS, Surface, exchange
    from scout_core.vocabulary import Mode

    me, world = dist.get_rank(), dist.get_world_size()
    ranks = list(range(world))
    group = dist.new_group(ranks, backend="gloo")
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    # signature-like values: large unsigned words, identical on every rank
    surfaces = [
        Surface(f"layer/blocks.{i}/forward", Mode.EXACT, (0x9E3779B97F4A7C15 * (i + 1)) % 2**64)
        for i in range(n_surfaces)
    ]
    used = 1 + 2 * n_surfaces
    raw_in = torch.arange(ROW_WORDS, dtype=torch.int64)
    raw_out = torch.empty(world * ROW_WORDS, dtype=torch.int64)
    small_in = torch.arange(used, dtype=torch.int64)
    small_out = torch.empty(world * used, dtype=torch.int64)

    def timed(fn: Any) -> int:
        t0 = time.perf_counter_ns()
        fn()
        return time.perf_counter_ns() - t0

    def run_exchange() -> None:
        out = exchange(surfaces, group=group, ranks=ranks)
        assert all(r.status.value == "agree" for r in out.values())

    def run_raw() -> None:
        gather(raw_out, raw_in, group=group)

    def run_small() -> None:
        gather(small_out, small_in, group=group)

    samples: dict[str, list[int]] = {"exchange": [], "raw": [], "raw_unpadded": []}
    for i in range(warmup + iters):
        order = [
            ("exchange", run_exchange),
            ("raw", run_raw),
            ("raw_unpadded", run_small),
        ]
        if i % 2:
            order.reverse()
        for name, fn in order:
            ns = timed(fn)
            if i >= warmup:
                samples[name].append(ns)
    # Local cost alone: the same calls on a one-rank group, where the AllGather is
    # a memcpy. Rank 0 measures while the others wait, so the cores are quiet.
    singles = [dist.new_group([r], backend="gloo") for r in ranks]
    local: dict[str, list[int]] = {"exchange": [], "raw": []}
    if me == 0:
        one_in = raw_in.clone()
        one_out = torch.empty(ROW_WORDS, dtype=torch.int64)
        for i in range(warmup + 5 * iters):
            a = timed(lambda: exchange(surfaces, group=singles[0], ranks=[0]))
            b = timed(lambda: gather(one_out, one_in, group=singles[0]))
            if i >= warmup:
                local["exchange"].append(a)
                local["raw"].append(b)
    dist.barrier(group=group)
    return {"rank": me, "samples_ns": samples, "local_ns": local}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--surfaces", type=int, default=8)
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=30)
    args = parser.parse_args(argv)

    # Ranks import the body by module name, so this folder must be importable.
    if str(_HERE) not in sys.path:
        sys.path.insert(0, str(_HERE))
    from scout_core.decision.c3 import ROW_WORDS
    from scout_core.testing.harness import run_ranks

    per_rank = run_ranks(
        "c3_latency:rank_body",
        args.world,
        args=(args.surfaces, args.iters, args.warmup),
        timeout_s=300,
    )

    def med_us(values: list[int]) -> float:
        return round(statistics.median(values) / 1000.0, 1)

    pooled: dict[str, list[int]] = {"exchange": [], "raw": [], "raw_unpadded": []}
    for r in per_rank:
        for k, v in r["samples_ns"].items():
            pooled[k].extend(v)
    exchange_us, raw_us = med_us(pooled["exchange"]), med_us(pooled["raw"])
    report = {
        "benchmark": "c3_latency",
        "world_size": args.world,
        "surfaces": args.surfaces,
        "iters": args.iters,
        "warmup": args.warmup,
        "row_bytes": ROW_WORDS * 8,
        "exchange_median_us": exchange_us,
        "raw_median_us": raw_us,
        "raw_unpadded_median_us": med_us(pooled["raw_unpadded"]),
        "ratio_vs_raw": round(exchange_us / raw_us, 3),
        "ratio_per_rank": [
            round(
                statistics.median(r["samples_ns"]["exchange"])
                / statistics.median(r["samples_ns"]["raw"]),
                3,
            )
            for r in per_rank
        ],
        "goal_ratio": 1.1,
        # encode + decode + rule, without communication: exchange minus the
        # AllGather on a one-rank group (rank 0 alone)
        "local_overhead_us": round(
            med_us(per_rank[0]["local_ns"]["exchange"]) - med_us(per_rank[0]["local_ns"]["raw"]),
            1,
        ),
    }
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
