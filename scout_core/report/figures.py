"""The pictures of ``scout report`` (matplotlib, Agg backend), as PNG bytes of a fixed size.

Contract: :func:`render_figures` draws up to three pictures of one run (the selected one,
else the latest), each at its :data:`SIZES` size so a page can lay them out and a test can
check them. It uses :class:`matplotlib.figure.Figure` and the Agg canvas, never ``pyplot``:
no global state, no display, safe headless. The pictures: docs/report.md, "Pictures".
"""

from __future__ import annotations

import io
from collections.abc import Sequence

from matplotlib.artist import Artist
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from scout_core.records.record import CHECKPOINT_SCHEMA, Record
from scout_core.report.timeline import Timeline
from scout_core.vocabulary import Failure

__all__ = ["COLOURS", "DPI", "SIZES", "render_figures"]

DPI = 100
SIZES: dict[str, tuple[int, int]] = {
    "heatmap.png": (1000, 460),
    "gate.png": (1000, 320),
    "stragglers.png": (1000, 360),
}
"""Width and height in pixels of each picture."""
COLOURS: dict[Failure, str] = {
    Failure.SDC: "#d62728",
    Failure.STRAGGLER: "#ff7f0e",
    Failure.COMM_STRAGGLER: "#bcbd22",
    Failure.HANG: "#9467bd",
    Failure.PROTOCOL_MISMATCH: "#e377c2",
    Failure.GROUP_STALL: "#8c564b",
    Failure.INPUT_STALL: "#17becf",
    Failure.CHECKPOINT_STALL: "#1f77b4",
}
"""One colour per failure kind, the same in every picture."""
_MAX_CELLS = 200  # rows or columns of the heatmap before binning
_MAX_STRAGGLER_ROUNDS = 4
_EMPTY = "#f2f2f2"


def render_figures(timeline: Timeline) -> dict[str, bytes]:
    """PNG bytes by file name; ``stragglers.png`` only when a round flagged one."""
    run = timeline.pictured_run()
    every = [r for r in timeline.report.records if r.run_id == run]
    shown = [row.record for row in timeline.rows if row.record.run_id == run]
    out = {
        "heatmap.png": _heatmap(run, every, shown),
        "gate.png": _gate(run, every, shown),
    }
    slow = [r for r in shown if r.failure is Failure.STRAGGLER and r.schema != CHECKPOINT_SCHEMA]
    if slow:
        out["stragglers.png"] = _stragglers(run, slow[:_MAX_STRAGGLER_ROUNDS])
    return out


