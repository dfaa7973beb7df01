"""Optimizer replay: re-run the update on a rotating slice and compare it across replicas.

An SDC in the optimizer (a flipped bit in an Adam moment, a miscomputed update)
lands directly in the training state, so the update itself is a replay surface.
Copying the whole model and optimizer state would double memory; instead a step
pre-hook clones one rotating slice of ``optimizer_slice`` elements: the
parameter, its effective (already reduced) gradient, the optimizer slots of the
same shape, the scalar slots and the group hyperparameters. After the real step:

* the source peer broadcasts its pre-step slice and every peer applies the same
  optimizer class to it (``optimizer/update``): a peer that computes the update
  differently is the outlier;
* each peer also signs its *own* pre-step slice (``optimizer/slice``) and its own
  post-step slice (``optimizer/result``): replicated state must be bitwise equal
  across replica peers, so a corrupted moment or parameter on one peer shows up
  there.

This needs replicated ownership (DDP, or HSDP shards compared between replica
peers). Uniquely owned shards (pure FSDP, ZeRO-3 without replicas) have no peer
holding the same state; the recipe is skipped with a logged reason. The replayed
update is exact for element-wise optimizers (SGD, Adam, AdamW ...); optimizers that
mix elements across a tensor (norm-based ones) still compare consistently across
peers, but the slice is then not the full update.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import torch

from scout_core.decision.c3 import Surface, exchange
from scout_core.integration.adapter import Ownership
from scout_core.replay.packing import pack, sign, unpack
from scout_core.replay.runner import RoundOutcome, timed_broadcast
from scout_core.replay.schedule import OPTIMIZER, Recipe
from scout_core.topology.groups import PeerGroup
from scout_core.vocabulary import Mode, Status

__all__ = ["OptimizerReplay"]

log = logging.getLogger("scout.replay")


def _local(t: torch.Tensor) -> torch.Tensor:
    to_local = getattr(t, "to_local", None)
    if callable(to_local):
        out = to_local()
        assert isinstance(out, torch.Tensor)
        return out
    return t


@dataclass
class _Piece:
    """One parameter's part of the slice."""

    group: int
    param: torch.Tensor
    grad: torch.Tensor
    slots: dict[str, torch.Tensor]
    """Same-shape slots sliced like the parameter; scalar slots (``step``) whole."""


