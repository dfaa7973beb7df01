"""The summary of benchmarks/healthy_path.py's runs: overheads, estimates, breakdowns.

Contract: :func:`summarise` turns the ranks' per-step timings of one run (SCOUT on and
off, interleaved) into the figures healthy_path.py prints (the measured, paired-median
and critical-path overheads against the estimates, per recipe and per phase);
:func:`median_of` takes the field-wise median of several runs' summaries. Pure: no
process group, no model.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

__all__ = ["critical_s", "median_of", "per_recipe_overhead", "summarise"]


def summarise(results: list[dict[str, Any]], warm: int) -> dict[str, Any]:
    steps = len(results[0]["times"]["on"])
    idx = range(warm, steps)
    due_flags = [bool(kinds) for kinds in results[0]["kinds"]]

    def slowest(label: str, i: int) -> float:
        return max(r["times"][label][i] for r in results)

    def ratio(sel: list[int]) -> float:
        on = sum(slowest("on", i) for i in sel)
        off = sum(slowest("off", i) for i in sel)
        return on / off - 1.0 if off else 0.0

    due = [i for i in idx if due_flags[i]]
    idle = [i for i in idx if not due_flags[i]]
    overhead = ratio(list(idx))
    est = results[0]["estimate"]
    # Robust to the machine's jitter: per phase of the recipe cadence, the median of the
    # paired (same step) differences on - off, summed over one period, over the period's
    # median off time. A jitter spike in either model's step moves a mean by its whole
    # size and a median not at all; a cost SCOUT pays at that phase moves both.
    period = int(results[0].get("period", 20))
    phases: dict[int, list[int]] = {}
    for i in idx:
        phases.setdefault(i % period, []).append(i)
    extra = sum(
        statistics.median(slowest("on", i) - slowest("off", i) for i in sel)
        for sel in phases.values()
    )
    base = sum(statistics.median(slowest("off", i) for i in sel) for sel in phases.values())
    paired = extra / base if base else 0.0
    critical = [critical_s(results, i) for i in range(steps)]
    critical_sum = sum(statistics.median(critical[i] for i in sel) for sel in phases.values())
    direct = critical_sum / base if base else 0.0
    mine = results[0]["scout"]
    per_recipe = per_recipe_overhead(
        results, phases, slowest, base, est.get("per_recipe", {}), critical=critical
    )

    def med(key: str, sel: list[int], scale: float = 1e3) -> float:
        return scale * statistics.median(mine[i][key] for i in sel) if sel else 0.0

    breakdown = {
        "boundary_ms": med("boundary", due),
        "collectives_ms": med("coll", due),
        "collectives": med("coll_n", due, 1.0),
        # Mean, not median: the gate copies on one due step per interval, not on each.
        "gate_capture_ms": (
            1e3 * statistics.fmean(mine[i]["capture"] for i in due) if due else 0.0
        ),
        "gate_copies": float(sum(1 for i in due if mine[i]["capture"] > 0)),
        "gate_capture_per_copy_ms": (
            1e3 * statistics.median(copies)
            if (copies := [mine[i]["capture"] for i in due if mine[i]["capture"] > 0])
            else 0.0
        ),
        "replay_compute_ms": (
            1e3
            * statistics.median(
                mine[i]["boundary"] - mine[i]["coll"] - mine[i]["capture"] for i in due
            )
            if due
            else 0.0
        ),
    }
    return {
        "steps_measured": len(idx),
        "due_steps": len(due),
        "step_time_off_ms": 1e3 * statistics.median(slowest("off", i) for i in idx),
        "overhead": overhead,
        "estimate": est,
        "measured_over_estimate": overhead / est["with_extras"] if est["with_extras"] else None,
        "overhead_paired_median": paired,
        "paired_median_over_estimate": (
            paired / est["with_extras"] if est["with_extras"] else None
        ),
        "measured_over_paper_estimate": (
            overhead / est["paper_v_over_i_n"] if est["paper_v_over_i_n"] else None
        ),
        "critical_path_overhead": direct,
        "critical_path_over_estimate": direct / est["with_extras"] if est["with_extras"] else None,
        "idle_overhead": ratio(idle),
        "idle_scout_us": med("boundary", idle, 1e6),
        "idle_scout_share": (
            statistics.median(mine[i]["boundary"] for i in idle)
            / statistics.median(slowest("off", i) for i in idle)
            if idle
            else 0.0
        ),
        "due": {"overhead": ratio(due), **breakdown},
        "per_recipe": per_recipe,
        "gate_memory": results[0].get("memory", {}),
        "verdicts": results[0]["verdicts"],
    }


def critical_s(results: list[dict[str, Any]], i: int) -> float:
    """How long SCOUT's boundary held up step ``i`` of the job: the last rank to leave it
    minus the last rank to reach it (``perf_counter`` is one clock for every process of
    a host). A rank that reached the boundary early and waited in its collectives for a
    late peer would have waited as long for that peer in the next step's gradient
    all-reduce without SCOUT, so that wait is not SCOUT's; the late rank's time in the
    boundary is."""
    stamps = [r["scout"][i] for r in results]
    return float(max(0.0, max(s["leave_at"] for s in stamps) - max(s["enter_at"] for s in stamps)))


def per_recipe_overhead(
    results: list[dict[str, Any]],
    phases: dict[int, list[int]],
    slowest: Callable[[str, int], float],
    base: float,
    estimates: dict[str, float],
    *,
    critical: list[float],
) -> dict[str, dict[str, float | None]]:
    """The paired overhead of each due phase against its recipes' own estimate: where the
    gap between measured and estimate lies. Keyed by the recipes due there (one per
    phase with the spread cadence, ``hidden+embedding`` style without it). ``critical``
    is :func:`critical_s` of every step."""
    kinds = results[0]["kinds"]
    mine = results[0]["scout"]
    groups: dict[str, list[list[int]]] = {}
    for sel in phases.values():
        due = sorted({kind for i in sel for kind in kinds[i]})
        if due:
            groups.setdefault("+".join(due), []).append(sel)
    out: dict[str, dict[str, float | None]] = {}
    for label, sels in groups.items():
        extra = sum(
            statistics.median(slowest("on", i) - slowest("off", i) for i in sel) for sel in sels
        )
        estimate = sum(estimates.get(kind, 0.0) for kind in label.split("+"))
        steps = [i for sel in sels for i in sel]
        out[label] = {
            "overhead": extra / base if base else 0.0,
            "estimate": estimate,
            "over_estimate": extra / (estimate * base) if estimate and base else None,
            "paired_ms_per_round": 1e3 * extra / len(sels),
            "estimate_ms_per_round": 1e3 * estimate * base / len(sels),
            "boundary_ms": 1e3 * statistics.median(mine[i]["boundary"] for i in steps),
            "critical_ms": 1e3 * statistics.median(critical[i] for i in steps),
            "collectives_ms": 1e3 * statistics.median(mine[i]["coll"] for i in steps),
            "collectives": statistics.median(mine[i]["coll_n"] for i in steps),
            "gate_capture_ms": 1e3 * statistics.median(mine[i]["capture"] for i in steps),
        }
    return out


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Field-wise median of the runs' summaries (nested dicts too)."""
    out: dict[str, Any] = {}
    for key, first in runs[0].items():
        values = [r[key] for r in runs]
        if isinstance(first, dict):
            out[key] = median_of(values)
        elif isinstance(first, bool) or first is None:
            out[key] = first
        elif isinstance(first, int | float):
            out[key] = statistics.median(v for v in values if v is not None)
        else:
            out[key] = first
    return out
