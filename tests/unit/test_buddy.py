"""Buddy optimizer replay (scout_core.replay.buddy) in one process: the two-of-three rule,
the shipment's round trip (layout and payload rebuild the owner's slice, and replaying it
gives the owner's post-step values bitwise), and a shipment that does not fit refused
with the reason."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from scout_core.integration.adapter import Ownership
from scout_core.replay.buddy import BuddyReplay, _referees, decide
from scout_core.replay.optimizer import OptimizerReplay
from scout_core.replay.packing import pack, sign
from scout_core.testing.models import TinyLM


@pytest.mark.parametrize(
    ("owner", "buddy", "referee", "named"),
    [
        (1, 1, None, "none"),  # a healthy round asks no referee
        (1, 1, 2, "none"),
        (1, 2, 2, "owner"),  # the referee sides with the buddy: the owner stepped wrong
        (1, 2, 1, "buddy"),  # ... with the owner: the buddy replayed wrong
        (1, 2, 3, "inconclusive"),  # three answers: no two agree
        (1, 2, None, "inconclusive"),  # no referee (a group of two, or it failed)
    ],
)
def test_two_of_three(owner: int, buddy: int, referee: int | None, named: str) -> None:
    assert decide(owner, buddy, referee) == named


def _owner(
    cls: type[torch.optim.Optimizer], **kw: float
) -> tuple[OptimizerReplay, torch.nn.Module]:
    torch.manual_seed(0)
    model = TinyLM(dim=16, layers=2)
    opt = cls(model.parameters(), **kw)  # type: ignore[call-arg]
    peers = SimpleNamespace(ranks=(0,), pg=None)
    return (
        OptimizerReplay([opt], peers, slice_size=700, kappa=1.0, ownership=Ownership.UNIQUE),  # type: ignore[arg-type]
        model,
    )


def _step(replay: OptimizerReplay, model: torch.nn.Module, step: int) -> None:
    opt = replay.optimizers[0]
    opt.zero_grad()
    tokens = torch.randint(0, model.embed.num_embeddings, (2, 8))
    model(tokens).float().pow(2).mean().backward()
    replay.snapshot(step % replay.slices(), 0, step=step)
    opt.step()


@pytest.mark.parametrize(
    ("cls", "kw"),
    [(torch.optim.AdamW, {"lr": 1e-2}), (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9})],
)
def test_a_shipped_slice_replays_to_the_owners_post_step_values(
    cls: type[torch.optim.Optimizer], kw: dict[str, float]
) -> None:
    owner, model = _owner(cls, **kw)
    buddy, _ = _owner(cls, **kw)  # same class and hyperparameters, other tensors
    for step in range(4):
        _step(owner, model, step)
        pieces, after, _ = owner.take()
        assert pieces
        ship = BuddyReplay(owner, owner.peers, None, (0,))
        layout, payload = ship._layout(pieces), pack(OptimizerReplay.flat(pieces))
        code, sig = BuddyReplay(buddy, buddy.peers, None, (0,))._replayed(layout, payload)
        assert (code, sig) == (0, after), step
        # A miscomputed update: the owner's own values differ from the replay.
        assert sign([t + 1 for t in owner.replay(pieces)]) != sig


def test_a_shipment_that_does_not_fit_is_refused_naming_why() -> None:
    owner, model = _owner(torch.optim.AdamW, lr=1e-2)
    _step(owner, model, 0)
    _step(owner, model, 1)
    pieces, _, _ = owner.take()
    assert pieces
    ship = BuddyReplay(owner, owner.peers, None, (0,))
    layout, payload = ship._layout(pieces), pack(OptimizerReplay.flat(pieces))
    other, _ = _owner(torch.optim.AdamW, lr=2e-2)  # another learning rate
    with pytest.raises(ValueError, match="hyperparameters of optimizer 0 group 0 differ"):
        BuddyReplay(other, other.peers, None, (0,))._rebuild(layout, payload)
    sgd, _ = _owner(torch.optim.SGD, lr=1e-2)
    with pytest.raises(ValueError, match="optimizer classes differ"):
        BuddyReplay(sgd, sgd.peers, None, (0,))._rebuild(layout, payload)
    with pytest.raises(ValueError, match="payload has"):
        ship._rebuild(layout, payload[:-4])
    bad = json.loads(layout)
    bad["pieces"][0][2][0][2] = "pickle"
    with pytest.raises(ValueError, match="unknown dtype 'pickle'"):
        ship._rebuild(json.dumps(bad).encode(), payload)
    bad = json.loads(layout)
    bad["pieces"][0][2][0][1] = [10**12]  # refused by size, before any allocation
    with pytest.raises(ValueError, match="payload has"):
        ship._rebuild(json.dumps(bad).encode(), payload)
    bad = json.loads(layout)
    bad["groups"][0][1] = 9
    with pytest.raises(ValueError, match="no optimizer 0 group 9 here"):
        ship._rebuild(json.dumps(bad).encode(), payload)
    bad = json.loads(layout)
    bad["pieces"][0][1] = 7
    with pytest.raises(ValueError, match="no optimizer 0 group 7"):
        ship._rebuild(json.dumps(bad).encode(), payload)
    # A refused shipment is a failed replay (missing evidence), never a verdict.
    assert BuddyReplay(other, other.peers, None, (0,))._replayed(layout, payload) == (2, None)


def _words(groups: list[list[int]], differ: set[int]) -> dict[int, list[int]]:
    """Job-wide words ``[code, sig, group id, position, size, ...]``; ``differ``: the
    buddies whose replay differs from their owner's values."""
    return {
        r: [1 if r in differ else 0, 0, g[0], i, len(g), 1, 10, 10]
        for g in groups
        for i, r in enumerate(g)
    }


def test_the_referee_is_the_rank_after_the_buddy_or_in_a_pair_the_next_groups() -> None:
    # a group of four: rank 6's buddy 7 differs; the referee is the rank after 7
    assert _referees(_words([[4, 5, 6, 7]], {7})) == {6: 4}
    # pipeline 2 stages x DP 2: owner 1 (buddy 0 differs) is refereed by rank 3, at the
    # same position in the other stage, and owner 2 (buddy 3) by rank 0
    assert _referees(_words([[0, 1], [2, 3]], {0, 3})) == {1: 3, 2: 0}
    # groups of unequal sizes that map two owners onto one referee: only the lowest owner
    # keeps it (a referee receives one shipment), on every rank alike
    # (owner 0's pair referee is rank 2, at its position in the next group; owner 3's
    # referee in its group of three is rank 2 too)
    assert _referees(_words([[0, 1], [2, 3, 4]], {1, 4})) == {0: 2}
    words = _words([[0, 1], [2, 3]], {0, 2})  # owners 1 and 3 -> referees 3 and 1
    assert _referees(words) == {1: 3, 3: 1}
    # one pair alone: nobody can referee
    assert _referees(_words([[0, 1]], {0})) == {}
    assert _referees(_words([[0, 1], [2, 3]], set())) == {}
