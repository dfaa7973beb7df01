"""Throughput of ``scout_core.decision.signature.signature`` against ``torch.sum`` on one tensor.

Run: ``python benchmarks/signature_throughput.py [--mib 256] [--repeats 9] [--threads N]``

Issue 2 sets the goal: signing a tensor must run at no less than half the throughput
of ``torch.sum`` over the same fp32 tensor, since both are bounded by one pass over
memory. The two are timed alternately in one process, after a warm-up (which also
builds the signature's cached row multipliers), so drift of a shared machine hits
both alike. Prints one JSON object; ``ratio_vs_sum`` is signature throughput over sum
throughput (higher is better), from the median times, and ``ratio_vs_sum_best`` from
the best times.

On a CPU the fold issues two parallel kernels per 4 MiB chunk, where ``torch.sum``
issues one for the whole tensor; when other processes hold the cores, each of those
kernels waits for a descheduled worker thread and the ratio collapses. ``--threads``
sets torch's intra-op threads for both sides to show that case (``--threads 1``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable

GOAL_RATIO = 0.5


def _time_alternating(
    fns: dict[str, Callable[[], object]], repeats: int, warmup: int
) -> dict[str, list[float]]:
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


def _load_average() -> float | None:
    # Recorded so a reader can tell a quiet run from one on a busy shared machine.
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):
        return None


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256, help="tensor size in MiB (fp32)")
    parser.add_argument("--repeats", type=int, default=9, help="timed runs of each")
    parser.add_argument("--warmup", type=int, default=2, help="untimed runs of each first")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)"
    )
    args = parser.parse_args(argv)
    if args.mib < 1 or args.repeats < 1 or args.warmup < 0 or args.threads < 0:
        parser.error("--mib and --repeats must be >= 1, --warmup and --threads >= 0")

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)

    from scout_core.decision.signature import signature

    torch.manual_seed(args.seed)
    nbytes = args.mib * 1024 * 1024
    tensor = torch.randn(nbytes // 4, dtype=torch.float32)
    sig_holder: list[int] = []

    def run_sum() -> object:
        return tensor.sum()

    def run_signature() -> object:
        sig_holder.append(signature(tensor))
        return sig_holder[-1]

    times = _time_alternating(
        {"sum": run_sum, "signature": run_signature}, args.repeats, args.warmup
    )
    if len(set(sig_holder)) != 1:
        raise SystemExit(f"signature is not deterministic across runs: {set(sig_holder)}")
    med = {name: statistics.median(ts) for name, ts in times.items()}
    best = {name: min(ts) for name, ts in times.items()}
    ratio = med["sum"] / med["signature"]  # throughput ratio = inverse time ratio
    result: dict[str, object] = {
        "benchmark": "signature_throughput",
        "dtype": "float32",
        "mib": args.mib,
        "bytes": nbytes,
        "device": "cpu",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "repeats": args.repeats,
        "warmup": args.warmup,
        "sum_s_median": med["sum"],
        "sum_s_best": best["sum"],
        "signature_s_median": med["signature"],
        "signature_s_best": best["signature"],
        "sum_gb_s": nbytes / med["sum"] / 1e9,
        "signature_gb_s": nbytes / med["signature"] / 1e9,
        "ratio_vs_sum": ratio,
        "ratio_vs_sum_best": best["sum"] / best["signature"],
        "goal_ratio": GOAL_RATIO,
        "meets_goal": ratio >= GOAL_RATIO,
        "load_avg_1min": _load_average(),
        "signature": sig_holder[-1],
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
