"""C3 exchange across real Gloo ranks: attribution, independence of surfaces,
identical results everywhere, fail-closed on missing evidence, groups of two,
layout mismatches and exactly one collective per exchange.

Rank bodies live at module level (ranks are fresh processes that import them by
name) and return ``C3Result.as_dict()`` so the test can compare every peer's view.
"""

from __future__ import annotations

from typing import Any

import pytest

from scout_core.decision.c3 import ROW_WORDS
from scout_core.testing.harness import run_ranks

pytestmark = pytest.mark.distributed


# --------------------------------------------------------------------------- rank bodies


def _signature(t: Any) -> int:
    """The real 64-bit tensor signature exact C3 compares (dtype, shape and bytes)."""
    from scout_core.decision.signature import signature

    return signature(t)  # unsigned, often >= 2**63: exercises the two's-complement wire


def _layer_output(corrupt: bool) -> Any:
    import torch

    out = torch.linspace(-1.0, 1.0, 16, dtype=torch.float32)
    if corrupt:  # a single flipped mantissa bit, the SDC a signature must catch
        out.view(torch.int32)[5] ^= 1
    return out


def _views(results: dict[str, Any]) -> dict[str, Any]:
    return {name: r.as_dict() for name, r in results.items()}


def attribute_body(group_ranks: list[int], order: list[int], bad: int) -> Any:
    import torch.distributed as dist

    from scout_core.decision.c3 import Surface, exchange
    from scout_core.vocabulary import Mode

    group = dist.new_group(group_ranks, backend="gloo")  # collective over WORLD: all ranks
    me = dist.get_rank()
    if me not in group_ranks:
        return None
    sig = _signature(_layer_output(corrupt=me == bad))
    results = exchange([Surface("layer/out", Mode.EXACT, sig)], group=group, ranks=order)
    return _views(results)


def mixed_body() -> Any:
    import torch.distributed as dist

    from scout_core.decision.c3 import Surface, exchange
    from scout_core.vocabulary import Mode

    me, world = dist.get_rank(), dist.get_world_size()
    group = dist.new_group(list(range(world)), backend="gloo")
    t_m = [0.100, 0.500, 0.101, 0.099, 0.100][me]  # rank 1 is a compute straggler
    t_gather = [0.020, 0.021, 0.019, 0.020, 0.020][me]  # healthy jitter only
    surfaces = [
        Surface("layer/out", Mode.EXACT, _signature(_layer_output(corrupt=me == 3))),
        Surface("layer/t_M", Mode.STATISTICAL, t_m),
        Surface("layer/t_gather", Mode.STATISTICAL, t_gather),
        Surface("collective", Mode.EXACT, [7, 2**64 - 1, -3, 42], width=4),
        Surface("layer/grad", Mode.EXACT, None if me == 2 else 0xFEED),
    ]
    return _views(exchange(surfaces, group=group, ranks=list(range(world)), kappa=5.0))


def pairs_body() -> Any:
    import torch.distributed as dist

    from scout_core.decision.c3 import Surface, exchange
    from scout_core.vocabulary import Mode

    me = dist.get_rank()
    pairs = [[0, 1], [2, 3]]
    groups = [dist.new_group(p, backend="gloo") for p in pairs]
    mine = 0 if me < 2 else 1
    # pair {0, 1} disagrees; pair {2, 3} agrees
    value = 100 + me if mine == 0 else 55
    surfaces = [Surface("s", Mode.EXACT, value), Surface("t", Mode.STATISTICAL, 1.0 + me)]
    return _views(exchange(surfaces, group=groups[mine], ranks=pairs[mine]))