class OptimizerReplay:
    """Snapshot before the step, replay and compare after it."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        peers: PeerGroup,
        *,
        slice_size: int,
        kappa: float,
        ownership: Ownership,
    ) -> None:
        self.optimizer = optimizer
        self.peers = peers
        self.slice_size = slice_size
        self.kappa = kappa
        self.ownership = ownership
        self._pieces: list[_Piece] | None = None
        self._index = 0
        self._warned = False

    @property
    def supported(self) -> bool:
        return self.ownership is not Ownership.UNIQUE

    def slices(self) -> int:
        """How many slices one rotation over the local parameters has."""
        total = sum(_local(p).numel() for g in self.optimizer.param_groups for p in g["params"])
        return max(1, -(-total // self.slice_size))

    # -- before the step ------------------------------------------------------------------

    def snapshot(self, index: int) -> None:
        """Clone slice ``index`` of parameters, gradients and slots (the step pre-hook)."""
        if not self.supported:
            if not self._warned:
                log.warning(
                    "scout: optimizer replay skipped: optimizer state is uniquely owned "
                    "(%s), so no peer holds the same state to compare with",
                    self.ownership.value,
                )
                self._warned = True
            return
        self._index = index
        lo = index * self.slice_size
        hi = lo + self.slice_size
        at = 0
        pieces: list[_Piece] = []
        for gi, group in enumerate(self.optimizer.param_groups):
            for p in group["params"]:
                local = _local(p)
                n = local.numel()
                a, b = max(lo, at), min(hi, at + n)
                at += n
                if a >= b or p.grad is None:
                    continue
                flat = slice(a - (at - n), b - (at - n))
                state = self.optimizer.state.get(p, {})
                slots: dict[str, torch.Tensor] = {}
                for key, value in state.items():
                    if not isinstance(value, torch.Tensor):
                        continue
                    v = _local(value)
                    if v.numel() == n:
                        slots[key] = v.detach().reshape(-1)[flat].clone()
                    elif v.numel() == 1:
                        slots[key] = v.detach().clone()
                pieces.append(
                    _Piece(
                        gi,
                        local.detach().reshape(-1)[flat].clone(),
                        _local(p.grad).detach().reshape(-1)[flat].clone(),
                        slots,
                    )
                )
        self._pieces = pieces

    # -- after the step -------------------------------------------------------------------

    def run(self, step: int) -> RoundOutcome | None:
        """Replay and compare the snapshot taken before this step; None when skipped."""
        if not self.supported:
            return None
        pieces, self._pieces = self._pieces, None
        recipe = Recipe(OPTIMIZER, None, self._index)
        ready = exchange(
            [Surface("optimizer/ready", Mode.EXACT, self._digest(pieces, step))],
            group=self.peers.pg,
            ranks=self.peers.ranks,
            kappa=self.kappa,
        )
        if ready["optimizer/ready"].status is not Status.AGREE or pieces is None:
            return RoundOutcome(
                recipe, step, self.peers.ranks, False, dict(ready), "optimizer snapshot differs"
            )
        own_before = sign(self._flat(pieces))
        after = self._after(pieces)
        src = self.peers.ranks[step % len(self.peers.ranks)]
        t0 = time.monotonic()
        received = self._broadcast(pieces, src)
        t_bcast = time.monotonic() - t0
        try:
            update: int | None = sign(self._replay(received))
        except Exception as exc:  # evidence goes missing; peers read inconclusive
            log.warning("scout: optimizer replay failed on this rank: %s", exc)
            update = None
        results = exchange(
            [
                Surface("optimizer/received", Mode.EXACT, sign(self._flat(received))),
                Surface("optimizer/slice", Mode.EXACT, own_before),
                Surface("optimizer/update", Mode.EXACT, update),
                Surface("optimizer/result", Mode.EXACT, sign(after)),
                Surface("optimizer/t_bcast", Mode.STATISTICAL, t_bcast),
            ],
            group=self.peers.pg,
            ranks=self.peers.ranks,
            kappa=self.kappa,
        )
        return RoundOutcome(recipe, step, self.peers.ranks, True, {**ready, **results}, source=src)

    def _digest(self, pieces: list[_Piece] | None, step: int) -> int | None:
        if pieces is None:
            return None
        meta = {
            "step": step,
            "index": self._index,
            "cls": type(self.optimizer).__qualname__,
            "pieces": [
                [
                    pc.group,
                    pc.param.numel(),
                    str(pc.param.dtype),
                    sorted([k, str(v.dtype), v.numel()] for k, v in pc.slots.items()),
                ]
                for pc in pieces
            ],
            "hyper": [_hyper(g) for g in self.optimizer.param_groups],
        }
        text = json.dumps(meta, sort_keys=True, separators=(",", ":"))
        return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")

    @staticmethod
    def _flat(pieces: list[_Piece]) -> list[torch.Tensor]:
        out: list[torch.Tensor] = []
        for pc in pieces:
            out += [pc.param, pc.grad] + [pc.slots[k] for k in sorted(pc.slots)]
        return out

    def _after(self, pieces: list[_Piece]) -> list[torch.Tensor]:
        """This peer's own post-step values of the same slice (parameter and slots)."""
        lo = self._index * self.slice_size
        out: list[torch.Tensor] = []
        at = 0
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                local = _local(p)
                n = local.numel()
                a, b = max(lo, at), min(lo + self.slice_size, at + n)
                at += n
                if a >= b or p.grad is None:
                    continue
                flat = slice(a - (at - n), b - (at - n))
                out.append(local.detach().reshape(-1)[flat])
                state = self.optimizer.state.get(p, {})
                for key in sorted(state):
                    v = state[key]
                    if isinstance(v, torch.Tensor) and _local(v).numel() == n:
                        out.append(_local(v).detach().reshape(-1)[flat])
        return out

    def _broadcast(self, pieces: list[_Piece], src: int) -> list[_Piece]:
        flat = self._flat(pieces)
        buf = pack(flat)
        timed_broadcast(buf, src, self.peers)
        got = iter(unpack(buf, flat))
        out: list[_Piece] = []
        for pc in pieces:
            param, grad = next(got), next(got)
            slots = {k: next(got) for k in sorted(pc.slots)}
            out.append(_Piece(pc.group, param, grad, slots))
        return out

    def _replay(self, pieces: list[_Piece]) -> list[torch.Tensor]:
        """Apply the same optimizer class to copies of the slice; return the updated values."""
        cls = type(self.optimizer)
        groups: list[dict[str, Any]] = []
        params: list[torch.Tensor] = []
        for pc in pieces:
            q = pc.param.clone().requires_grad_(True)
            q.grad = pc.grad.clone()
            params.append(q)
            hyper = dict(_hyper(self.optimizer.param_groups[pc.group], raw=True))
            groups.append({"params": [q], **hyper})
        if not groups:
            return []
        shadow = cls(groups)  # type: ignore[call-arg]  # subclasses take (params, **defaults)
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


def _hyper(group: dict[str, Any], *, raw: bool = False) -> dict[str, Any]:
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
