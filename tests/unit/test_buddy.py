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
from scout_core.replay.buddy import BuddyReplay, decide
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
        ship = BuddyReplay(owner, owner.peers)
        layout, payload = ship._layout(pieces), pack(OptimizerReplay.flat(pieces))
        code, sig = BuddyReplay(buddy, buddy.peers)._replayed(layout, payload)
        assert (code, sig) == (0, after), step
        # A miscomputed update: the owner's own values differ from the replay.
        assert sign([t + 1 for t in owner.replay(pieces)]) != sig


def test_a_shipment_that_does_not_fit_is_refused_naming_why() -> None:
    owner, model = _owner(torch.optim.AdamW, lr=1e-2)
    _step(owner, model, 0)
    _step(owner, model, 1)
    pieces, _, _ = owner.take()
    assert pieces
    ship = BuddyReplay(owner, owner.peers)
    layout, payload = ship._layout(pieces), pack(OptimizerReplay.flat(pieces))
    other, _ = _owner(torch.optim.AdamW, lr=2e-2)  # another learning rate
    with pytest.raises(ValueError, match="hyperparameters differ"):
        BuddyReplay(other, other.peers)._rebuild(layout, payload)
    sgd, _ = _owner(torch.optim.SGD, lr=1e-2)
    with pytest.raises(ValueError, match="optimizer classes differ"):
        BuddyReplay(sgd, sgd.peers)._rebuild(layout, payload)
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
    bad["pieces"][0][1] = 7
    with pytest.raises(ValueError, match="no optimizer 0 group 7"):
        ship._rebuild(json.dumps(bad).encode(), payload)
    # A refused shipment is a failed replay (missing evidence), never a verdict.
    assert BuddyReplay(other, other.peers)._replayed(layout, payload) == (2, None)
