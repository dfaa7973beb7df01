"""The replay verdict rules that need no process group: the group broadcast-time rule
(``t_bcast``) and the schedule's healthy-path check."""

from __future__ import annotations

from scout_core.decision.c3 import C3Result
from scout_core.replay.runner import RoundOutcome
from scout_core.replay.schedule import HIDDEN, Recipe, Schedule
from scout_core.replay.verdicts import VerdictMaker
from scout_core.vocabulary import Mode, Status

GROUP = (0, 1, 2, 3)


def _maker() -> VerdictMaker:
    return VerdictMaker(
        run_id="t",
        hosts={r: "h" for r in GROUP},
        rounds=2,
        min_excess_s=0.05,
        min_ratio=1.5,
        peer_kind="replica",
    )


def _round(step: int, times: list[float]) -> RoundOutcome:
    recipe = Recipe(HIDDEN, f"layers.{step % 4}", step % 4)
    bcast = C3Result(
        surface=f"{recipe.name}/t_bcast",
        mode=Mode.STATISTICAL,
        status=Status.AGREE,
        bitmap=(False,) * len(times),
        evidence=tuple(times),
        ranks=GROUP,
    )
    return RoundOutcome(recipe, step, GROUP, True, {bcast.surface: bcast}, source=step % 4)


def _judge(maker: VerdictMaker, step: int, times: list[float]) -> list[tuple[str, tuple[int, ...]]]:
    return [
        (str(r.failure.value if r.failure else None), tuple(r.outliers))
        for r in maker.judge(_round(step, times))
    ]


def test_slow_group_needs_two_consecutive_rounds_and_names_the_group() -> None:
    maker = _maker()
    clean = [0.002, 0.001, 0.003, 0.001]
    slow = [0.2, 0.001, 0.2, 0.002]  # the stalled peer and the one that waited for it
    assert _judge(maker, 0, clean) == []
    assert _judge(maker, 1, clean) == []
    assert _judge(maker, 2, slow) == []  # one round is not enough
    assert _judge(maker, 3, slow) == [("comm_straggler", GROUP)]
    assert _judge(maker, 4, slow) == [("comm_straggler", GROUP)]
    assert _judge(maker, 5, clean) == []


def test_one_descheduled_peer_is_not_a_slow_group() -> None:
    maker = _maker()
    for step in range(2):
        assert _judge(maker, step, [0.002, 0.001, 0.003, 0.001]) == []
    for step in range(2, 8):
        assert _judge(maker, step, [0.002, 0.3, 0.003, 0.001]) == []


def test_no_judgement_before_a_baseline_exists() -> None:
    maker = _maker()
    slow = [0.2, 0.2, 0.2, 0.2]
    assert all(_judge(maker, s, slow) == [] for s in range(2))


def test_small_excess_is_noise() -> None:
    maker = _maker()
    for step in range(2):
        _judge(maker, step, [0.010, 0.010, 0.010, 0.010])
    # 3x the baseline, but only 20 ms more: under the 50 ms minimum excess.
    for step in range(2, 6):
        assert _judge(maker, step, [0.030, 0.030, 0.030, 0.030]) == []


def test_any_due_matches_due() -> None:
    sched = Schedule(
        layers=["a", "b"],
        embedding="e",
        lm_head=None,
        optimizer=True,
        intervals={"hidden": 20, "embedding": 30, "lm_head": 7, "optimizer": 50},
        recipes=("hidden", "embedding", "lm_head", "optimizer"),
        variants=3,
    )
    for step in range(400):
        assert sched.any_due(step) == bool(sched.due(step)), step


def test_compute_straggler_needs_consecutive_rounds_and_names_the_rank() -> None:
    """A ``t_M`` outlier (C3 attributed it) becomes a straggler after ``rounds`` rounds."""
    maker = _maker()

    def judged(step: int) -> list[tuple[str, tuple[int, ...]]]:
        recipe = Recipe(HIDDEN, f"layers.{step % 4}", step % 4)
        t_m = C3Result(
            surface=f"{recipe.name}/t_M",
            mode=Mode.STATISTICAL,
            status=Status.ATTRIBUTED,
            bitmap=(False, False, True, False),
            evidence=(0.01, 0.011, 0.3, 0.012),
            ranks=GROUP,
        )
        outcome = RoundOutcome(recipe, step, GROUP, True, {t_m.surface: t_m}, source=0)
        return [
            (str(r.failure.value if r.failure else None), tuple(r.outliers))
            for r in maker.judge(outcome)
        ]

    assert judged(0) == []  # one round is not enough
    assert judged(1) == [("straggler", (2,))]
