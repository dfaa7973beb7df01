"""``scout campaign`` without training: a setup whose framework is missing is skipped with a
line saying so, the table's layout, and the progress bar's on/off switch."""

from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path

import pytest

from scout_core.campaign import plan, runner
from scout_core.campaign.score import TrialScore
from scout_core.cli import campaign as cli
from scout_core.cli.main import main


@pytest.fixture
def missing_frameworks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every setup needs a module that is not installed: nothing may be spawned."""
    real = plan.setup_named

    def ghost(name: str) -> plan.Setup:
        return replace(real(name), requires=("no_such_framework_xyz",))

    monkeypatch.setattr(runner, "setup_named", ghost)

    def no_trial(*args: object, **kwargs: object) -> TrialScore:
        raise AssertionError("a skipped setup spawned a trial")

    monkeypatch.setattr(runner, "run_trial", no_trial)


@pytest.mark.usefixtures("missing_frameworks")
def test_a_setup_without_its_framework_is_skipped_with_a_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "campaign",
            "--seed",
            "2",
            "--trials",
            "3",
            "--setup",
            "megatron",
            "--no-progress",
            "--out-dir",
            str(tmp_path),
        ]
    )
    out = capsys.readouterr()
    assert code == 2  # no trial could run
    assert out.out.count("skipped setup megatron: no_such_framework_xyz is not importable") == 1
    assert "no trial could run" in out.err


@pytest.mark.usefixtures("missing_frameworks")
def test_skipped_trials_are_recorded(tmp_path: Path) -> None:
    skipped: list[tuple[str, str]] = []
    drawn = plan.draw_plan(0, trials=4, setups=["torchtitan", "deepspeed-zero3"])
    result = runner.run_campaign(drawn, tmp_path, on_skip=lambda s, m: skipped.append((s, m)))
    assert result.scores == []
    assert [t["index"] for t in result.skipped] == [0, 1, 2, 3]
    assert {s for s, _ in skipped} == {t.setup for t in drawn}  # one line per setup


def test_the_table_has_a_row_per_kind_and_setup_and_a_total() -> None:
    rows = [
        TrialScore(0, "ddp", "compute_sdc", 1, 2, "detected", (), 1, 1, True, 0.5, 0, 2, 0),
        TrialScore(1, "hsdp", "clean", None, 2, "clean", (), 0, 0, None, None, None, 7, 0),
    ]
    table = cli.render_table(rows).splitlines()
    assert table[1] == "-- by fault kind" and "-- by setup" in table and "-- total" in table
    kinds = [line.split()[0] for line in table[2 : table.index("-- by setup")]]
    assert kinds == ["compute_sdc", "clean"]
    total = table[-1].split()
    assert total[:4] == ["all", "2", "1", "0"] and total[4] == "100%"


def test_the_progress_bar_draws_on_stderr_only_when_shown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with cli._progress(2, show=False) as advance:
        advance("one")  # nothing to draw, nothing raised
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    with cli._progress(2, show=True) as advance:
        advance("#0 ddp clean")
        advance("#1 ddp hang_gil")
    assert "2/2" in err.getvalue()


def test_a_trial_whose_port_was_taken_runs_again_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from scout_core.testing import RankFailedError

    calls: list[int] = []

    def flaky(*args: object, **kwargs: object) -> list[dict[str, object]]:
        calls.append(1)
        if len(calls) == 1:
            raise RankFailedError("rank 0 failed:\nDistNetworkError: ... EADDRINUSE ...")
        return [{"rank": r, "victim": False, "injected_at": None, "trained": 7} for r in range(4)]

    monkeypatch.setattr("scout_core.testing.harness.run_ranks", flaky)
    trial = plan.draw_plan(0, trials=1, setups=["ddp"], kinds=["clean"])[0]
    score = runner.run_trial(trial, plan.setup_named("ddp"), tmp_path)
    assert len(calls) == 2
    assert (score.outcome, score.error, score.clean_steps) == ("clean", None, 7)
    assert not list(tmp_path.glob("*.error.txt"))
