"""The all-to-all replay's timing rules without ranks (EP 2 x expert-DP 4 on paper).

Per-rank in-call times of the replayed dispatch and combine go through
:func:`~scout_core.replay.all_to_all.lateness`, the statistical C3 rule and the
:class:`~scout_core.replay.verdicts.VerdictMaker`, exactly as a round would. Rank 2 is
late into its EP exchange with rank 3: rank 3 waits, so its own time in the call is
the longest of its EP position, and only the lateness names the right rank. A slow
link that stalls both members alike names the EP group, never a rank.
"""

from __future__ import annotations

import pytest

from scout_core.decision.c3 import C3Result
from scout_core.decision.c3.rule import decide_statistical
from scout_core.replay.all_to_all import all_to_all_targets, lateness
from scout_core.replay.runner import RoundOutcome
from scout_core.replay.schedule import ALL_TO_ALL, Recipe
from scout_core.replay.verdicts import VerdictMaker
from scout_core.topology.mesh import Axis, MeshLayout
from scout_core.vocabulary import Mode, Status

LAYOUT = MeshLayout.from_order("e-d", e=2, d=4)
KAPPA = 5.0


def _maker() -> VerdictMaker:
    def group_of(leaf: str, rank: int) -> tuple[str, tuple[int, ...]] | None:
        return ("ep", LAYOUT.group_along(rank, (Axis.E,))) if leaf == "t_a2a" else None

    return VerdictMaker(
        run_id="t",
        hosts={r: f"h{r // 2}" for r in LAYOUT.ranks},
        rounds=2,
        min_excess_s=0.05,
        min_ratio=1.5,
        comm_group_of=group_of,
        peer_kind="replica",
    )


def _call_times(step: int, late: int | None, slow_link: int | None) -> dict[int, list[float]]:
    """Each rank's (dispatch, combine) in-call seconds in one round: a few ms of noise;
    the partners of a ``late`` rank wait 0.25 s per phase for it; both members of the
    EP group holding ``slow_link`` take 0.25 s per phase."""
    times = {
        r: [0.002 + 0.0007 * ((r * 7 + step * 3 + k) % 5) for k in range(2)] for r in LAYOUT.ranks
    }
    for r in LAYOUT.ranks:
        ep = LAYOUT.group_along(r, (Axis.E,))
        if late is not None and late in ep and r != late:
            times[r] = [t + 0.25 for t in times[r]]
        if slow_link is not None and slow_link in ep:
            times[r] = [t + 0.25 for t in times[r]]
    return times


def _judge(
    maker: VerdictMaker, step: int, *, late: int | None = None, slow_link: int | None = None
) -> list[tuple[str, str, tuple[int, ...], str]]:
    """One round of the all_to_all series in every position peer group; the records."""
    calls = _call_times(step, late, slow_link)
    values: dict[int, dict[str, float]] = {}
    for r in LAYOUT.ranks:
        ep = LAYOUT.group_along(r, (Axis.E,))
        t_late, t_a2a = lateness([calls[m] for m in ep], ep.index(r))
        values[r] = {"t_late": t_late, "t_a2a": t_a2a, "t_call": sum(calls[r])}
    recipe = Recipe(ALL_TO_ALL, f"layers.{step % 2}.moe", step % 2)
    out = []
    for peers in LAYOUT.groups((Axis.D,)):
        results = {}
        for leaf in ("t_late", "t_a2a"):
            taus = [values[r][leaf] for r in peers]
            decision = decide_statistical(taus, KAPPA)
            surface = f"{recipe.name}/{leaf}"
            results[surface] = C3Result(
                surface, Mode.STATISTICAL, decision.status, decision.bitmap, tuple(taus), peers
            )
        outcome = RoundOutcome(recipe, step, peers, True, results, source=peers[0])
        for rec in maker.judge(outcome):
            assert rec.failure is not None
            scope = rec.scope.value if rec.scope else ""
            out.append((rec.failure.value, rec.surface.rsplit("/", 1)[1], rec.outliers, scope))
    return out


