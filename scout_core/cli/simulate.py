"""``scout simulate LAYOUT...``: SCOUT's grouping and decisions on large layouts, no processes.

Each layout (``--table2`` adds PAPER.md Table 2 and a 100k-rank one) goes through
:func:`scout_core.simulation.scale.simulate`. Prints a table (or ``--json``); exits 0 when
every planted culprit was found, 1 when one was not, 2 for a layout that does not parse.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``scout simulate``."""
    parser.add_argument("layouts", nargs="*", help='layouts such as "TP8 PP16 DP128"')
    parser.add_argument(
        "--table2", action="store_true", help="PAPER.md Table 2 layouts and a 100k-rank one"
    )
    parser.add_argument("--json", action="store_true", help="print JSON for machines")
    parser.add_argument("--gpus-per-host", type=int, default=8, help="ranks per machine")
    parser.add_argument("--seed", type=int, default=0, help="where the culprit is planted")


def _kib(n: int) -> str:
    return f"{n / 1024:,.0f} KiB" if n < 1 << 20 else f"{n / (1 << 20):,.1f} MiB"


def run(args: argparse.Namespace) -> int:
    """Simulate every layout asked for; print; return the exit code (module doc)."""
    from scout_core.errors import ConfigError
    from scout_core.simulation.layouts import LARGE, TABLE_2
    from scout_core.simulation.scale import simulate

    todo: list[tuple[str, str]] = [("-", text) for text in args.layouts]
    if args.table2:
        todo += [(p.model, p.layout) for p in (*TABLE_2, LARGE)]
    if not todo:
        print('scout simulate: give a layout (e.g. "TP8 PP16 DP128") or --table2', file=sys.stderr)
        return 2
    results: list[tuple[str, Any]] = []
    for model, text in todo:
        try:
            sim = simulate(text, gpus_per_host=args.gpus_per_host, seed=args.seed)
        except (ConfigError, ValueError) as exc:
            print(f"scout simulate: {exc}", file=sys.stderr)
            return 2
        results.append((model, sim))
    if args.json:
        print(json.dumps([{"model": m, **s.to_dict()} for m, s in results], indent=1))
    else:
        _print_table(results)
    return 0 if all(s.ok for _, s in results) else 1


def _print_table(results: list[tuple[str, Any]]) -> None:
    head = (
        "model", "layout", "ranks", "peers", "groups", "group ms", "decide ms",
        "all groups ms", "diagnose ms", "hang ms",
        "found", "C3 / rank", "observer / rank: world vs peers",
    )  # fmt: skip
    rows = [head]
    for model, s in results:
        t, traffic = s.timings_s, s.traffic
        rows.append(
            (
                model,
                s.layout,
                f"{s.world:,}",
                str(s.peer_degree),
                str(s.groups),
                f"{t['group'] * 1e3:.1f}",
                f"{(t['exact'] + t['statistical']) * 1e3:.2f}",
                f"{t['every_group'] * 1e3:.1f}",
                f"{t['diagnosis'] * 1e3:.2f}",
                f"{t['wait_for'] * 1e3:.1f}",
                "yes" if s.ok else "NO",
                _kib(traffic.c3_round),
                f"{_kib(traffic.observer_world)} vs {_kib(traffic.observer_peer_group)}",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    for model, s in results:
        for note in s.notes:
            print(f"{model} {s.layout}: {note}")
        for name, passed in s.checks.items():
            if not passed:
                print(f"{model} {s.layout}: FAILED {name}")
    print(
        "group: every rank's address and peer group; decide: one exact and one statistical "
        "C3 decision\nin the culprit's group; all groups: the exact round of every peer "
        "group; diagnose: the four\nplanted cross-PG scenarios; hang: the wait-for graph of a "
        "frozen rank, its roots and waiters.\nTraffic is what one rank "
        "receives per round (1 KiB per peer)."
    )
