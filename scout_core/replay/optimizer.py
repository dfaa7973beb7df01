"""Optimizer replay: re-run the update on a rotating slice and compare it across replicas.

Contract: :meth:`OptimizerReplay.snapshot` (a step pre-hook) clones one rotating slice of
``optimizer_slice`` elements (parameter, reduced gradient, slots, hyperparameters), and
:meth:`OptimizerReplay.run` after the step compares each peer's own pre-step slice
(``optimizer/slice``), its replayed update (``optimizer/update``) and its own post-step slice
(``optimizer/result``) across the replica peers. A healthy round is one exchange on the peer
group and moves no payload; only where the peers' slices differ does the source broadcast its
slice (``optimizer/received``, ``t_bcast``) for a second exchange. Live training state is only
read. Uniquely owned state (pure FSDP, ZeRO 1-3) is compared by :mod:`.buddy` instead, from
the same snapshot. docs/replay.md, "What is compared, and with whom".
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from scout_core.decision.c3 import Surface, exchange
from scout_core.integration.adapter import Ownership
from scout_core.replay import control
from scout_core.replay.packing import pack, sign, unpack
from scout_core.replay.runner import RoundOutcome, payload_device, timed_broadcast
from scout_core.replay.schedule import OPTIMIZER, Recipe
from scout_core.topology.groups import PeerGroup
from scout_core.topology.shards import local_shard
from scout_core.vocabulary import Mode, Status

__all__ = ["OptimizerReplay", "Piece", "hyperparameters"]

log = logging.getLogger(__name__)

_SLICE = "optimizer/slice"
"""Each peer's own pre-step slice: replicated state is bitwise equal across peers."""
_UPDATE = "optimizer/update"
"""The update replayed on one and the same pre-step slice."""


@dataclass
class Piece:
    """One parameter's part of the slice."""

    optimizer: int
    group: int
    param: torch.Tensor
    grad: torch.Tensor
    slots: dict[str, torch.Tensor]
    """Same-shape slots sliced like the parameter; scalar slots (``step``) whole."""


