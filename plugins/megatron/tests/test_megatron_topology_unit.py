"""The Megatron mesh layout, checked against megatron-core's own RankGenerator (no ranks)."""

from __future__ import annotations

import pytest

from scout_core import MeshAddress, UnsupportedSetupError

CASES = [
    dict(world=6, tp=2),
    dict(world=8, tp=2, pp=2),
    dict(world=8, tp=2, cp=2),
    dict(world=16, tp=2, pp=2, cp=2),
    dict(world=8, ep=2),
    dict(world=16, tp=2, ep=2, pp=2),
    dict(world=16, tp=2, ep=4),
    dict(world=8, tp=2, pp=2, order="tp-cp-ep-pp-dp"),
    dict(world=12, tp=3, pp=2, order="tp-cp-ep-pp-dp"),
    dict(world=12, cp=3, pp=2),
    dict(world=8, tp=2, etp=1),  # no experts: a different expert TP is harmless
    dict(world=16, tp=2, pp=2, vpp=2),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_layout_reproduces_rank_generator_groups(megatron_core: None, case: dict) -> None:
    from scout_megatron.layout import ParallelSizes, megatron_layout, verify_with_rank_generator

    sizes = ParallelSizes(**case)
    layout = megatron_layout(sizes)  # verifies against RankGenerator itself
    verify_with_rank_generator(sizes, layout)  # and again, explicitly
    assert layout.world_size == sizes.world
    assert (layout.size("t"), layout.size("p"), layout.size("c"), layout.size("e")) == (
        sizes.tp,
        sizes.pp,
        sizes.cp,
        sizes.ep,
    )
    assert layout.size("d") * layout.size("e") == sizes.dp


def test_dp3_tp2_addresses_follow_megatron_order(megatron_core: None) -> None:
    from scout_megatron.layout import ParallelSizes, megatron_layout, peer_sets

    sizes = ParallelSizes(world=6, tp=2)
    layout = megatron_layout(sizes)
    assert [layout.address(r) for r in range(6)] == [
        MeshAddress(t=r % 2, d=r // 2) for r in range(6)
    ]
    assert layout.peer_group(3).ranks == (1, 3, 5)
    peers = peer_sets(layout, sizes, 3)
    assert peers.dense_replicas == (1, 3, 5) and peers.expert_replicas == (1, 3, 5)
    assert peers.optimizer_instance == (1, 3, 5) and peers.optimizer_instances == (3,)


def test_expert_and_dense_replicas_with_ep(megatron_core: None) -> None:
    from scout_megatron.layout import ParallelSizes, megatron_layout, peer_sets

    sizes = ParallelSizes(world=8, tp=2, ep=2)  # dense DP 4 = EP 2 x expert DP 2
    layout = megatron_layout(sizes)
    peers = peer_sets(layout, sizes, 0)
    assert peers.dense_replicas == (0, 2, 4, 6)  # Megatron's DP group
    assert peers.expert_replicas == (0, 4)  # same experts: Megatron's expert-DP group
    assert layout.peer_group(0).ranks == (0, 4)  # SCOUT's peers hold both


def test_partial_distributed_optimizer_instances(megatron_core: None) -> None:
    from scout_megatron.layout import ParallelSizes, megatron_layout, peer_sets

    sizes = ParallelSizes(world=8, tp=2, dist_opt_instances=2)  # DP 4 in 2 instances of 2
    peers = peer_sets(megatron_layout(sizes), sizes, 2)
    assert peers.dense_replicas == (0, 2, 4, 6)
    assert peers.optimizer_instance == (0, 2)
    assert peers.optimizer_instances == (2, 6)


@pytest.mark.parametrize(
    ("case", "match"),
    [
        (dict(world=8, cp=2, ep=2), "context parallel"),
        (dict(world=8, tp=2, ep=2, etp=1), "expert tensor parallel"),
        (dict(world=6, tp=4), "not divisible"),
        (dict(world=16, tp=2, pp=2, ep=2, order="tp-cp-ep-pp-dp"), "pipeline not last"),
        (dict(world=4, tp=2, order="tp-xp-dp"), "must name"),
        (dict(world=4, tp=2, order="dp-pp"), "leaves out"),
    ],
)
def test_unsupported_setups_are_refused(megatron_core: None, case: dict, match: str) -> None:
    from scout_megatron.layout import ParallelSizes, megatron_layout

    with pytest.raises(UnsupportedSetupError, match=match):
        megatron_layout(ParallelSizes(**case))
