"""Median of separate ``healthy_path.py`` runs, per checkout and model size, as JSON and a table.

    python benchmarks/healthy_compare.py DIR

``DIR`` holds one ``healthy_path.py --repeats 1`` output per file, named
``<tree>-<layers>-<n>.json`` (``tree`` is a label such as ``after`` or ``before``;
``scripts/quiet_bench.sh`` writes them). A file that is missing, empty or cut short
(a run stopped by ``timeout``) is skipped and counted, so whatever finished is
reported. Prints one JSON object: per tree and model size, the number of runs and
the field-wise median (``healthy_path.median_of``); then the markdown table
``docs/replay.md`` shows (measured / estimate, idle-step overhead, due-step
breakdown, gate memory), one row per tree and size; then the per-recipe table (each
recipe's paired overhead against its own estimate), one row per tree, size and recipe.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from healthy_summary import median_of  # a sibling script, not a package

_NAME = re.compile(r"^(?P<tree>[A-Za-z0-9_]+)-(?P<layers>\d+)-(?P<n>\d+)\.json$")


def collect(folder: Path) -> tuple[dict[str, dict[str, list[dict[str, Any]]]], list[str]]:
    """Every finished run's summary by tree and model size; the files skipped."""
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    skipped: list[str] = []
    for path in sorted(folder.glob("*.json")):
        match = _NAME.match(path.name)
        if match is None:
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            summaries = data["models"][match["layers"]]["runs"]
        except (OSError, ValueError, KeyError, TypeError):
            skipped.append(path.name)
            continue
        runs.setdefault(match["tree"], {}).setdefault(match["layers"], []).extend(summaries)
    return runs, skipped


def _pct(x: Any) -> str:
    return "n/a" if x is None else f"{100 * float(x):+.2f}%"


def _x(x: Any) -> str:
    return "n/a" if x is None else f"{float(x):.2f}x"


def _num(x: Any, digits: int) -> str:
    return "n/a" if x is None else f"{float(x):.{digits}f}"


def table(medians: dict[str, dict[str, dict[str, Any]]]) -> str:
    """The markdown table of the medians (one row per tree and model size)."""
    rows = [
        "| checkout | layers | runs | overhead | estimate (with extras) | measured / estimate"
        " | paired median: overhead, / estimate"
        " | boundary's critical path: overhead, / estimate"
        " | idle steps | idle SCOUT us | due steps | due: compute ms | collectives (ms)"
        " | gate capture ms per due step (per copy) | gate held / state |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for tree, sizes in medians.items():
        for layers in sorted(sizes, key=int):
            m = sizes[layers]["median"]
            due, est, mem = m["due"], m["estimate"], m.get("gate_memory") or {}
            held = mem.get("peak_over_state", mem.get("held_over_state"))
            rows.append(
                f"| {tree} | {layers} | {sizes[layers]['runs']} | {_pct(m['overhead'])}"
                f" | {_pct(est['with_extras'])} | {_x(m['measured_over_estimate'])}"
                f" | {_pct(m.get('overhead_paired_median'))},"
                f" {_x(m.get('paired_median_over_estimate'))}"
                f" | {_pct(m.get('critical_path_overhead'))},"
                f" {_x(m.get('critical_path_over_estimate'))}"
                f" | {_pct(m['idle_overhead'])} | {m['idle_scout_us']:.0f}"
                f" | {_pct(due['overhead'])} | {due['replay_compute_ms']:.1f}"
                f" | {due['collectives']:.0f} ({due['collectives_ms']:.1f})"
                f" | {due['gate_capture_ms']:.2f} ({due.get('gate_capture_per_copy_ms', 0.0):.2f})"
                f" | {_x(held) if held else 'n/a'} |"
            )
    return "\n".join(rows)


def recipe_table(medians: dict[str, dict[str, dict[str, Any]]]) -> str:
    """The markdown table of each recipe's paired overhead against its own estimate (one
    row per tree, model size and recipe; runs without ``per_recipe`` have no rows)."""
    rows = [
        "| checkout | layers | recipe | paired overhead | estimate | / estimate"
        " | ms per round: measured, estimate | boundary ms | critical path ms"
        " | collectives (ms) | gate capture ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for tree, sizes in medians.items():
        for layers in sorted(sizes, key=int):
            for recipe, r in (sizes[layers]["median"].get("per_recipe") or {}).items():
                rows.append(
                    f"| {tree} | {layers} | {recipe} | {_pct(r['overhead'])}"
                    f" | {_pct(r['estimate'])} | {_x(r['over_estimate'])}"
                    f" | {r['paired_ms_per_round']:.1f}, {r['estimate_ms_per_round']:.1f}"
                    f" | {r['boundary_ms']:.1f} | {_num(r.get('critical_ms'), 1)}"
                    f" | {_num(r.get('collectives'), 0)} ({r['collectives_ms']:.1f})"
                    f" | {_num(r.get('gate_capture_ms'), 1)} |"
                )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(__doc__.splitlines()[2].strip(), file=sys.stderr)
        return 2
    runs, skipped = collect(Path(args[0]))
    medians = {
        tree: {
            layers: {"runs": len(summaries), "median": median_of(summaries)}
            for layers, summaries in sizes.items()
        }
        for tree, sizes in runs.items()
    }
    print(json.dumps({"trees": medians, "skipped": skipped}, indent=2))
    print(table(medians))
    print()
    print(recipe_table(medians))
    return 0


if __name__ == "__main__":
    sys.exit(main())
