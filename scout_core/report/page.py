"""``scout report --html``: the timeline and the pictures in one self-contained HTML file.

The page fetches nothing (inline CSS, pictures as ``data:image/png`` URIs), so it can be
mailed, attached to a ticket or opened on an air-gapped machine. Every value from the
evidence is HTML-escaped. Each ``<section id="...">`` holds a table whose rows carry the
record's ``data-id``, so tools and tests can find records in the page.
"""

from __future__ import annotations

import base64
import html
import time
from collections.abc import Mapping

from scout_core.report.timeline import SECTIONS, Row, Timeline, clock, ttv_text

__all__ = ["render_html"]

_TITLES = {
    "incidents": "Incidents",
    "verdicts": "Verdicts",
    "gate": "Checkpoint gate",
    "restore": "Restore",
}
_CAPTIONS = {
    "heatmap.png": "Failures by rank and step",
    "gate.png": "Checkpoint gate: latest, candidate and verified generations",
    "stragglers.png": "Straggler rounds: t_M per rank against the peer median",
}
_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
h1 { font-size: 1.3em; } h2 { font-size: 1.1em; margin-top: 1.6em; }
table { border-collapse: collapse; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f0f0f0; }
section#incidents h2 { color: #b00; }
tr.finding td.what { color: #b00; font-weight: 600; }
.meta { color: #555; } .problems { color: #8a6d00; }
figure { margin: 1em 0; } figcaption { font-size: 0.85em; color: #555; }
img { max-width: 100%; }
"""


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _table(name: str, rows: tuple[Row, ...], show_run: bool) -> str:
    head = ["time", "step", "what", "culprit", "host", "surface", "ttv", "evidence"]
    if show_run:
        head.insert(0, "run")
    out = [f'<section id="{name}"><h2>{_TITLES[name]} ({len(rows)})</h2>']
    if not rows:
        out.append("<p>none</p></section>")
        return "".join(out)
    out.append("<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>")
    for row in rows:
        r = row.record
        cells = {
            "run": r.run_id,
            "time": clock(r.time),
            "step": row.step,
            "what": row.what,
            "culprit": row.culprit,
            "host": ", ".join(r.hosts) or "-",
            "surface": r.surface,
            "ttv": ttv_text(row),
            "evidence": row.evidence + (f" [incident {row.incident}]" if row.incident else ""),
        }
        kind = "finding" if r.failure is not None and name != "gate" else "routine"
        out.append(f'<tr class="{kind}" data-id="{_e(r.id)}" data-section="{name}">')
        out.extend(f'<td class="{h}">{_e(cells[h])}</td>' for h in head)
        out.append("</tr>")
    out.append("</table></section>")
    return "".join(out)


def render_html(timeline: Timeline, figures: Mapping[str, bytes]) -> str:
    """The page for ``timeline``, with ``figures`` (PNG bytes by file name) inline."""
    report = timeline.report
    runs = report.runs()
    stamp = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime())
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>scout report {_e(report.directory)}</title><style>{_CSS}</style></head><body>",
        f"<h1>scout report {_e(report.directory)}</h1>",
        f"<p class='meta'>runs: {_e(', '.join(runs) or '-')}; {len(report.files)} rank file(s), "
        f"{len(report.records)} record(s); pictures show run "
        f"{_e(timeline.pictured_run() or '-')}; made {_e(stamp)}</p>",
    ]
    show_run = len(runs) > 1 or timeline.selection.run_id is not None
    parts.extend(_table(name, timeline.sections.get(name, ()), show_run) for name in SECTIONS)
    missing = report.ranks_without_file()
    if missing:
        parts.append(
            f"<p class='meta'>no file from rank(s) {_e(', '.join(map(str, missing)))}, named in "
            "the records' groups (a rank writes a file only once it records a decision)</p>"
        )
    if report.problems:
        parts.append(f"<section id='problems'><h2>Skipped ({len(report.problems)})</h2><ul>")
        parts.extend(f"<li class='problems'>{_e(p)}</li>" for p in report.problems)
        parts.append("</ul></section>")
    parts.append("<section id='pictures'><h2>Pictures</h2>")
    for name, png in figures.items():
        data = base64.b64encode(png).decode("ascii")
        caption = _CAPTIONS.get(name, name)
        parts.append(
            f"<figure><img alt='{_e(caption)}' src='data:image/png;base64,{data}'>"
            f"<figcaption>{_e(caption)}</figcaption></figure>"
        )
    parts.append("</section></body></html>\n")
    return "".join(parts)
