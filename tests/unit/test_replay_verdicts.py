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


def _timing_round(recipe: Recipe, step: int, slow_rank: int | None) -> RoundOutcome:
    times = [0.010, 0.011, 0.012, 0.010]
    if slow_rank is not None:
        times[GROUP.index(slow_rank)] = 0.3
    t_m = C3Result(
        surface=f"{recipe.name}/t_M",
        mode=Mode.STATISTICAL,
        status=Status.ATTRIBUTED if slow_rank is not None else Status.AGREE,
        bitmap=tuple(r == slow_rank for r in GROUP),
        evidence=tuple(times),
        ranks=GROUP,
    )
    return RoundOutcome(recipe, step, GROUP, True, {t_m.surface: t_m}, source=0)


def _stragglers(maker: VerdictMaker, outcome: RoundOutcome) -> list[tuple[int, tuple[int, ...]]]:
    return [(r.step, tuple(r.outliers)) for r in maker.judge(outcome) if r.failure]


def test_hidden_only_delay_is_confirmed_across_other_recipes() -> None:
    """Issue 10 item 1: the embedding and LM-head rounds between two hidden rounds
    neither confirm nor clear the hidden layers' streak."""
    maker = _maker()
    embed, head = Recipe("embedding", "embed"), Recipe("lm_head", "head")
    seen = []
    for step in range(3):
        hidden = Recipe(HIDDEN, f"layers.{step}", step)
        seen += _stragglers(maker, _timing_round(hidden, step, slow_rank=2))
        seen += _stragglers(maker, _timing_round(embed, step, slow_rank=None))
        seen += _stragglers(maker, _timing_round(head, step, slow_rank=None))
    assert seen == [(1, (2,)), (2, (2,))]  # exactly after straggler_rounds=2 hidden rounds


def test_one_slow_step_across_recipes_is_not_a_straggler() -> None:
    maker = _maker()
    step = 5
    hidden = Recipe(HIDDEN, "layers.1", 1)
    assert _stragglers(maker, _timing_round(hidden, step, slow_rank=2)) == []
    assert _stragglers(maker, _timing_round(Recipe("embedding", "embed"), step, 2)) == []
    assert _stragglers(maker, _timing_round(Recipe("lm_head", "head"), step, 2)) == []
    assert _stragglers(maker, _timing_round(hidden, step + 1, slow_rank=None)) == []


def test_series_keys() -> None:
    assert Recipe(HIDDEN, "layers.0", 0).series == Recipe(HIDDEN, "layers.3", 3).series
    assert Recipe("embedding", "embed").series != Recipe("lm_head", "head").series
    assert Recipe("optimizer", None, 7).series == "optimizer"


def test_default_cadence_spreads_one_recipe_per_due_step() -> None:
    sched = Schedule(
        layers=[f"layers.{i}" for i in range(12)],
        embedding="embed",
        lm_head="head",
        optimizer=True,
        intervals={"hidden": 20, "embedding": 20, "lm_head": 20, "optimizer": 20},
        recipes=("hidden", "embedding", "lm_head", "optimizer"),
        variants=3,
    )
    assert sched.most_per_step() == 1
    assert {s: [r.kind for r in sched.due(s)] for s in range(20) if sched.due(s)} == {
        4: ["optimizer"],
        9: ["lm_head"],
        14: ["embedding"],
        19: ["hidden"],
    }
    # The hidden layer keeps its rotation: layer k at step 20k + 19.
    assert [r.path for r in sched.due(59)] == ["layers.2"]


def test_spread_off_and_dense_intervals_share_steps() -> None:
    common = {
        "layers": ["a", "b"],
        "embedding": "e",
        "lm_head": "h",
        "optimizer": True,
        "recipes": ("hidden", "embedding", "lm_head", "optimizer"),
        "variants": 3,
    }
    off = Schedule(
        **common,
        intervals=dict.fromkeys(("hidden", "embedding", "lm_head", "optimizer"), 20),
        spread=False,
    )  # type: ignore[arg-type]
    assert len(off.due(19)) == 4 and off.most_per_step() == 4
    two = Schedule(
        **common, intervals=dict.fromkeys(("hidden", "embedding", "lm_head", "optimizer"), 2)
    )  # type: ignore[arg-type]
    # Two free phases for four recipes: two per step, never more.
    assert two.most_per_step() == 2
    assert [r.kind for r in two.due(1)] == ["hidden", "optimizer"]
    assert [r.kind for r in two.due(2)] == ["embedding", "lm_head"]


def test_an_added_track_gets_its_own_phase_and_catalog_entries() -> None:
    from scout_core.replay.schedule import Track

    sched = Schedule(
        layers=["a", "b"],
        embedding=None,
        lm_head=None,
        optimizer=False,
        intervals={"hidden": 10},
        recipes=("hidden",),
        variants=3,
        tracks=[Track("router", 10, ("a.router", "b.router"))],
    )
    assert [r.name for r in sched.catalog] == [
        "layer/a",
        "layer/b",
        "layer/a.router",
        "layer/b.router",
    ]
    assert sched.most_per_step() == 1
    routers = [(s, r.path) for s in range(30) for r in sched.due(s) if r.kind == "router"]
    assert [p for _, p in routers] == ["a.router", "b.router", "a.router"]