def _figure(name: str) -> Figure:
    width, height = SIZES[name]
    fig = Figure(figsize=(width / DPI, height / DPI), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _png(fig: Figure) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()


def _bins(lo: int, hi: int) -> int:
    """Values per cell so that ``lo..hi`` fits in ``_MAX_CELLS`` cells."""
    return max(1, -(-(hi - lo + 1) // _MAX_CELLS))


def _heatmap(run: str | None, every: Sequence[Record], shown: Sequence[Record]) -> bytes:
    fig = _figure("heatmap.png")
    ax = fig.add_subplot()
    ranks = {r for rec in every for r in (*rec.group, *rec.outliers)} or {0}
    steps = [rec.step for rec in every] or [0]
    r0, r1, s0, s1 = min(ranks), max(ranks), min(steps), max(steps)
    rk, sk = _bins(r0, r1), _bins(s0, s1)
    rows, cols = (r1 - r0) // rk + 1, (s1 - s0) // sk + 1
    grid = [[to_rgba(_EMPTY)] * cols for _ in range(rows)]
    # A shared cell shows the most specific finding: a culprit before a pale group, then
    # the earlier failure kind in Failure's order.
    worst = [[(2, 0)] * cols for _ in range(rows)]
    kinds: set[Failure] = set()
    labels: dict[tuple[int, int], str] = {}
    for rec in shown:
        if rec.failure is None or rec.schema == CHECKPOINT_SCHEMA:
            continue
        kinds.add(rec.failure)
        last = rec.detail.get("last_step", rec.step)
        last = last if isinstance(last, int) and last >= rec.step else rec.step
        pale = not rec.outliers
        priority = (int(pale), list(Failure).index(rec.failure))
        colour = to_rgba(COLOURS[rec.failure], 0.35 if pale else 1.0)
        rows_hit = {(rank - r0) // rk for rank in (rec.group if pale else rec.outliers)}
        cols_hit = range((rec.step - s0) // sk, (min(last, s1) - s0) // sk + 1)
        for i in rows_hit:  # per cell, not per rank and step: long incidents stay cheap
            for j in cols_hit:
                if priority < worst[i][j]:
                    worst[i][j], grid[i][j] = priority, colour
                    labels[i, j] = rec.failure.value
    ax.imshow(
        grid,
        aspect="auto",
        interpolation="nearest",
        origin="lower",
        extent=(s0 - 0.5, s0 + cols * sk - 0.5, r0 - 0.5, r0 + rows * rk - 0.5),
    )
    if rk > 1 or sk > 1:  # binned: ring each culprit so a single cell cannot be missed
        for rec in shown:
            if rec.failure is not None and rec.outliers and rec.schema != CHECKPOINT_SCHEMA:
                ax.scatter(
                    [rec.step] * len(rec.outliers),
                    rec.outliers,
                    s=90,
                    facecolors="none",
                    edgecolors=COLOURS[rec.failure],
                    linewidths=1.5,
                )
    if rows <= 32:  # name the cells that are wide enough for their label
        cell_px = SIZES["heatmap.png"][0] * 0.8 / cols
        for (i, j), text in labels.items():
            if len(text) * 5 <= cell_px:
                ax.text(s0 + j * sk, r0 + i * rk, text, ha="center", va="center", fontsize=7)
    restores = [rec.step for rec in every if rec.action == "retrieve"]
    for step in restores:  # the gate's retrieval, after the step that triggered it
        ax.axvline(step + 0.5, color="#9467bd", linestyle="--", linewidth=1.5)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step" + (f" (each column {sk} steps)" if sk > 1 else ""))
    ax.set_ylabel("rank" + (f" (each row {rk} ranks)" if rk > 1 else ""))
    ax.set_title(f"Failures by rank and step, run {run or '-'}")
    handles: list[Artist] = [Patch(color=COLOURS[k], label=k.value) for k in Failure if k in kinds]
    if restores:
        handles.append(Line2D([], [], color="#9467bd", linestyle="--", label="restore"))
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    if not kinds:
        ax.text(0.5, 0.5, "no failures", ha="center", va="center", transform=ax.transAxes)
    return _png(fig)


def _gate(run: str | None, every: Sequence[Record], shown: Sequence[Record]) -> bytes:
    fig = _figure("gate.png")
    ax = fig.add_subplot()
    gate = [r for r in every if r.schema == CHECKPOINT_SCHEMA]
    lanes = {"capture": "latest", "candidate": "candidate", "promote": "verified"}
    styles = {"latest": "#7f7f7f", "candidate": "#ff7f0e", "verified": "#2ca02c"}
    for action, lane in lanes.items():
        points = [(r.step, r.checkpoint_step) for r in gate if r.action == action]
        xs = [x for x, y in points if y is not None]
        ys = [y for x, y in points if y is not None]
        if xs:
            ax.step(xs, ys, where="post", color=styles[lane], label=lane, marker="o", ms=3)
    for r in gate:
        if r.action == "retrieve":
            what = f"restore {r.selected}" + (
                f" step {r.checkpoint_step}" if r.checkpoint_step is not None else ": none yet"
            )
            ax.axvline(r.step, color="#9467bd", linestyle="--", linewidth=1.5)
            if r.checkpoint_step is not None:  # the generation training goes back to
                ax.plot([r.step], [r.checkpoint_step], marker="*", color="#9467bd", ms=14)
            ax.annotate(
                what,
                (r.step, 1.0),
                xycoords=("data", "axes fraction"),
                xytext=(-2, -2),
                textcoords="offset points",
                fontsize=8,
                rotation=90,
                va="top",
                ha="right",
                color="#9467bd",
            )
    failures = [r for r in shown if r.failure is not None and r.schema != CHECKPOINT_SCHEMA]
    for r in failures:
        assert r.failure is not None
        ax.plot(
            [r.step],
            [0],
            marker="v",
            color=COLOURS[r.failure],
            ms=9,
            clip_on=False,
            transform=ax.get_xaxis_transform(),
            linestyle="none",
        )
    kinds = sorted({r.failure for r in failures if r.failure}, key=list(Failure).index)
    handles = ax.get_legend_handles_labels()[0]
    handles += [Patch(color=COLOURS[k], label=k.value) for k in kinds]
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    if not gate:
        ax.text(0.5, 0.5, "no gate records", ha="center", va="center", transform=ax.transAxes)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel("generation (checkpoint step)")
    ax.set_title(f"Checkpoint gate, run {run or '-'}")
    return _png(fig)


def _stragglers(run: str | None, rounds: Sequence[Record]) -> bytes:
    fig = _figure("stragglers.png")
    axes = fig.subplots(1, len(rounds), squeeze=False)[0]
    for ax, rec in zip(axes, rounds, strict=True):
        values = rec.detail.get("evidence")
        if not isinstance(values, list) or len(values) != len(rec.group):
            ax.text(0.5, 0.5, "no timings", ha="center", va="center", transform=ax.transAxes)
            continue
        ms = [float(v) * 1e3 if isinstance(v, int | float) else 0.0 for v in values]
        median = rec.detail.get("median_s")
        med = float(median) * 1e3 if isinstance(median, int | float) else sorted(ms)[len(ms) // 2]
        colours = [
            COLOURS[Failure.STRAGGLER] if r in rec.outliers else "#7f7f7f" for r in rec.group
        ]
        positions = range(len(rec.group))
        bars = ax.bar(positions, ms, color=colours)
        if med > 0 and max(ms) > 20 * med:  # a log axis keeps the healthy peers visible
            ax.set_yscale("log")
        if len(rec.group) <= 16:
            ax.bar_label(bars, fmt="%.1f", fontsize=7)
        ax.axhline(
            med, color="#1f77b4", linestyle="--", linewidth=1, label=f"peer median {med:.1f} ms"
        )
        if len(rec.group) <= 16:
            ax.set_xticks(list(positions), [str(r) for r in rec.group])
        ax.set_xlabel("rank")
        ax.set_ylabel("t_M (ms)")
        ax.set_title(f"step {rec.step}: {rec.surface}", fontsize=9)
        ax.legend(fontsize=8, loc="upper left")
    fig.suptitle(f"Straggler rounds, run {run or '-'}", fontsize=10)
    return _png(fig)