def test_lateness_is_the_entry_delay_and_t_a2a_is_shared() -> None:
    # EP 2: rank 0 entered 0.25 s late both times, so rank 1 waited in both calls.
    late, a2a = lateness([[0.002, 0.003], [0.252, 0.253]], 0)
    assert late == pytest.approx(0.5) and a2a == pytest.approx(0.005)
    assert lateness([[0.002, 0.003], [0.252, 0.253]], 1) == (0.0, a2a)
    # EP 3: one late member; both partners waited, neither is late.
    times = [[0.30, 0.30], [0.05, 0.05], [0.30, 0.30]]
    assert lateness(times, 1)[0] == pytest.approx(0.5)
    assert lateness(times, 0)[0] == lateness(times, 2)[0] == 0.0


def test_in_call_time_would_blame_the_partner_that_waited() -> None:
    """Why the rule compares lateness: the waiting partner (rank 3) has the longest time
    in the call at its EP position, and C3 on it names rank 3, the healthy rank."""
    calls = _call_times(0, late=2, slow_link=None)
    position = LAYOUT.groups((Axis.D,))[1]  # ranks 1, 3, 5, 7
    decision = decide_statistical([sum(calls[r]) for r in position], KAPPA)
    assert decision.status is Status.ATTRIBUTED
    assert [r for r, bit in zip(position, decision.bitmap, strict=True) if bit] == [3]


def test_a_late_rank_is_named_after_two_rounds_and_nobody_else() -> None:
    maker = _maker()
    assert _judge(maker, 0) == [] and _judge(maker, 1) == []
    assert _judge(maker, 2, late=2) == []  # one round is not enough
    for step in (3, 4):
        assert _judge(maker, step, late=2) == [("comm_straggler", "t_late", (2,), "rank")]
    assert _judge(maker, 5) == []  # a clean round clears the streak
    assert _judge(maker, 6, late=2) == []


def test_a_late_rank_on_alternating_rounds_is_not_confirmed() -> None:
    maker = _maker()
    for step in range(8):
        assert _judge(maker, step, late=2 if step % 2 else 5) == []


def test_a_slow_link_names_the_ep_group_not_a_rank() -> None:
    maker = _maker()
    assert _judge(maker, 0, slow_link=2) == []
    found = _judge(maker, 1, slow_link=2)
    # Each position peer group sees its member of EP group {2, 3} slow: the group,
    # group-scoped, from both sides; never a rank-scoped record.
    assert found and {f[:3] for f in found} == {("comm_straggler", "t_a2a", (2, 3))}
    assert all(f[3] != "rank" for f in found)


def test_targets_take_the_router_width_and_the_experts_dtype() -> None:
    import torch

    from scout_core.integration.discovery import discover
    from scout_core.testing.moe_models import MoESpec, TinyMoE

    model = TinyMoE((MoESpec(4, 32), MoESpec(2, 16)), dim=24).to(torch.float64)
    found = discover(model)
    targets = all_to_all_targets(found.routers, found.experts)
    assert list(targets) == ["layers.0.moe", "layers.1.moe"]
    assert {(t.width, t.dtype) for t in targets.values()} == {(24, torch.float64)}


def test_the_track_is_synthetic_and_one_rotating_series() -> None:
    from scout_core.replay.schedule import Schedule, Track

    sched = Schedule(
        layers=[],
        embedding=None,
        lm_head=None,
        optimizer=False,
        intervals={},
        recipes=(),
        variants=1,
        tracks=[Track(ALL_TO_ALL, 1, ("layers.0.moe", "layers.1.moe"))],
    )
    assert [r.path for r in (sched.due(0)[0], sched.due(1)[0])] == ["layers.0.moe", "layers.1.moe"]
    assert sched.modules_due(0) == set()  # nothing to capture: the payload is synthetic
    recipes = [Recipe(ALL_TO_ALL, f"layers.{i}.moe", i) for i in range(2)]
    assert [r.name for r in recipes] == ["all_to_all/layers.0.moe", "all_to_all/layers.1.moe"]
    # The layers' rounds form one timing series: a late rank's streak runs across them.
    assert {r.series for r in recipes} == {"all_to_all"}
