"""Collective fingerprints: what is compared, what is left out, and the reversible patch."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.distributed as dist

from scout_core.observer.fingerprint import (
    COLLECTIVES,
    describe,
    fingerprint,
    install_collective_fingerprints,
)


class Sink:
    def __init__(self) -> None:
        self.events: list[object] = []

    def enter_collective(self, fp: tuple[int, int, int], peer: int | None = None) -> None:
        self.events.append(fp)

    def exit_collective(self) -> None:
        self.events.append("exit")


def fp(name: str, *args: object, **kwargs: object) -> tuple[int, int, int]:
    return fingerprint(name, args, dict(kwargs))


def test_equal_calls_give_equal_fingerprints_and_positional_equals_keyword() -> None:
    a = fp("all_reduce", torch.ones(4, 2))
    assert a == fp("all_reduce", torch.zeros(4, 2))  # values are not compared
    assert a == fp("all_reduce", tensor=torch.ones(4, 2), op=dist.ReduceOp.SUM)
    assert describe(a)["collective"] == "all_reduce"


@pytest.mark.parametrize(
    ("left", "right"),
    [
        (("all_reduce", (torch.ones(4),), {}), ("all_reduce", (torch.ones(5),), {})),
        (("all_reduce", (torch.ones(4),), {}), ("all_reduce", (torch.ones(2, 2),), {})),
        (("all_reduce", (torch.ones(4),), {}), ("all_reduce", (torch.ones(4).double(),), {})),
        (("all_reduce", (torch.ones(4),), {}), ("broadcast", (torch.ones(4), 0), {})),
        (
            ("all_reduce", (torch.ones(4),), {}),
            ("all_reduce", (torch.ones(4),), {"op": dist.ReduceOp.MAX}),
        ),
        (("broadcast", (torch.ones(4), 0), {}), ("broadcast", (torch.ones(4), 1), {})),
        (("reduce", (torch.ones(4), 0), {}), ("reduce", (torch.ones(4), 2), {})),
    ],
)
def test_type_shape_dtype_reduction_and_root_are_compared(
    left: tuple[str, tuple[object, ...], dict[str, object]],
    right: tuple[str, tuple[object, ...], dict[str, object]],
) -> None:
    assert fingerprint(*left) != fingerprint(*right)


def test_rank_dependent_arguments_are_excluded() -> None:
    # all_to_all_single: uneven splits change the leading dimension on each rank
    a = fp("all_to_all_single", torch.empty(6, 3), torch.ones(5, 3), [2, 2, 2], [1, 2, 2])
    b = fp("all_to_all_single", torch.empty(4, 3), torch.ones(7, 3), [1, 1, 2], [3, 2, 2])
    assert a == b
    assert a != fp("all_to_all_single", torch.empty(4, 2), torch.ones(7, 2))
    # all_to_all lists: per-peer chunk sizes differ, count and trailing dims do not
    assert fp("all_to_all", [torch.empty(1, 3)] * 3, [torch.ones(2, 3)] * 3) == fp(
        "all_to_all", [torch.empty(4, 3)] * 3, [torch.ones(5, 3)] * 3
    )
    # point-to-point: a send and the matching recv look alike, peers excluded
    assert fp("send", torch.ones(3), 1) == fp("recv", torch.ones(3), 0)
    assert fp("isend", torch.ones(3), dst=2) == fp("irecv", torch.ones(3), src=1)


def test_aliases_share_a_code_and_every_op_has_one() -> None:
    x, out = torch.ones(2), torch.empty(8)
    assert fp("all_gather_into_tensor", out, x) == fp("all_gather_single", out, x)
    assert fp("reduce_scatter_tensor", x, out) == fp("reduce_scatter_single", x, out)
    codes = {spec.code for spec in COLLECTIVES.values()}
    assert all(0 < c < (1 << 15) for c in codes)  # fits the top bits of an int64 word


def test_words_are_non_negative_int64() -> None:
    for words in (
        fp("all_reduce", torch.ones(3)),
        fp("barrier"),
        fp("broadcast", torch.ones(1), 7),
    ):
        assert all(0 <= w < (1 << 63) for w in words)


def test_patch_publishes_before_and_after_and_restores() -> None:
    original = dist.all_reduce
    original_c10d = dist.distributed_c10d.all_reduce
    sink = Sink()
    close = install_collective_fingerprints(sink)
    try:
        assert dist.all_reduce is not original
        assert dist.distributed_c10d.all_reduce is dist.all_reduce
        assert dist.all_reduce.__wrapped__ is original  # functools.wraps keeps the docs
        with pytest.raises((ValueError, RuntimeError)):  # no process group in unit tests
            dist.all_reduce(torch.ones(3))
        assert sink.events == [fp("all_reduce", torch.ones(3)), "exit"]
    finally:
        close()
    close()  # twice is harmless
    assert dist.all_reduce is original
    assert dist.distributed_c10d.all_reduce is original_c10d


def test_nested_collectives_publish_once_and_two_sinks_share_one_patch() -> None:
    original = dist.all_gather_into_tensor
    a, b = Sink(), Sink()
    close_a = install_collective_fingerprints(a)
    close_b = install_collective_fingerprints(b)
    try:
        patched = dist.all_gather_into_tensor
        # all_gather_into_tensor calls the (patched) all_gather_single internally
        with pytest.raises((ValueError, RuntimeError)), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch 2.13 deprecates the old name
            dist.all_gather_into_tensor(torch.empty(4), torch.ones(2))
        assert len(a.events) == 2 and a.events[1] == "exit"
        assert describe(a.events[0])["collective"] == "all_gather_single"  # type: ignore[arg-type]
        assert a.events == b.events
        close_a()
        assert dist.all_gather_into_tensor is patched  # b still needs it
    finally:
        close_a()
        close_b()
    assert dist.all_gather_into_tensor is original