def mismatch_body() -> Any:
    import torch.distributed as dist

    from scout_core.decision.c3 import Surface, exchange
    from scout_core.errors import ProtocolError
    from scout_core.vocabulary import Mode

    me, world = dist.get_rank(), dist.get_world_size()
    ranks = list(range(world))
    group = dist.new_group(ranks, backend="gloo")
    odd = me == 1
    cases: dict[str, tuple[list[Surface], float, list[int]]] = {
        # same widths, a different name: same row content size, different hash
        "name": ([Surface("b" if odd else "a", Mode.EXACT, 1)], 5.0, ranks),
        # a different width: a layout-sized row would make Gloo abort the process
        "width": (
            [
                Surface("a", Mode.EXACT, [1, 1, 1, 1], width=4)
                if odd
                else Surface("a", Mode.EXACT, 1)
            ],
            5.0,
            ranks,
        ),
        "mode": ([Surface("a", Mode.STATISTICAL if odd else Mode.EXACT, 1)], 5.0, ranks),
        "kappa": ([Surface("a", Mode.STATISTICAL, 1.0)], 3.0 if odd else 5.0, ranks),
        "order": ([Surface("a", Mode.EXACT, 1)], 5.0, ranks[::-1] if odd else ranks),
        "extra": (
            [Surface("a", Mode.EXACT, 1)] + ([Surface("z", Mode.EXACT, 2)] if odd else []),
            5.0,
            ranks,
        ),
    }
    outcome: dict[str, str] = {}
    for name, (surfaces, kappa, order) in cases.items():
        try:
            exchange(surfaces, group=group, ranks=order, kappa=kappa)
            outcome[name] = "no error"
        except ProtocolError as e:
            outcome[name] = "ProtocolError" if "layout mismatch" in str(e) else str(e)
    # the group still works after the mismatches
    ok = exchange([Surface("a", Mode.EXACT, 1)], group=group, ranks=ranks)
    outcome["after"] = ok["a"].status.value
    return outcome


def one_collective_body() -> Any:
    import torch.distributed as dist

    from scout_core.decision.c3 import ROW_WORDS, Surface, exchange
    from scout_core.vocabulary import Mode

    me, world = dist.get_rank(), dist.get_world_size()
    group = dist.new_group(list(range(world)), backend="gloo")
    calls: dict[str, int] = {}

    def counting(name: str) -> Any:
        real = getattr(dist, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls[name] = calls.get(name, 0) + 1
            return real(*args, **kwargs)

        return wrapper

    watched = [
        "all_gather_single",
        "all_gather_into_tensor",
        "all_gather",
        "all_gather_object",
        "all_reduce",
        "broadcast",
        "broadcast_object_list",
        "barrier",
        "gather",
        "scatter",
        "reduce_scatter_tensor",
    ]
    originals = {name: getattr(dist, name) for name in watched if hasattr(dist, name)}
    for name in originals:
        setattr(dist, name, counting(name))
    try:
        surfaces = [Surface(f"s{i}", Mode.EXACT, i * 1000 + (me == 2)) for i in range(8)]
        surfaces.append(Surface("t", Mode.STATISTICAL, 0.1))
        first = exchange(surfaces, group=group, ranks=list(range(world)))
        after_first = dict(calls)
        exchange(surfaces, group=group, ranks=list(range(world)))
        after_second = dict(calls)
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)

    errors: dict[str, str] = {}
    bad_calls: list[tuple[str, Any]] = [
        ("world", lambda: exchange(surfaces, group=dist.group.WORLD, ranks=list(range(world)))),
        ("none", lambda: exchange(surfaces, group=None, ranks=list(range(world)))),  # type: ignore[arg-type]
        ("subset", lambda: exchange(surfaces, group=group, ranks=list(range(world - 1)))),
        ("empty", lambda: exchange([], group=group, ranks=list(range(world)))),
        ("dupe", lambda: exchange(surfaces[:1] * 2, group=group, ranks=list(range(world)))),
        ("kappa", lambda: exchange(surfaces, group=group, ranks=list(range(world)), kappa=0)),
        (
            "too_wide",
            lambda: exchange(
                [Surface("w", Mode.EXACT, [0] * ROW_WORDS, width=ROW_WORDS)],
                group=group,
                ranks=list(range(world)),
            ),
        ),
    ]
    outsiders = dist.new_group([0, 1, 2], backend="gloo")
    if me == 3:
        bad_calls.append(("outsider", lambda: exchange(surfaces, group=outsiders, ranks=[0, 1, 2])))
    for name, call in bad_calls:
        try:
            call()
            errors[name] = "no error"
        except ValueError as e:
            errors[name] = f"ValueError: {e}"
    if me != 3:  # the outsider must not have started the collective on {0, 1, 2}
        errors["outsider"] = "n/a"
    dist.barrier(group=group)  # validation errors must leave no collective half-started
    return {
        "first": after_first,
        "second": after_second,
        "bitmaps": {k: v.bitmap for k, v in first.items()},
        "errors": errors,
    }


# --------------------------------------------------------------------------- tests


def _assert_identical(per_rank: list[Any]) -> Any:
    views = [v for v in per_rank if v is not None]
    assert views, "no rank returned a result"
    for v in views[1:]:
        assert v == views[0]
    return views[0]


