"""One deterministic Nth of the ``slow`` tests, balanced by time (``scripts/test.sh`` loads it).

Run as ``python -m pytest -p scripts.slow_shard --slow-shard K/N ...`` from the
repository root. The collected slow tests (not marked ``gpu``) are dealt to N shards
longest first, each to the shard with the least time so far (ties to the lower shard),
by the times recorded in ``--slow-durations`` (default ``scripts/slow_durations.json``,
seconds by node id). A test with no recorded time counts as the median of the recorded
ones. Node ids lose their ``-seedNNN`` part, which changes from day to day, and a docs
block's id loses its line number (``[docs/x.md:213]`` -> ``[docs/x.md]``), which moves
with any edit above it; the blocks of one page share that name, so they share a shard and
their times add up. The same checkout deals the same shards on every machine, and shards
``1/N`` to ``N/N`` together run every slow test exactly once. Tests not marked ``slow``
are left to ``-m``: CI runs ``-m "not gpu"`` with today's shard, so every slow test runs
in CI within N days.

``--slow-record PATH`` merges the times (setup + call + teardown) of the slow tests that
passed into PATH, the file ``--slow-durations`` reads. A run prints its shard, how many
slow tests it kept and their recorded time.

It imports only pytest and the standard library, and does nothing without
``--slow-shard`` or ``--slow-record``.
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pytest

_SEED = re.compile(r"-seed\d+")
_DOCS_LINE = re.compile(r"(\[[^\[\]]+\.md):\d+\]")
DEFAULT_DURATIONS = Path(__file__).with_name("slow_durations.json")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("scout-slow-shard", "a shard of the slow tests (scripts/slow_shard.py)")
    group.addoption(
        "--slow-shard",
        default=None,
        metavar="K/N",
        help="keep only the slow tests of shard K of N (1 <= K <= N)",
    )
    group.addoption(
        "--slow-durations",
        default=str(DEFAULT_DURATIONS),
        metavar="PATH",
        help="recorded seconds per slow test, by node id (default: scripts/slow_durations.json)",
    )
    group.addoption(
        "--slow-record",
        default=None,
        metavar="PATH",
        help="merge the times of the slow tests that passed into PATH",
    )


def parse(text: str) -> tuple[int, int]:
    """``"K/N"`` as ``(K, N)``; a :class:`pytest.UsageError` naming the value otherwise."""
    match = re.fullmatch(r"(\d+)/(\d+)", text.strip())
    if match is None:
        raise pytest.UsageError(f"--slow-shard takes K/N (e.g. 3/8), got {text!r}")
    k, n = int(match[1]), int(match[2])
    if not 1 <= k <= n:
        raise pytest.UsageError(f"--slow-shard K/N needs 1 <= K <= N, got {text!r}")
    return k, n


def key(nodeid: str) -> str:
    """A node id without its day's seed or its docs block's line number: the name a test's
    time is recorded under."""
    return _DOCS_LINE.sub(r"\1]", _SEED.sub("", nodeid))


def load_durations(path: str | Path) -> dict[str, float]:
    """The recorded times; ``{}`` when the file does not exist, a UsageError naming it when
    it is not a JSON object of non-negative seconds."""
    file = Path(path)
    if not file.exists():
        return {}
    try:
        data = json.loads(file.read_text())
    except ValueError as exc:
        raise pytest.UsageError(f"--slow-durations {file}: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise pytest.UsageError(
            f"--slow-durations {file}: expected an object of seconds by node id"
        )
    for name, seconds in data.items():
        if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or seconds < 0:
            raise pytest.UsageError(
                f"--slow-durations {file}: {name!r} has {seconds!r}, expected seconds >= 0"
            )
    return {str(name): float(seconds) for name, seconds in data.items()}


def deal(names: list[str], n: int, durations: dict[str, float]) -> dict[str, int]:
    """Each name's shard (1..n): longest first, to the least loaded shard (module doc)."""
    known = [durations[name] for name in names if name in durations]
    default = statistics.median(known) if known else 1.0
    load = [0.0] * n
    shard: dict[str, int] = {}
    for name in sorted(set(names), key=lambda x: (-durations.get(x, default), x)):
        k = min(range(n), key=lambda i: (load[i], i))
        load[k] += durations.get(name, default)
        shard[name] = k + 1
    return shard


def _sharded(item: pytest.Item) -> bool:
    return item.get_closest_marker("slow") is not None and item.get_closest_marker("gpu") is None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    option = config.getoption("slow_shard")
    if option is None:
        return
    k, n = parse(option)
    durations = load_durations(config.getoption("slow_durations"))
    shard = deal([key(item.nodeid) for item in items if _sharded(item)], n, durations)
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        (dropped if _sharded(item) and shard[key(item.nodeid)] != k else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
    mine = [key(item.nodeid) for item in kept if _sharded(item)]
    recorded = [durations[name] for name in mine if name in durations]
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(
            f"slow shard {k}/{n}: {len(mine)} slow test(s) kept, {sum(recorded):.0f} s recorded"
            f" ({len(mine) - len(recorded)} without a recorded time)"
        )


class _Recorder:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.seconds: dict[str, float] = {}
        self.failed: set[str] = set()
        self.slow: set[str] = set()

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        self.slow = {item.nodeid for item in items if _sharded(item)}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.nodeid not in self.slow:
            return
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration
        if report.outcome != "passed":
            self.failed.add(report.nodeid)

    def pytest_sessionfinish(self) -> None:
        failed = {key(nodeid) for nodeid in self.failed}
        passed: dict[str, float] = {}
        for nodeid, seconds in self.seconds.items():
            if key(nodeid) not in failed:
                passed[key(nodeid)] = round(passed.get(key(nodeid), 0.0) + seconds, 1)
        if not passed:
            return
        merged = {**load_durations(self.path), **passed}
        self.path.write_text(json.dumps(dict(sorted(merged.items())), indent=1) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("slow_record")
    if path is not None:
        config.pluginmanager.register(_Recorder(Path(path)), "scout-slow-record")
