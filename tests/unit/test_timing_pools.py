"""Timing pools and the pair's own history (scout_core.decision.pools), and how the
verdict maker judges ``t_M`` with them, without a process group."""

from __future__ import annotations

import pytest

from scout_core.decision.c3 import C3Result
from scout_core.decision.pools import (
    HISTORY,
    OwnHistory,
    PoolTiming,
    excluded,
    pool_classes,
    work_key,
)
from scout_core.replay.runner import RoundOutcome
from scout_core.replay.schedule import HIDDEN, Recipe
from scout_core.replay.verdicts import VerdictMaker
from scout_core.vocabulary import Mode, Status

FAST, SLOW = 0.01, 0.5


def _key(**change: object) -> int:
    base: dict[str, object] = {
        "kind": "hidden",
        "module_class": "Block",
        "params": [("torch.float32", (32, 16)), ("torch.float32", (16,))],
        "inputs": [["T", "torch.float32", [4, 8, 16]]],
        "device": "cpu",
    }
    base.update(change)
    return work_key(**base)  # type: ignore[arg-type]


def test_the_work_key_covers_class_shapes_inputs_dtype_kind_and_device() -> None:
    key = _key()
    assert key == _key() and 0 < key < 2**63
    assert _key(module_class="Other") != key
    assert _key(params=[("torch.float32", (32, 8)), ("torch.float32", (16,))]) != key
    assert _key(params=[("torch.bfloat16", (32, 16)), ("torch.float32", (16,))]) != key
    assert _key(inputs=[["T", "torch.float32", [4, 9, 16]]]) != key
    assert _key(kind="embedding") != key
    assert _key(device="cuda") != key


def test_a_rank_of_other_work_is_left_out_of_the_pool_with_its_reason() -> None:
    k, other = _key(), _key(module_class="Head")
    pool = PoolTiming((0, 1, 2, 3), (k, k, other, None), (FAST, FAST, FAST, None))
    assert pool_classes(pool) == [(0, 1), (2,)]
    why = excluded(pool)
    assert set(why) == {2, 3}
    assert f"{other:016x}" in why[2] and f"{k:016x}" in why[2]
    assert "nothing" in why[3]
    even = PoolTiming((0, 1, 2, 3), (k, other, k, other), (FAST,) * 4)
    assert pool_classes(even) == [(0, 2), (1, 3)]  # a tie: the class of the lowest rank


def _history() -> OwnHistory:
    return OwnHistory(rounds=2, min_excess_s=0.3, min_ratio=1.5)


def _feed(own: OwnHistory, rounds: list[tuple[float, float]]) -> list[tuple[int | None, bool]]:
    out = []
    for a, b in rounds:
        call = own.judge("hidden", ((0, a), (1, b)))
        out.append((call.named, call.joint))
    return out


def test_the_pair_names_the_rank_slower_than_its_own_history_after_two_rounds() -> None:
    own = _history()
    got = _feed(own, [(FAST, 0.02), (FAST, 0.02), (SLOW, 0.02), (SLOW, 0.02), (SLOW, 0.02)])
    assert got == [(None, False)] * 3 + [(0, False), (0, False)]
    # rank 1 is the victim just the same (the rule does not favour a position)
    own = _history()
    got = _feed(own, [(0.02, FAST), (0.02, FAST), (0.02, SLOW), (0.02, SLOW)])
    assert got[-1] == (1, False)


def test_both_slower_than_their_history_is_job_wide_and_names_no_rank() -> None:
    own = _history()
    rounds = [(FAST, FAST)] * 2 + [(3 * SLOW, 3 * SLOW)] * 4 + [(FAST, FAST)]
    got = _feed(own, rounds)
    assert [n for n, _ in got] == [None] * len(rounds)
    assert [j for _, j in got] == [False, False, False, True, False, False, False]  # once


def test_one_slow_step_and_the_first_rounds_name_no_rank() -> None:
    own = _history()
    got = _feed(own, [(FAST, FAST), (FAST, FAST), (SLOW, FAST), (FAST, FAST), (SLOW, FAST)])
    assert got == [(None, False)] * 5
    # no history yet: a rank slow from its very first round is never named
    own = _history()
    assert _feed(own, [(SLOW, FAST)] * 6) == [(None, False)] * 6


def test_a_pair_that_does_not_differ_by_the_thresholds_names_no_rank() -> None:
    # rank 0 is slower than its own (fast) history, but no slower than rank 1
    own = _history()
    got = _feed(own, [(FAST, 0.9)] * 2 + [(0.8, 0.9)] * 3)
    assert got == [(None, False)] * 5


def test_the_history_is_bounded_and_keeps_only_clean_rounds() -> None:
    own = _history()
    _feed(own, [(FAST, FAST)] * (HISTORY + 10))
    assert len(own._base[("hidden", 0)]) == HISTORY
    _feed(own, [(SLOW, FAST)] * 5)
    assert own.median("hidden", 0) == FAST  # the slow rounds never entered it


# -- the verdict maker --------------------------------------------------------------


