"""Several tests' cases in one multi-rank job, each test asserting on its own case.

Tests that run the same setup (world size, environment) in jobs of their own each pay
the ranks' start-up and process group; on a 2-core machine that was much of such a
test. A :class:`SharedJob` holds the cases (a rank body and its arguments) that the
tests of one module register with :meth:`SharedJob.case`; :meth:`SharedJob.run` runs
the cases of the selected tests one after another in one :func:`run_ranks` job
(:func:`run_cases` on every rank) and returns each case's per-rank results by name.

A case runs as it would alone: the ranks start it together (a barrier), it builds its
own model, optimizer, faults and session, and it gets its own ``SCOUT_TEST_RANK_DIR``
(a folder of the job's, named after the case), so its report directory and files are
its own. What a body changes in its process beyond its session (a process-wide tap,
a thread it leaves) it must undo before it returns.

If the shared job fails (a rank raises, or it runs out of time), no case has a result:
each test's case is then run again in a job of its own when the test asks for it, so
the failure is reported by the test whose case failed, with that case's own traceback.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from scout_core.errors import ScoutError
from scout_core.testing.harness import _target_name, run_ranks

__all__ = ["CaseResults", "SharedJob", "run_cases", "selected_cases"]

_F = TypeVar("_F", bound=Callable[..., Any])


def run_cases(specs: list[dict[str, Any]]) -> dict[str, Any]:
    """On every rank: each spec's body (``{"case", "target", "args"}``), in order, each
    in its own ``SCOUT_TEST_RANK_DIR``; returns each case's result by name."""
    import importlib

    import torch.distributed as dist

    base = os.environ["SCOUT_TEST_RANK_DIR"]
    out: dict[str, Any] = {}
    for spec in specs:
        module, _, qualname = spec["target"].partition(":")
        body: Any = importlib.import_module(module)
        for part in qualname.split("."):
            body = getattr(body, part)
        own = Path(base, "cases", spec["case"])
        own.mkdir(parents=True, exist_ok=True)
        dist.barrier()  # the ranks start each case together
        os.environ["SCOUT_TEST_RANK_DIR"] = str(own)
        try:
            out[spec["case"]] = body(*spec["args"])
        finally:
            os.environ["SCOUT_TEST_RANK_DIR"] = base
    return out


class CaseResults(Mapping[str, list[Any]]):
    """Each case's per-rank results, by case name; a case the shared job did not finish
    is run alone on first use (:class:`SharedJob`)."""

    def __init__(self, job: SharedJob, results: dict[str, list[Any]], failure: str) -> None:
        self._job = job
        self._results = results
        self.failure = failure
        """Why the shared job gave no results ("" when it did)."""

    def __getitem__(self, case: str) -> list[Any]:
        if case not in self._results:
            if case not in self._job.cases:
                raise KeyError(case)
            self._results[case] = self._job.run_alone(case)
        return self._results[case]

    def __iter__(self) -> Iterator[str]:
        return iter(self._job.cases)

    def __len__(self) -> int:
        return len(self._job.cases)


class SharedJob:
    """The cases of one module's tests, run in one job of ``world_size`` ranks.

    ``timeout_s`` bounds the shared job (every case), ``case_timeout_s`` a case run
    alone; ``env`` is the ranks' environment, as for :func:`run_ranks`.
    """

    def __init__(
        self,
        world_size: int,
        *,
        timeout_s: float,
        case_timeout_s: float,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.world_size = world_size
        self.timeout_s = timeout_s
        self.case_timeout_s = case_timeout_s
        self.env = dict(env or {})
        self.cases: dict[str, dict[str, Any]] = {}
        """Each registered case's spec (``run_cases``), by case name."""

    def case(self, body: Callable[..., Any] | str, *args: Any) -> Callable[[_F], _F]:
        """Register the decorated test's case under the test's name: ``body(*args)`` on
        every rank (a module-level function, or ``"module:function"``); the arguments
        must be JSON."""

        def register(test: _F) -> _F:
            name = test.__name__
            if name in self.cases:
                raise ValueError(f"case {name!r} registered twice")
            self.cases[name] = {"case": name, "target": _target_name(body), "args": list(args)}
            return test

        return register

    def run(self, selected: Iterable[str]) -> CaseResults:
        """Run the registered cases named in ``selected`` (the tests pytest will run) in
        one job; the others stay unrun (a test outside ``selected`` that asks for its
        case gets it run alone)."""
        chosen = set(selected)
        specs = [spec for name, spec in self.cases.items() if name in chosen]
        if not specs:
            return CaseResults(self, {}, "")
        try:
            per_rank = run_ranks(
                run_cases,
                self.world_size,
                args=(specs,),
                timeout_s=self.timeout_s,
                env=self.env,
            )
        except ScoutError as exc:  # RankFailedError, RanksTimeoutError
            return CaseResults(self, {}, str(exc))
        results = {spec["case"]: [res[spec["case"]] for res in per_rank] for spec in specs}
        return CaseResults(self, results, "")

    def run_alone(self, case: str) -> list[Any]:
        """``case`` in a job of its own; its per-rank results."""
        per_rank = run_ranks(
            run_cases,
            self.world_size,
            args=([self.cases[case]],),
            timeout_s=self.case_timeout_s,
            env=self.env,
        )
        return [res[case] for res in per_rank]


def selected_cases(items: Iterable[Any], module: Any) -> set[str]:
    """The names of the tests of ``module`` among pytest's ``items`` (the session's
    selection after ``-k``, ``-m`` and node ids): what :meth:`SharedJob.run` runs."""
    return {
        getattr(item, "originalname", None) or item.name
        for item in items
        if getattr(item, "module", None) is module
    }
