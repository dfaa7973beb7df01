"""The campaign scorer on hand-built evidence: true positive, false positive, wrong rank,
missed, and the clean-step false-positive rate (definitions: docs/campaign.md).

The evidence is written as rank files and read back with ``load_report``, the reader
``scout report`` and the campaign runner use.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from scout_core.campaign.score import claims, score_trial, summarize
from scout_core.records.evidence import load_report
from scout_core.records.reading import Report
from scout_core.records.record import VERDICT_SCHEMA, Record
from scout_core.vocabulary import Failure, Mode, Scope, Status

RUN = "campaign-7"
T0 = 1_000.0


def verdict(
    step: int,
    failure: Failure,
    outliers: tuple[int, ...],
    *,
    at: float | None = None,
    run_id: str = RUN,
) -> Record:
    named = bool(outliers)
    return Record(
        schema=VERDICT_SCHEMA,
        run_id=run_id,
        time=T0 + step if at is None else at,
        step=step,
        surface="layer/layers.1/forward",
        mode=Mode.EXACT,
        status=Status.ATTRIBUTED if named else Status.INCONCLUSIVE,
        failure=failure,
        group=(0, 1, 2, 3),
        outliers=outliers,
        scope=Scope.RANK if named else Scope.GROUP,
        hosts=("h",) * len(outliers),
    )


def report(tmp_path: Path, *records: Record) -> Report:
    run_dir = tmp_path / RUN
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "rank-0.jsonl").write_text("".join(r.to_json() + "\n" for r in records))
    return load_report(tmp_path, strict=False)


def trial(kind: str, victim: int | None, step: int = 3) -> dict[str, Any]:
    return {"index": 7, "setup": "ddp", "kind": kind, "victim": victim, "step": step}


def test_true_positive_names_the_victim_with_the_right_class(tmp_path: Path) -> None:
    rep = report(
        tmp_path,
        verdict(3, Failure.SDC, (2,), at=T0 + 3.5),
        verdict(4, Failure.SDC, (2,), at=T0 + 4.5),  # the same claim again: one claim
    )
    s = score_trial(trial("compute_sdc", 2), rep, injected_at=T0 + 3.0, trained=9, run_id=RUN)
    assert s.outcome == "detected"
    assert (s.true_claims, s.named_claims) == (1, 1)
    assert s.claims[0].records == 2 and s.claims[0].step == 3
    assert s.exact_rank is True
    assert s.ttv_s == pytest.approx(0.5)
    assert s.ttv_steps == 0
    assert (s.clean_steps, s.clean_findings) == (3, 0)  # steps 0..2 were clean


def test_wrong_rank_is_a_miss_and_a_false_claim(tmp_path: Path) -> None:
    rep = report(tmp_path, verdict(4, Failure.SDC, (1,)))
    s = score_trial(trial("param_sdc", 2), rep, injected_at=T0, trained=9, run_id=RUN)
    assert s.outcome == "wrong_rank"
    assert (s.true_claims, s.named_claims) == (0, 1)
    assert s.exact_rank is False
    assert s.ttv_s is None
    total = summarize([s])
    assert total["recall"] == 0.0 and total["precision"] == 0.0 and total["exact_rank"] == 0.0


def test_extra_rank_beside_the_victim_is_found_but_not_exact(tmp_path: Path) -> None:
    rep = report(tmp_path, verdict(5, Failure.STRAGGLER, (1, 2)))
    s = score_trial(trial("compute_straggler", 2), rep, injected_at=T0, trained=9, run_id=RUN)
    assert s.outcome == "detected" and s.exact_rank is False
    assert s.ttv_steps == 2


def test_wrong_class_naming_the_victim_is_not_a_true_positive(tmp_path: Path) -> None:
    rep = report(tmp_path, verdict(4, Failure.STRAGGLER, (2,)))
    s = score_trial(trial("comm_straggler", 2), rep, injected_at=T0, trained=9, run_id=RUN)
    assert s.outcome == "wrong_class" and s.true_claims == 0 and s.exact_rank is None


def test_missed_when_nothing_is_said(tmp_path: Path) -> None:
    (tmp_path / RUN).mkdir()
    s = score_trial(
        trial("hang_gil", 0),
        load_report(tmp_path, strict=False),
        injected_at=T0,
        trained=8,
        run_id=RUN,
    )
    assert s.outcome == "missed" and s.claims == ()
    assert summarize([s])["recall"] == 0.0
    assert summarize([s])["precision"] is None  # no claim naming ranks: undefined


def test_clean_control_with_a_verdict_is_a_false_alarm_and_counts_per_step(
    tmp_path: Path,
) -> None:
    rep = report(
        tmp_path,
        verdict(1, Failure.STRAGGLER, (3,)),
        verdict(2, Failure.STRAGGLER, (3,)),  # one claim, but two clean-step findings
        verdict(4, Failure.GROUP_STALL, ()),  # a group-scope flag: a finding, names no one
    )
    s = score_trial(trial("clean", None), rep, injected_at=None, trained=8, run_id=RUN)
    assert s.outcome == "false_alarm"
    assert (s.clean_steps, s.clean_findings) == (8, 3)
    assert (s.named_claims, s.true_claims) == (1, 0)
    clean = score_trial(
        trial("clean", None), report(tmp_path / "other"), injected_at=None, trained=12, run_id=RUN
    )
    assert clean.outcome == "clean"
    total = summarize([s, clean])
    assert total["clean_steps"] == 20 and total["clean_findings"] == 3
    assert total["fp_per_1k_clean_steps"] == pytest.approx(150.0)
    assert total["precision"] == 0.0 and total["recall"] is None


def test_findings_before_the_injection_step_are_false_positives(tmp_path: Path) -> None:
    rep = report(tmp_path, verdict(1, Failure.SDC, (0,)), verdict(3, Failure.SDC, (2,)))
    s = score_trial(trial("compute_sdc", 2), rep, injected_at=T0 + 3, trained=9, run_id=RUN)
    assert s.outcome == "detected"
    assert (s.clean_steps, s.clean_findings) == (3, 1)
    assert (s.true_claims, s.named_claims) == (1, 2)
    assert summarize([s])["precision"] == pytest.approx(0.5)


def test_other_runs_in_the_directory_are_ignored(tmp_path: Path) -> None:
    rep = report(tmp_path, verdict(3, Failure.SDC, (1,), run_id="campaign-8"))
    assert claims(rep, RUN) == []
    assert len(claims(rep)) == 1


def test_summary_medians_and_worst(tmp_path: Path) -> None:
    scores = []
    for i, delay in enumerate((0.5, 1.5, 4.0)):
        rep = report(tmp_path / str(i), verdict(3 + i, Failure.HANG, (1,), at=T0 + delay))
        scores.append(
            score_trial(trial("hang_sigstop", 1), rep, injected_at=T0, trained=8, run_id=RUN)
        )
    total = summarize(scores)
    assert total["recall"] == 1.0 and total["precision"] == 1.0 and total["exact_rank"] == 1.0
    assert total["ttv_s"] == {"median": 1.5, "worst": 4.0}
    assert total["ttv_steps"] == {"median": 1.0, "worst": 2.0}


def test_a_fault_that_never_struck_is_left_out(tmp_path: Path) -> None:
    rep = report(tmp_path, verdict(5, Failure.SDC, (1,)))
    s = score_trial(
        trial("optimizer_sdc", 1), rep, injected_at=None, trained=9, run_id=RUN, fired=False
    )
    assert s.outcome == "not_injected"
    total = summarize([s])
    assert total["not_injected"] == 1 and total["injected"] == 0 and total["recall"] is None
