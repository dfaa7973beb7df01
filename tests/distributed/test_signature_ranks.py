"""Signatures agree across processes: every rank signs the same seeded tensor alike.

Each rank is a fresh interpreter (its own ``hash()`` seed, allocator state and
thread pool), builds the tensor from a shared seed, signs it and exchanges the
signature as int64 over a diagnostic Gloo group (never WORLD). The parent process
signs the same tensor too, so agreement is checked against a fourth party.
"""

from __future__ import annotations

import pytest
import torch

from scout_core.testing.harness import run_ranks

pytestmark = pytest.mark.distributed

SEED = 20260811
FLIP_BYTE = 3 * 4096 + 517  # row 3 of the fold layout, a mid-word byte


def make_tensor(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(100, 100, generator=g).to(torch.bfloat16)  # 20000 bytes, 5 rows


def sign_and_gather(seed: int, flip_rank: int) -> dict[str, object]:
    """Rank body: sign the seeded tensor (one rank flips a bit first), all-gather."""
    import os

    import torch.distributed as dist

    from scout_core.decision.signature import from_int64, signature, to_int64

    rank = int(os.environ["RANK"])
    world = dist.get_world_size()
    t = make_tensor(seed)
    if rank == flip_rank:
        raw = t.view(-1).view(torch.uint8)
        raw[FLIP_BYTE] ^= 1 << 6
    sig = signature(t)
    group = dist.new_group(list(range(world)), backend="gloo")
    mine = torch.tensor([to_int64(sig)], dtype=torch.int64)
    gathered = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(gathered, mine, group=group)
    dist.destroy_process_group(group)
    return {
        "rank": rank,
        "signature": str(sig),  # JSON numbers above 2**53 are not portable; keep text
        "gathered": [str(from_int64(int(g.item()))) for g in gathered],
    }


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world_size", [3, 4])
def test_every_rank_computes_the_same_signature(world_size: int) -> None:
    from scout_core.decision.signature import signature

    expected = str(signature(make_tensor(SEED)))
    results = run_ranks(sign_and_gather, world_size, args=(SEED, -1), timeout_s=90)
    assert [r["rank"] for r in results] == list(range(world_size))
    assert all(r["signature"] == expected for r in results)
    assert all(r["gathered"] == [expected] * world_size for r in results)


@pytest.mark.timeout(120)
def test_one_flipped_bit_singles_out_its_rank() -> None:
    from scout_core.decision.signature import signature

    world_size, flip_rank = 4, 2
    expected = str(signature(make_tensor(SEED)))
    results = run_ranks(sign_and_gather, world_size, args=(SEED, flip_rank), timeout_s=90)
    view = results[0]["gathered"]
    assert all(r["gathered"] == view for r in results)  # everyone sees the same vector
    for rank, sig in enumerate(view):
        if rank == flip_rank:
            assert sig != expected
        else:
            assert sig == expected
    assert results[flip_rank]["signature"] == view[flip_rank]