@pytest.mark.timeout(120)
def test_exact_c3_attributes_the_corrupted_rank_in_a_subset_group() -> None:
    group_ranks = [1, 2, 4, 5]
    order = [5, 1, 4, 2]  # the caller's order, not the group's, names bitmap positions
    # rank 5 is last in the group's own order and first in the caller's
    per_rank = run_ranks(attribute_body, 6, args=(group_ranks, order, 5), timeout_s=90)
    assert [v is None for v in per_rank] == [True, False, False, True, False, False]
    view = _assert_identical(per_rank)["layer/out"]
    assert view["status"] == "attributed"
    assert view["ranks"] == order
    assert view["bitmap"] == [True, False, False, False]
    assert view["outliers"] == [5]
    healthy = _signature(_layer_output(corrupt=False))
    assert view["evidence"][1] == view["evidence"][2] == view["evidence"][3] == healthy
    assert view["evidence"][0] == _signature(_layer_output(corrupt=True)) != healthy


@pytest.mark.timeout(120)
def test_surfaces_in_one_exchange_keep_independent_bitmaps() -> None:
    per_rank = run_ranks(mixed_body, 5, timeout_s=90)
    view = _assert_identical(per_rank)  # every peer derived the identical results
    assert list(view) == ["layer/out", "layer/t_M", "layer/t_gather", "collective", "layer/grad"]
    out, t_m, t_gather = view["layer/out"], view["layer/t_M"], view["layer/t_gather"]
    assert (out["status"], out["outliers"]) == ("attributed", [3])
    assert (t_m["status"], t_m["outliers"]) == ("attributed", [1])
    assert t_m["evidence"] == [0.100, 0.500, 0.101, 0.099, 0.100]
    assert (t_gather["status"], t_gather["bitmap"]) == ("agree", [False] * 5)
    fp = view["collective"]
    assert fp["status"] == "agree"
    assert fp["evidence"] == [[7, 2**64 - 1, 2**64 - 3, 42]] * 5  # unsigned words back
    # rank 2 had no gradient evidence: inconclusive everywhere, nobody blamed
    grad = view["layer/grad"]
    assert grad["status"] == "inconclusive"
    assert grad["bitmap"] == [False] * 5
    assert grad["evidence"] == [0xFEED, 0xFEED, None, 0xFEED, 0xFEED]


@pytest.mark.timeout(120)
def test_groups_of_two_never_pick_a_side() -> None:
    per_rank = run_ranks(pairs_body, 4, timeout_s=90)
    assert per_rank[0] == per_rank[1]
    assert per_rank[2] == per_rank[3]
    split, same = per_rank[0], per_rank[2]
    assert (split["s"]["status"], split["s"]["bitmap"]) == ("inconclusive", [False, False])
    assert split["s"]["evidence"] == [100, 101]
    # two timings 1 apart are symmetric around their median: nobody is an outlier
    assert (split["t"]["status"], split["t"]["bitmap"]) == ("agree", [False, False])
    assert (same["s"]["status"], same["s"]["ranks"]) == ("agree", [2, 3])


@pytest.mark.timeout(120)
def test_layout_mismatch_raises_protocol_error_on_every_rank() -> None:
    per_rank = run_ranks(mismatch_body, 4, timeout_s=90)
    for outcome in per_rank:
        assert outcome == {
            "name": "ProtocolError",
            "width": "ProtocolError",
            "mode": "ProtocolError",
            "kappa": "ProtocolError",
            "order": "ProtocolError",
            "extra": "ProtocolError",
            "after": "agree",
        }


@pytest.mark.timeout(120)
def test_exchange_is_exactly_one_collective_and_validates_first() -> None:
    per_rank = run_ranks(one_collective_body, 4, timeout_s=90)
    for rank, v in enumerate(per_rank):
        assert v["first"] == {"all_gather_single": 1}, v
        assert v["second"] == {"all_gather_single": 2}, v
        assert v["bitmaps"]["s3"] == [False, False, True, False]
        assert v["bitmaps"]["t"] == [False] * 4
        errors = v["errors"]
        assert errors["world"].startswith("ValueError: C3 refuses the WORLD group")
        assert errors["none"].startswith("ValueError: C3 refuses the WORLD group")
        assert "do not match the group's ranks" in errors["subset"]
        assert "at least one surface" in errors["empty"]
        assert "unique" in errors["dupe"]
        assert "kappa" in errors["kappa"]
        assert f"{ROW_WORDS}-word C3 row" in errors["too_wide"]
        if rank == 3:
            assert "not a member" in errors["outsider"]