class OptimizerReplay:
    """Snapshot before the step, replay and compare after it."""

    def __init__(
        self,
        optimizers: Sequence[torch.optim.Optimizer],
        peers: PeerGroup,
        *,
        slice_size: int,
        kappa: float,
        ownership: Ownership,
    ) -> None:
        self.optimizers = list(optimizers)
        self.peers = peers
        self.slice_size = slice_size
        self.kappa = kappa
        self.ownership = ownership
        self._pieces: list[Piece] | None = None
        self._taken: list[tuple[int, torch.Tensor, slice]] = []
        """(optimizer, parameter, flat range) of each snapshot piece, for its post-step values."""
        self._index = 0
        self._snap_step = -1

    @property
    def supported(self) -> bool:
        """Replica peers hold the same state (else :mod:`.buddy` runs the recipe)."""
        return self.ownership is not Ownership.UNIQUE

    def _params(self) -> Iterator[tuple[int, int, torch.Tensor]]:
        for oi, opt in enumerate(self.optimizers):
            for gi, group in enumerate(opt.param_groups):
                for p in group["params"]:
                    yield oi, gi, p

    def slices(self) -> int:
        """How many slices one rotation over the local parameters has."""
        total = sum(local_shard(p).numel() for _, _, p in self._params())
        return max(1, -(-total // self.slice_size))

    def _spans(self, which: int | None = None) -> Iterator[tuple[int, int, torch.Tensor, slice]]:
        """(optimizer, group, parameter, flat range) of the current slice's parameters
        that have a gradient; only optimizer ``which`` when given."""
        lo = self._index * self.slice_size
        hi = lo + self.slice_size
        at = 0
        for oi, gi, p in self._params():
            n = local_shard(p).numel()
            a, b = max(lo, at), min(hi, at + n)
            at += n
            if a >= b or p.grad is None or (which is not None and oi != which):
                continue
            yield oi, gi, p, slice(a - (at - n), b - (at - n))

    def snapshot(self, index: int, which: int = 0, *, step: int = 0) -> None:
        """Clone optimizer ``which``'s part of slice ``index`` at iteration ``step`` (its pre-step
        hook at its first step of the iteration); one iteration's parts add up to the slice."""
        if (index, step) != (self._index, self._snap_step) or self._pieces is None:
            self._index, self._snap_step = index, step
            self._pieces, self._taken = [], []
        for oi, gi, p, flat in self._spans(which):
            self._taken.append((oi, p, flat))
            local = local_shard(p)
            n = local.numel()
            state = self.optimizers[oi].state.get(p, {})
            slots: dict[str, torch.Tensor] = {}
            for key, value in state.items():
                if not isinstance(value, torch.Tensor):
                    continue
                v = local_shard(value)
                if v.numel() == n:
                    slots[key] = v.detach().reshape(-1)[flat].clone()
                elif v.numel() == 1:
                    slots[key] = v.detach().clone()
            self._pieces.append(
                Piece(
                    oi,
                    gi,
                    local.detach().reshape(-1)[flat].clone(),
                    local_shard(p.grad).detach().reshape(-1)[flat].clone(),  # type: ignore[arg-type]  # _spans skips grad None
                    slots,
                )
            )

    def run(self, step: int, *, counts: control.Counts | None = None) -> RoundOutcome | None:
        """Replay and compare the snapshot taken before this step; None when skipped.
        ``counts``: this rank's control-flow counts since the last round."""
        if not self.supported:
            return None
        pieces, self._pieces = self._pieces, None
        recipe = Recipe(OPTIMIZER, None, self._index)
        own_before = None if pieces is None else sign(self.flat(pieces))
        after = sign(self._after())
        # Optimistically, each peer replays its own slice before the one exchange: where
        # every peer's slice agrees that is the source's bytes (docs/replay.md).
        update = None if pieces is None else self._signed_update(pieces)
        ready = [
            Surface("optimizer/ready", Mode.EXACT, self._digest(pieces, step)),
            Surface(_SLICE, Mode.EXACT, own_before),
            *control.surfaces("optimizer", counts),
        ]
        first = exchange(
            [
                *ready,
                Surface(_UPDATE, Mode.EXACT, update),
                Surface("optimizer/result", Mode.EXACT, after),
            ],
            group=self.peers.pg,
            ranks=self.peers.ranks,
            kappa=self.kappa,
        )
        split = control.diverged("optimizer", first)
        if split or first["optimizer/ready"].status is not Status.AGREE or pieces is None:
            # Slices of peers that are not at the same point are not comparable: the
            # round reads inconclusive, never a verdict on the slice or the update.
            checked = {s.name: first[s.name] for s in ready if s.name != _SLICE}
            reason = "control flow diverged" if split else "optimizer snapshot differs"
            return RoundOutcome(recipe, step, self.peers.ranks, False, checked, reason)
        if first[_SLICE].status is Status.AGREE:
            return RoundOutcome(recipe, step, self.peers.ranks, True, first)
        # The peers' slices differ: every peer replays the source's (a second exchange).
        src = self.peers.ranks[step % len(self.peers.ranks)]
        received, t_bcast = self._broadcast(pieces, src)
        results = exchange(
            [
                Surface("optimizer/received", Mode.EXACT, sign(self.flat(received))),
                Surface("optimizer/t_bcast", Mode.STATISTICAL, t_bcast),
                Surface(_UPDATE, Mode.EXACT, self._signed_update(received)),
            ],
            group=self.peers.pg,
            ranks=self.peers.ranks,
            kappa=self.kappa,
        )
        return RoundOutcome(recipe, step, self.peers.ranks, True, {**first, **results}, source=src)

    def _signed_update(self, pieces: list[Piece]) -> int | None:
        """The signature of the replayed update of ``pieces``; None when it failed."""
        try:
            return sign(self.replay(pieces))
        except Exception as exc:  # evidence goes missing; peers read inconclusive
            log.warning("optimizer replay failed on this rank: %s", exc)
            return None

    def _digest(self, pieces: list[Piece] | None, step: int) -> int | None:
        if pieces is None:
            return None
        meta = {
            "step": step,
            "index": self._index,
            "cls": [type(o).__qualname__ for o in self.optimizers],
            "pieces": [
                [
                    pc.optimizer,
                    pc.group,
                    pc.param.numel(),
                    str(pc.param.dtype),
                    sorted([k, str(v.dtype), v.numel()] for k, v in pc.slots.items()),
                ]
                for pc in pieces
            ],
            "hyper": [[hyperparameters(g) for g in o.param_groups] for o in self.optimizers],
        }
        text = json.dumps(meta, sort_keys=True, separators=(",", ":"))
        return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")

    @staticmethod
    def flat(pieces: list[Piece]) -> list[torch.Tensor]:
        out: list[torch.Tensor] = []
        for pc in pieces:
            out += [pc.param, pc.grad] + [pc.slots[k] for k in sorted(pc.slots)]
        return out

    def take(self) -> tuple[list[Piece] | None, int | None, int]:
        """The snapshot (consumed), the signature of its slice's post-step values, the index."""
        pieces, self._pieces = self._pieces, None
        after = None if pieces is None else sign(self._after(self._taken))
        return pieces, after, self._index

    def max_bytes(self) -> int:
        """A bound on a shipped slice's bytes: eight 8-byte tensors of the slice, plus scalars."""
        return 64 * self.slice_size + (1 << 16)

    def _after(
        self, taken: list[tuple[int, torch.Tensor, slice]] | None = None
    ) -> list[torch.Tensor]:
        """This peer's own post-step values of the same slice (parameter and slots): of
        the snapshot's pieces when ``taken`` is given (a framework may drop the gradients
        after its step), else of the current slice's."""
        out: list[torch.Tensor] = []
        spans = taken if taken is not None else [(oi, p, f) for oi, _, p, f in self._spans()]
        for oi, p, flat in spans:
            local = local_shard(p)
            out.append(local.detach().reshape(-1)[flat])
            state = self.optimizers[oi].state.get(p, {})
            for key in sorted(state):
                v = state[key]
                if not isinstance(v, torch.Tensor):
                    continue
                v = local_shard(v)
                if v.numel() == local.numel():
                    out.append(v.detach().reshape(-1)[flat])
        return out

    def _broadcast(self, pieces: list[Piece], src: int) -> tuple[list[Piece], float]:
        flat = self.flat(pieces)
        buf = pack(flat, device=payload_device(self.peers, flat))
        t_bcast = timed_broadcast(buf, src, self.peers)
        got = iter(unpack(buf, flat))
        out: list[Piece] = []
        for pc in pieces:
            param, grad = next(got), next(got)
            slots = {k: next(got) for k in sorted(pc.slots)}
            out.append(Piece(pc.optimizer, pc.group, param, grad, slots))
        return out, t_bcast

    def replay(self, pieces: list[Piece]) -> list[torch.Tensor]:
        """Apply each piece's optimizer class to copies of the slice; the updated values."""
        out: list[torch.Tensor] = []
        for oi, opt in enumerate(self.optimizers):
            mine = [pc for pc in pieces if pc.optimizer == oi]
            if mine:
                out += self._replay_one(opt, mine)
        return out

    @staticmethod
    def _replay_one(opt: torch.optim.Optimizer, pieces: list[Piece]) -> list[torch.Tensor]:
        groups: list[dict[str, Any]] = []
        params: list[torch.Tensor] = []
        for pc in pieces:
            q = pc.param.clone().requires_grad_(True)
            q.grad = pc.grad.clone()
            params.append(q)
            hyper = dict(hyperparameters(opt.param_groups[pc.group], raw=True))
            groups.append({"params": [q], **hyper})
        shadow = type(opt)(groups)  # type: ignore[call-arg]  # subclasses take (params, **defaults)
        for q, pc in zip(params, pieces, strict=True):
            if pc.slots:
                shadow.state[q] = {k: v.clone() for k, v in pc.slots.items()}
        shadow.step()
        out: list[torch.Tensor] = []
        for q in params:
            out.append(q.detach())
            state = shadow.state.get(q, {})
            for key in sorted(state):
                v = state[key]
                if isinstance(v, torch.Tensor) and v.numel() == q.numel():
                    out.append(v)
        return out


def hyperparameters(group: dict[str, Any], *, raw: bool = False) -> dict[str, Any]:
    """A group's hyperparameters (everything but its params), JSON-safe unless ``raw``."""
    out: dict[str, Any] = {}
    for k, v in group.items():
        if k == "params":
            continue
        if raw:
            out[k] = v.clone() if isinstance(v, torch.Tensor) else v
        elif isinstance(v, torch.Tensor):
            out[k] = v.detach().cpu().tolist()
        elif isinstance(v, float):
            out[k] = v.hex()
        elif v is None or isinstance(v, bool | int | str):
            out[k] = v
        elif isinstance(v, tuple | list):
            out[k] = [x.hex() if isinstance(x, float) else repr(x) for x in v]
        else:
            out[k] = type(v).__qualname__
    return out
