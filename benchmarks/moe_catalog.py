"""Shape-catalog compression on the paper's Table 4 workloads, with the analytic tile model.

    python benchmarks/moe_catalog.py [--num-sms 108] [--json-only]

For each workload of Table 4 (single-expert projections 128x128, 6144x10752,
5120x1536 and 2048x1024; uniform 128x128 expert GEMMs with 2, 4, 8 and 16 experts
per kernel) it builds a catalog over the same number of admitted row counts as
the paper (1..N rows per expert), with the tile model on an A100-sized device
(108 SMs), under two tile policies:

* ``buckets``: :data:`scout_core.moe.DEFAULT_RULES`, an illustrative per-row-bucket
  config table (the policy the acceptance bar applies to);
* ``fixed``: one 128x128x64 tile for every shape.

It prints one JSON object (per workload: admitted, representatives and reduction
under each policy, the paper's figures, discovery seconds) and, unless
``--json-only``, a table beside the paper's. It exits 1 unless every workload keeps
at least 97% fewer representatives than admitted shapes under ``buckets``.

The paper profiled a real BF16 Triton grouped GEMM on A100s; this is a model, so
the counts are not expected to match: see docs/moe.md for the comparison.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scout_core.moe import DEFAULT_RULES, ExpertClass, TileConfig, TileModel, discover

# (name, k, n, experts per kernel, admitted, paper's representatives)
WORKLOADS: tuple[tuple[str, int, int, int, int, int], ...] = (
    ("128x128 single expert", 128, 128, 1, 3457, 16),
    ("6144x10752 single expert", 6144, 10752, 1, 2048, 10),
    ("5120x1536 single expert", 5120, 1536, 1, 1024, 18),
    ("2048x1024 single expert", 2048, 1024, 1, 2048, 19),
    ("128x128, 2 experts/kernel", 128, 128, 2, 2048, 18),
    ("128x128, 4 experts/kernel", 128, 128, 4, 2048, 27),
    ("128x128, 8 experts/kernel", 128, 128, 8, 2048, 42),
    ("128x128, 16 experts/kernel", 128, 128, 16, 2048, 48),
)
GOAL = 0.97
DEVICE = "NVIDIA A100-SXM4-80GB (tile model)"


def run(num_sms: int) -> list[dict[str, Any]]:
    policies = {
        "buckets": TileModel(DEFAULT_RULES, num_sms=num_sms),
        "fixed": TileModel(TileConfig(block_m=128, block_n=128, block_k=64), num_sms=num_sms),
    }
    rows = []
    for name, k, n, experts, admitted, paper in WORKLOADS:
        cls = ExpertClass.uniform(
            name=name, k=k, n=n, tokens=range(1, admitted + 1), experts_per_kernel=experts
        )
        row: dict[str, Any] = {
            "workload": name,
            "admitted": admitted,
            "paper_representatives": paper,
            "paper_reduction": round(1 - paper / admitted, 4),
        }
        for policy, profiler in policies.items():
            start = time.monotonic()
            catalog = discover(cls, profiler, device=DEVICE)
            row[policy] = {
                "representatives": catalog.size,
                "reduction": round(catalog.reduction, 4),
                "fingerprints": catalog.summary()["fingerprints"],
                "uncertain": catalog.uncertain,
                "seconds": round(time.monotonic() - start, 2),
            }
        rows.append(row)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        f"{'workload':<28} {'admitted':>8} | {'paper':>5} {'red.':>7} | "
        f"{'buckets':>7} {'red.':>7} | {'fixed':>5} {'red.':>7}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        b, f = r["buckets"], r["fixed"]
        lines.append(
            f"{r['workload']:<28} {r['admitted']:>8} | {r['paper_representatives']:>5} "
            f"{r['paper_reduction']:>7.2%} | {b['representatives']:>7} {b['reduction']:>7.2%} | "
            f"{f['representatives']:>5} {f['reduction']:>7.2%}"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-sms", type=int, default=108, help="SMs of the modelled GPU")
    parser.add_argument("--json-only", action="store_true")
    args = parser.parse_args()
    rows = run(args.num_sms)
    ok = all(r["buckets"]["reduction"] >= GOAL for r in rows)
    print(json.dumps({"num_sms": args.num_sms, "goal": GOAL, "ok": ok, "workloads": rows}))
    if not args.json_only:
        print()
        print(table(rows))
        print(
            f"\nat least {GOAL:.0%} fewer representatives under 'buckets': {'yes' if ok else 'NO'}"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
