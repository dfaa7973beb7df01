"""``scout report --html --png`` on the evidence of a real faulty run (the ``scout demo`` job).

Four Gloo ranks train the demo model under SCOUT with a 1-bit SDC on rank 1 and a
compute straggler on rank 2 (:func:`scout_core.cli.demo.run_demo_rank`): the README's
demo command, whose one run in the session the README's transcript shares. The report of
that directory must produce the HTML page and the PNG pictures; the page, parsed with
``html.parser``, must show the verdicts (and an incident, once one is in the directory)
and fetch nothing; each PNG must be a valid image of the documented size; and a damaged
copy of the directory must still render, naming what it skipped.
"""

from __future__ import annotations

import base64
import shutil
import struct
from html.parser import HTMLParser
from pathlib import Path

import pytest
from sandbox import DemoRuns

from scout_core.cli.main import main
from scout_core.records.evidence import load_report
from scout_core.report.figures import SIZES
from scout_core.vocabulary import Failure

README_DEMO = "bash scripts/demo.sh"
"""The README's demo command: 4 ranks, SDC on rank 1 at step 3, rank 2 slow at 6-8."""

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(400)]


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk, after checking the signature."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return int(width), int(height)


class Page(HTMLParser):
    """Sections, table rows (with their cells) and every URL-bearing attribute of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.sections: list[str] = []
        self.rows: list[dict[str, str]] = []
        self.urls: list[tuple[str, str, str]] = []
        self.tags: set[str] = set()
        self._cell: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        self.tags.add(tag)
        if tag == "section":
            self.sections.append(a.get("id", ""))
        if tag == "tr" and "data-section" in a:
            self.rows.append({"section": a["data-section"], "id": a["data-id"]})
        if tag == "td" and self.rows:
            self._cell = a.get("class", "")
            self.rows[-1][self._cell] = ""
        for key in ("src", "href", "action", "data"):
            if key in a:
                self.urls.append((tag, key, a[key]))

    def handle_endtag(self, tag: str) -> None:
        if tag == "td":
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self.rows[-1][self._cell] += data


@pytest.fixture(scope="module")
def demo_dir(demo_runs: DemoRuns) -> Path:
    """The evidence of the README's demo command, run once for the session and shared
    with the README's transcript (``tests/sandbox.py``). Tests only read it (the damaged
    copy is a copy)."""
    run = demo_runs.get(README_DEMO, timeout_s=300)
    # The demo prints where its evidence went once every rank has returned.
    assert "evidence records: scout-demo-report" in run.output, run.output
    return run.sandbox / "scout-demo-report"


def test_html_and_png_from_a_real_faulty_run(demo_dir: Path, tmp_path: Path) -> None:
    html_file, png_dir = tmp_path / "report.html", tmp_path / "png"
    code = main(["report", str(demo_dir), "--html", str(html_file), "--png", str(png_dir)])
    assert code == 1  # the SDC and the straggler were attributed

    pngs = {p.name: p.read_bytes() for p in png_dir.iterdir()}
    assert set(pngs) == {"heatmap.png", "gate.png", "stragglers.png"}
    for name, data in pngs.items():
        assert png_size(data) == SIZES[name], name

    page = Page()
    page.feed(html_file.read_text("utf-8"))
    assert page.sections[:4] == ["incidents", "verdicts", "gate", "restore"]
    verdicts = {(r["what"], r["culprit"]) for r in page.rows if r["section"] == "verdicts"}
    assert ("sdc", "rank 1") in verdicts
    assert ("straggler", "rank 2") in verdicts
    slow = next(r for r in page.rows if r["section"] == "verdicts" and r["what"] == "straggler")
    assert "rank 2:" in slow["evidence"] and "vs peer median" in slow["evidence"]
    assert any(r["section"] == "restore" for r in page.rows)  # the gate's retrieval after SDC

    # Self-contained: no stylesheet or script to fetch, every picture inline.
    assert not page.tags & {"link", "script", "iframe", "object", "embed"}
    images = [url for tag, key, url in page.urls if tag == "img"]
    assert len(images) == 3
    assert len(page.urls) == 3  # nothing else points anywhere
    for url in images:
        head = "data:image/png;base64,"
        assert url.startswith(head)
        assert png_size(base64.b64decode(url[len(head) :]))[0] == 1000


def test_incidents_are_found_in_the_page(demo_dir: Path, tmp_path: Path) -> None:
    # The run's own incidents (merged job-wide at the replay boundaries): the SDC one
    # names rank 1, is listed first, and the SDC verdict points at it.
    report = load_report(demo_dir)
    (sdc,) = report.verdicts(failure="sdc")
    (incident,) = [i for i in report.incidents() if i.failure is Failure.SDC]
    assert incident.outliers == (1,) and sdc.id in incident.detail["corroborating"]
    html_file = tmp_path / "report.html"
    assert main(["report", str(demo_dir), "--html", str(html_file)]) == 1
    page = Page()
    page.feed(html_file.read_text("utf-8"))
    assert page.rows[0]["section"] == "incidents"
    (found,) = [r for r in page.rows if r["section"] == "incidents" and r["what"] == "sdc"]
    assert found["id"] == incident.id
    assert found["culprit"] == "rank 1"
    assert found["evidence"] == incident.detail["summary"]
    cited = next(r for r in page.rows if r["id"] == sdc.id)
    assert f"[incident {incident.id}]" in cited["evidence"]


def test_truncated_and_missing_files_are_reported(
    demo_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = tmp_path / "report"
    shutil.copytree(demo_dir, copy)
    (path,) = copy.glob("*/rank-0.jsonl")  # <report_dir>/<run>/rank-0.jsonl
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])
    shutil.copy(path, path.with_name("rank-00.jsonl"))  # not rank 0's file: named, not read
    html_file, png_dir = tmp_path / "damaged.html", tmp_path / "png"
    code = main(["report", str(copy), "--html", str(html_file), "--png", str(png_dir)])
    out = capsys.readouterr().out
    assert code == 1
    assert "skipped (2):" in out
    assert f"rank-0.jsonl:{len(lines)}: truncated last line" in out
    assert "rank-00.jsonl: odd name" in out
    assert "no file from rank(s) 1-3" in out  # the ranks the records name, without a file
    assert "sdc" in out  # the rest is rendered
    page = Page()
    page.feed(html_file.read_text("utf-8"))
    assert "problems" in page.sections
    assert (png_dir / "heatmap.png").is_file()
