"""A wall-clock budget for a whole pytest run (``scripts/test.sh`` loads it with ``-p``).

Run as ``python -m pytest -p scripts.ci_watchdog --ci-budget-s 4800 ...`` from the
repository root. Each test has its own limit (pytest-timeout, 300 s), but a suite that
slowly grows, or many tests that each stay just under their limit, runs into CI's job
limit instead, and the job is killed with nothing said: no list of what ran, what was
slow, or what was running. Once the budget has passed since pytest started, this plugin

1. prints the test running now and the slowest tests that finished, with their
   durations, straight to the terminal's stderr (a test's output capture cannot hide it);
2. kills every process the run started: all its descendants, found through ``/proc``.
   The ranks of ``scout_core.testing.run_ranks`` run in their own sessions (they would
   die with the harness anyway, by their parent-death signal), and the documented
   commands ``tests/docs`` runs start sessions of their own, so killing a process group
   would miss them;
3. interrupts pytest as Ctrl-C does (SIGINT): pytest stops, prints its summary and its
   ``--durations`` table, writes its JUnit file, and the run exits with
   :data:`EXIT_CODE`;
4. if pytest has not exited ``--ci-grace-s`` seconds later (a test that swallows the
   interrupt, a call that never returns), ends the process with :data:`EXIT_CODE`.

It imports only pytest and the standard library, and does nothing without
``--ci-budget-s``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

EXIT_CODE = 124
"""The run's exit code once the budget is spent (``timeout``'s code for the same event)."""
SLOWEST = 30
"""How many of the slowest finished tests are printed."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("scout-ci-watchdog", "whole-run budget (scripts/ci_watchdog.py)")
    group.addoption(
        "--ci-budget-s",
        type=float,
        default=None,
        help="stop the run after this many seconds, print the slowest tests so far, "
        f"kill what the run started and exit {EXIT_CODE}",
    )
    group.addoption(
        "--ci-grace-s",
        type=float,
        default=60.0,
        help="seconds pytest gets to stop by itself once interrupted (default 60)",
    )


def pytest_configure(config: pytest.Config) -> None:
    budget = config.getoption("ci_budget_s")
    if budget is None:
        return
    if budget <= 0:
        raise pytest.UsageError(f"--ci-budget-s must be positive seconds, got {budget}")
    config.pluginmanager.register(Watchdog(budget, config.getoption("ci_grace_s")), "ci-watchdog")


class Watchdog:
    """The timer and what it reports: each test's duration as it finishes."""

    def __init__(self, budget_s: float, grace_s: float) -> None:
        self.budget_s = budget_s
        self.grace_s = grace_s
        self.expired = False
        self.report = ""
        """:meth:`summary` as it stood when the budget was spent."""
        self._start = time.monotonic()
        self._lock = threading.Lock()
        self._durations: dict[str, float] = {}
        self._finished: set[str] = set()
        self._outcomes: Counter[str] = Counter()
        self._running: tuple[str, float] | None = None
        # Between tests the capture is suspended, so fd 2 is the terminal's stderr now.
        self._stderr = os.dup(2)
        self._timer = threading.Timer(budget_s, self._expire)
        self._timer.daemon = True
        self._timer.start()

    # -- what the run did so far -------------------------------------------------------

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        with self._lock:
            self._running = (nodeid, time.monotonic())

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        with self._lock:
            self._durations[report.nodeid] = (
                self._durations.get(report.nodeid, 0.0) + report.duration
            )
            if report.when == "call":
                self._outcomes[report.outcome] += 1
            elif report.failed:
                self._outcomes["error"] += 1  # in setup or teardown, as pytest counts it
            elif report.skipped:
                self._outcomes["skipped"] += 1

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        with self._lock:
            self._finished.add(nodeid)
            self._running = None

    def summary(self) -> str:
        """The watchdog's report: the budget, the test running now, the slowest finished."""
        now = time.monotonic()
        with self._lock:
            done = [(n, d) for n, d in self._durations.items() if n in self._finished]
            durations = sorted(done, key=lambda kv: -kv[1])
            outcomes = dict(self._outcomes)
            running = self._running
        lines = [
            f"scout CI watchdog: the run's budget of {self.budget_s:.0f} s is spent "
            f"(--ci-budget-s; scripts/test.sh reads SCOUT_CI_BUDGET_S): stopping it",
            "running now: "
            + (f"{running[0]} (for {now - running[1]:.1f} s)" if running else "no test"),
            f"finished after {now - self._start:.0f} s: "
            + (", ".join(f"{n} {k}" for k, n in sorted(outcomes.items())) or "no test"),
            f"slowest finished tests (setup + call + teardown, up to {SLOWEST}):",
            *(f"  {seconds:8.2f} s  {nodeid}" for nodeid, seconds in durations[:SLOWEST]),
        ]
        return "\n".join(lines) + "\n"

    # -- stopping ----------------------------------------------------------------------

    def _say(self, text: str) -> None:
        with contextlib.suppress(OSError):
            os.write(self._stderr, text.encode())

    def _expire(self) -> None:
        self.report = self.summary()
        self.expired = True
        self._say("\n" + self.report)
        killed = kill_descendants(os.getpid())
        self._say(
            f"scout CI watchdog: killed {killed} process(es) the run started; "
            "interrupting pytest (its own summary follows)\n"
        )
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(self.grace_s)
        self._say(
            f"scout CI watchdog: pytest did not stop within {self.grace_s:.0f} s of the "
            f"interrupt; exiting {EXIT_CODE} without its summary or JUnit file\n"
        )
        kill_descendants(os.getpid())
        os._exit(EXIT_CODE)

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.expired:
            terminalreporter.write_sep("=", "stopped by the CI watchdog", red=True)
            terminalreporter.write(self.report)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.expired:
            session.exitstatus = EXIT_CODE

    def pytest_unconfigure(self) -> None:
        self._timer.cancel()
        with contextlib.suppress(OSError):
            os.close(self._stderr)


def descendants(pid: int) -> list[int]:
    """Every live process under ``pid`` (children, theirs, ...), read from ``/proc``;
    none where there is no ``/proc``."""
    children: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                stat = Path("/proc", entry, "stat").read_text()
            except OSError:
                continue  # it exited meanwhile
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
            fields = stat.rsplit(")", 1)[1].split()
            if fields[0] != "Z":
                children.setdefault(int(fields[1]), []).append(int(entry))
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            out.append(child)
            todo.append(child)
    return out


def kill_descendants(pid: int, rounds: int = 3) -> int:
    """SIGKILL every process under ``pid``, again while new ones appear (a process may
    fork between the scan and the kill); the number killed."""
    killed: set[int] = set()
    for _ in range(rounds):
        found = [p for p in descendants(pid) if p not in killed]
        if not found:
            break
        for p in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, signal.SIGKILL)
            killed.add(p)
        time.sleep(0.05)
    return len(killed)
