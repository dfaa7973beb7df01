"""Running a campaign's trials one after another, and scoring each from its evidence.

Each trial is a fresh job of :func:`scout_core.testing.run_ranks` with its own report
directory. Trials run sequentially: they time stragglers and hangs, which concurrent jobs
on the same cores would blur.

A ``hang_sigstop`` trial is driven from here: when the victim marks that it is about to
enter the step (:data:`~scout_core.testing.trial.STOP_MARKER`), the runner ``SIGSTOP``\\ s
it until a hang verdict is on disk (or the stall time has passed), then ``SIGCONT``\\ s it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scout_core.campaign.config import STALL_S, fault_spec, trial_settings
from scout_core.campaign.plan import Setup, Trial, missing_module, setup_named
from scout_core.campaign.score import TrialScore, score_trial

__all__ = ["CampaignResult", "run_campaign", "run_trial"]

_STEP_BUDGET_S = 8.0
"""Hard-timeout allowance per step on a loaded CPU box; generous, as a timed-out trial is
an error (scored from what it wrote)."""


@dataclass
class CampaignResult:
    """Every trial's score, and the setups skipped with the reason."""

    scores: list[TrialScore] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0


def _stopper(victim: int, report_dir: Path, times: dict[str, float]) -> Callable[[list[Any]], None]:
    """``run_ranks``'s ``on_start`` for a SIGSTOP trial (module doc)."""
    from scout_core.records.reading import load_report
    from scout_core.testing.trial import RESUMED_MARKER, STOP_MARKER

    def has_hang() -> bool:
        if not report_dir.is_dir():
            return False
        try:
            report = load_report(report_dir, strict=False)
        except Exception:  # the directory is being written; try again
            return False
        return bool(report.verdicts("hang"))

    def drive(ranks: list[Any]) -> None:
        marker = ranks[0].result_path.parent / STOP_MARKER
        proc = ranks[victim].proc
        while not marker.exists():
            if proc.poll() is not None:
                return
            time.sleep(0.005)
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGSTOP)
        times["stopped"] = time.time()
        try:
            deadline = time.monotonic() + STALL_S + 10.0
            while time.monotonic() < deadline and not has_hang():
                time.sleep(0.05)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)
            (marker.parent / RESUMED_MARKER).write_text("{}")

    def on_start(ranks: list[Any]) -> None:
        threading.Thread(target=drive, args=(ranks,), daemon=True).start()

    return on_start


def run_trial(
    trial: Trial,
    setup: Setup,
    out_dir: Path,
    *,
    fault: Mapping[str, Any] | None = None,
    settings: Mapping[str, Any] | None = None,
) -> TrialScore:
    """Run one trial and score it from its evidence; ``fault`` adds keys to the fault's
    spec, ``settings`` replaces the campaign's ``Config`` keyword arguments (the report
    directory stays the trial's own)."""
    from scout_core.errors import ScoutError
    from scout_core.records.reading import load_report
    from scout_core.testing.harness import port_clash, run_ranks

    report_dir = out_dir / f"trial-{trial.index:03d}-{trial.setup}-{trial.kind}"
    payload = trial.to_dict() | {
        "fault": fault_spec(trial.kind, trial.victim, trial.step) | dict(fault or {}),
        "scout": trial_settings(str(report_dir), trial.to_dict())
        if settings is None
        else dict(settings) | {"report_dir": str(report_dir)},
    }
    times: dict[str, float] = {}
    on_start = None
    if trial.kind == "hang_sigstop" and trial.victim is not None:
        on_start = _stopper(trial.victim, report_dir, times)
    error: str | None = None
    results: list[Any] = []
    start = time.monotonic()
    log = report_dir.with_name(report_dir.name + ".error.txt")
    for attempt in (1, 2):
        error = None
        times.clear()
        log.unlink(missing_ok=True)
        try:
            results = run_ranks(
                setup.target,
                setup.world,
                args=(payload, str(report_dir), setup.options),
                timeout_s=setup.startup_s + _STEP_BUDGET_S * trial.steps + 2 * STALL_S,
                env={"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"},
                on_start=on_start,
                init_process_group=setup.init_process_group,
            )
        except (ScoutError, OSError) as exc:
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            log.write_text(f"{type(exc).__name__}: {exc}\n", encoding="utf-8")  # the ranks' logs
            if attempt == 1 and port_clash(str(exc)):
                # another process took the port between the pick and the bind: run again
                shutil.rmtree(report_dir, ignore_errors=True)
                continue
        break
    injected_at = times.get("stopped")
    victim = next((r for r in results if isinstance(r, dict) and r.get("victim")), None)
    fired = True
    if victim is not None:
        injected_at = injected_at or victim.get("injected_at")
        # the fault never struck (a hook found nothing to corrupt): not SCOUT's miss
        fired = injected_at is not None
    trained = min((int(r.get("trained", 0)) for r in results), default=0)
    if report_dir.is_dir():
        report = load_report(report_dir, strict=False)
    else:
        from scout_core.records.reading import Report

        report = Report(directory=report_dir, records=(), by_rank={})
    if error is not None:  # the job died: count the steps its evidence reached
        trained = max((rec.step + 1 for rec in report.records), default=0)
    score = score_trial(
        trial.to_dict(),
        report,
        injected_at=injected_at,
        trained=trained,
        run_id=f"campaign-{trial.index}",
        error=error,
        fired=fired,
    )
    return dataclasses.replace(score, seconds=round(time.monotonic() - start, 1))


def run_campaign(
    plan: Sequence[Trial],
    out_dir: Path,
    *,
    on_trial: Callable[[Trial, TrialScore | None], None] = lambda t, s: None,
    on_skip: Callable[[str, str], None] = lambda setup, module: None,
) -> CampaignResult:
    """Run ``plan`` in order; ``on_trial`` after each trial (None: skipped), ``on_skip``
    once per setup whose framework is not importable here."""
    out_dir.mkdir(parents=True, exist_ok=True)
    result = CampaignResult()
    missing: dict[str, str | None] = {}
    start = time.monotonic()
    for trial in plan:
        setup = setup_named(trial.setup)
        if setup.name not in missing:
            missing[setup.name] = missing_module(setup)
            if missing[setup.name] is not None:
                on_skip(setup.name, str(missing[setup.name]))
        module = missing[setup.name]
        if module is not None:
            result.skipped.append(trial.to_dict() | {"reason": f"{module} is not importable"})
            on_trial(trial, None)
            continue
        score = run_trial(trial, setup, out_dir)
        result.scores.append(score)
        on_trial(trial, score)
    result.seconds = time.monotonic() - start
    return result