def _maker(rounds: int = 2) -> VerdictMaker:
    return VerdictMaker(
        run_id="t",
        hosts={r: "h" for r in range(4)},
        rounds=rounds,
        min_excess_s=0.3,
        min_ratio=1.5,
        peer_kind="replica",
        kappa=5.0,
        peer_of=lambda r: (r % 2, r % 2 + 2),
    )


def _pooled(step: int, times: list[float | None], keys: list[int | None]) -> RoundOutcome:
    recipe = Recipe(HIDDEN, f"layers.{step % 2}", step % 2)
    pool = PoolTiming((0, 1, 2, 3), tuple(keys), tuple(times))
    return RoundOutcome(recipe, step, (0, 2), True, {}, source=0, pool=pool)


def _named(records: list) -> list[tuple[str, tuple[int, ...], str, tuple[int, ...]]]:
    return [
        (r.failure.value, tuple(r.outliers), r.scope.value, tuple(r.group))
        for r in records
        if r.failure is not None
    ]


def test_a_pool_of_four_names_the_slow_rank_even_in_another_peer_group() -> None:
    k = _key()
    maker = _maker()
    for step in range(2):
        assert _named(maker.judge(_pooled(step, [FAST] * 4, [k] * 4))) == []
    slow = [FAST, FAST, FAST, SLOW]  # rank 3: not in this rank's peer group (0, 2)
    assert _named(maker.judge(_pooled(2, slow, [k] * 4))) == []
    records = maker.judge(_pooled(3, slow, [k] * 4))
    # the record's group is the victim's peer group (its lowest rank writes it)
    assert _named(records) == [("straggler", (3,), "rank", (1, 3))]
    assert records[0].detail["pool"] == [0, 1, 2, 3]


def test_only_the_named_ranks_peer_group_receives_the_pools_record() -> None:
    k = _key()
    slow = [FAST, FAST, FAST, SLOW]
    for rank, expect in ((0, []), (1, [("straggler", (3,), "rank", (1, 3))])):
        maker = _maker()
        maker.rank = rank
        got = [
            _named(maker.judge(_pooled(s, [FAST] * 4 if s < 2 else slow, [k] * 4)))
            for s in range(4)
        ]
        assert got[-1] == expect, rank


def test_a_pool_judges_even_when_this_peer_group_was_not_ready() -> None:
    k = _key()
    maker = _maker(rounds=1)
    outcome = _pooled(0, [None, FAST, None, SLOW + FAST], [None, k, None, k])
    outcome.ready = False
    outcome.reason = "capture missing on some peer"
    got = _named(maker.judge(outcome))
    # two of equal work left: the pair rule, which has no history yet: nothing named
    assert got == []
    # with history, the not-ready peer group still keeps the pool's streak
    maker = _maker(rounds=1)
    for step in range(2):
        maker.judge(_pooled(step, [FAST] * 4, [k] * 4))
    outcome = _pooled(2, [FAST, FAST, FAST, SLOW], [k] * 4)
    outcome.ready = False
    assert ("straggler", (3,), "rank", (1, 3)) in _named(maker.judge(outcome))


def test_a_rank_of_other_work_is_never_compared_with_the_pool() -> None:
    k, other = _key(), _key(params=[("torch.float32", (64, 16))])
    maker = _maker()
    # rank 3 replays a bigger block, so it is slower every round: never named
    for step in range(5):
        got = _named(maker.judge(_pooled(step, [FAST, FAST, FAST, SLOW], [k, k, k, other])))
        assert got == []


def test_a_job_wide_slowdown_in_a_pool_names_no_rank() -> None:
    k = _key()
    maker = _maker()
    for step in range(2):
        maker.judge(_pooled(step, [FAST] * 4, [k] * 4))
    for step in range(2, 6):
        assert _named(maker.judge(_pooled(step, [3 * FAST] * 4, [k] * 4))) == []


def _group_of_two(step: int, times: tuple[float, float]) -> RoundOutcome:
    recipe = Recipe(HIDDEN, f"layers.{step % 2}", step % 2)
    t_m = C3Result(
        f"{recipe.name}/t_M", Mode.STATISTICAL, Status.AGREE, (False, False), times, (0, 1)
    )
    return RoundOutcome(recipe, step, (0, 1), True, {t_m.surface: t_m}, source=0)


@pytest.mark.parametrize("victim", [0, 1])
def test_a_peer_group_of_two_without_a_pool_uses_the_own_history(victim: int) -> None:
    maker = _maker()
    clean = (FAST, FAST)
    slow = (SLOW, FAST) if victim == 0 else (FAST, SLOW)
    got = [_named(maker.judge(_group_of_two(s, t))) for s, t in enumerate([clean] * 2 + [slow] * 2)]
    assert got[:3] == [[], [], []]
    assert got[3] == [("straggler", (victim,), "rank", (0, 1))]
    records = maker.judge(_group_of_two(4, (3 * SLOW, 3 * SLOW)))
    records += maker.judge(_group_of_two(5, (3 * SLOW, 3 * SLOW)))
    records += maker.judge(_group_of_two(6, (3 * SLOW, 3 * SLOW)))
    # the victim is slow against its history but not against the other any more
    assert all(not r.outliers for r in records)
