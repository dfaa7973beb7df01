"""Buddy optimizer replay: an owner's optimizer step, replayed by the next rank of its group.

Contract: where optimizer state is uniquely owned (pure FSDP, ZeRO 1-3), each owner ships the
rotating slice :class:`~.optimizer.OptimizerReplay` snapshots before the step (parameter,
reduced gradient, slots, with a JSON layout: no pickle) to its buddy, the next rank of the peer
group, which applies its own optimizer class and hyperparameters and compares the result's
signature with the owner's post-step slice. A mismatch asks a referee (the rank after the
buddy) to replay the same slice, and two of three decide (``optimizer/buddy``, rank scope).
Two owners, a layout the buddy cannot replay or a referee that matches neither give an
inconclusive round with the reason, never a culprit. docs/replay.md, "Buddy optimizer replay".
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence

import torch
import torch.distributed as dist

from scout_core.decision.c3 import C3Result
from scout_core.replay.optimizer import OptimizerReplay, Piece, hyperparameters
from scout_core.replay.packing import pack, sign, unpack
from scout_core.replay.runner import RoundOutcome
from scout_core.replay.schedule import OPTIMIZER, Recipe
from scout_core.topology.groups import PeerGroup
from scout_core.vocabulary import Mode, Status

__all__ = ["SURFACE", "BuddyReplay", "decide"]

log = logging.getLogger(__name__)

SURFACE = "optimizer/buddy"
MAX_LAYOUT = 1 << 20
"""Bytes of a shipped layout a buddy accepts (a slice's layout is a few hundred)."""
_AGREE, _DIFFER, _FAILED, _NONE = 0, 1, 2, 3
"""What a buddy (or a referee) says of the owner it replayed."""


def _i64(sig: int | None) -> int:
    if sig is None:
        return 0
    return sig - (1 << 64) if sig >= 1 << 63 else sig


def _u64(word: int) -> int:
    return word + (1 << 64) if word < 0 else word


def decide(owner: int, buddy: int, referee: int | None) -> str:
    """Two of three signatures of one slice: the owner's post-step values, the buddy's replay,
    the referee's (None: no answer). ``"owner"`` or ``"buddy"``: the side the other two
    outvote; ``"none"``: nothing differs; ``"inconclusive"``: no referee, or it matches neither."""
    if owner == buddy:
        return "none"
    if referee is None or referee not in (owner, buddy):
        return "inconclusive"
    return "owner" if referee == buddy else "buddy"


class BuddyReplay:
    """Runs the optimizer recipe where no peer holds the same optimizer state."""

    def __init__(self, opt: OptimizerReplay, peers: PeerGroup) -> None:
        self.opt = opt
        self.peers = peers
        self.pg = peers.pg

    def _layout(self, pieces: list[Piece]) -> bytes:
        """What a buddy rebuilds ``pieces`` from: optimizer, group, tensor names, shapes and
        dtypes, and the classes and hyperparameters (it replays only with equal ones)."""
        opts = self.opt.optimizers
        return json.dumps(
            {
                "cls": [type(o).__qualname__ for o in opts],
                "hyper": [[hyperparameters(g) for g in o.param_groups] for o in opts],
                "pieces": [
                    [
                        pc.optimizer,
                        pc.group,
                        [
                            [k, list(t.shape), str(t.dtype).removeprefix("torch.")]
                            for k, t in _parts(pc)
                        ],
                    ]
                    for pc in pieces
                ],
            },
            sort_keys=True,
        ).encode()

    def _rebuild(self, layout: bytes, payload: torch.Tensor) -> list[Piece]:
        """The owner's pieces from its shipment, on this rank's optimizer device; raises
        ``ValueError`` naming what does not fit this rank's optimizers."""
        meta = json.loads(layout.decode())
        opts = self.opt.optimizers
        if meta["cls"] != [type(o).__qualname__ for o in opts]:
            raise ValueError(f"optimizer classes differ: {meta['cls']}")
        if meta["hyper"] != [[hyperparameters(g) for g in o.param_groups] for o in opts]:
            raise ValueError("hyperparameters differ")
        specs: list[tuple[list[int], torch.dtype]] = []
        shapes: list[tuple[int, int, list[str]]] = []
        for oi, gi, parts in meta["pieces"]:
            if not (0 <= oi < len(opts) and 0 <= gi < len(opts[oi].param_groups)):
                raise ValueError(f"no optimizer {oi} group {gi} here")
            names = []
            for name, shape, dtype in parts:
                kind = getattr(torch, str(dtype), None)
                if not isinstance(kind, torch.dtype):
                    raise ValueError(f"unknown dtype {dtype!r}")
                specs.append(([int(x) for x in shape], kind))
                names.append(str(name))
            shapes.append((oi, gi, names))
        # Sizes first: nothing is allocated for a layout that the payload does not fill.
        size = sum(math.prod(shape) * kind.itemsize for shape, kind in specs)
        if size != payload.numel():
            raise ValueError(f"payload has {payload.numel()} bytes, the layout {size}")
        device = _device(opts)
        like = [torch.empty(shape, dtype=kind, device=device) for shape, kind in specs]
        got = iter(unpack(payload, like))
        out = []
        for oi, gi, names in shapes:
            tensors = {n: next(got) for n in names}
            param, grad = tensors.pop("param"), tensors.pop("grad")
            out.append(Piece(oi, gi, param, grad, tensors))
        return out

    def _replayed(self, layout: bytes, payload: torch.Tensor) -> tuple[int, int | None]:
        """(code, signature) of this rank's replay of a shipment."""
        try:
            return _AGREE, sign(self.opt.replay(self._rebuild(layout, payload)))
        except Exception as exc:  # evidence goes missing: the round reads inconclusive
            log.warning("buddy optimizer replay failed on this rank: %s", exc)
            return _FAILED, None

    def run(self, step: int) -> RoundOutcome:
        """Collective over the peer group: ship, replay, and on a mismatch referee."""
        pieces, after, index = self.opt.take()
        ranks = self.peers.ranks
        n, me = len(ranks), ranks.index(dist.get_rank())
        recipe = Recipe(OPTIMIZER, None, index)
        layout = b"" if pieces is None else self._layout(pieces)
        payload = (
            torch.empty(0, dtype=torch.uint8)
            if pieces is None
            else pack(OptimizerReplay.flat(pieces))
        )
        mine = [int(pieces is not None), len(layout), payload.numel(), _i64(after)]
        heads = self._gather(mine)
        prev, nxt = (me - 1) % n, (me + 1) % n
        got = self._swap(heads, send_to=nxt, recv_from=prev, mine=(layout, payload))
        code, sig = _NONE, None
        if got is not None:
            code, sig = self._replayed(*got)
            if code == _AGREE and sig != _u64(heads[prev][3]):
                code = _DIFFER
        said = self._gather([code, _i64(sig)])
        flagged = [j for j in range(n) if said[(j + 1) % n][0] == _DIFFER]
        verdict: dict[int, str] = {}
        if flagged and n >= 3:
            owner = (me - 2) % n
            mine_flagged = me in flagged
            got = self._swap(
                heads,
                send_to=(me + 2) % n if mine_flagged else None,
                recv_from=owner if owner in flagged else None,
                mine=(layout, payload),
            )
            rcode, rsig = (_NONE, None) if got is None else self._replayed(*got)
            refs = self._gather([rcode, _i64(rsig)])
            for j in flagged:
                r = refs[(j + 2) % n]
                verdict[j] = decide(
                    _u64(heads[j][3]),
                    _u64(said[(j + 1) % n][1]),
                    _u64(r[1]) if r[0] == _AGREE else None,
                )
        return _outcome(
            recipe, step, ranks, heads=heads, said=said, flagged=flagged, verdict=verdict
        )

    def _gather(self, words: Sequence[int]) -> list[list[int]]:
        mine = torch.tensor(list(words), dtype=torch.int64)
        parts = [torch.empty_like(mine) for _ in self.peers.ranks]
        dist.all_gather(parts, mine, group=self.pg)
        return [p.tolist() for p in parts]

    def _swap(
        self,
        heads: list[list[int]],
        *,
        send_to: int | None,
        recv_from: int | None,
        mine: tuple[bytes, torch.Tensor],
    ) -> tuple[bytes, torch.Tensor] | None:
        """Send this rank's shipment to peer index ``send_to`` and receive peer
        ``recv_from``'s, as their headers announce (nothing where a side has none)."""
        ranks = self.peers.ranks
        me = ranks.index(dist.get_rank())
        ops: list[dist.P2POp] = []
        if send_to is not None and heads[me][0]:
            layout, payload = mine
            out = torch.frombuffer(bytearray(layout), dtype=torch.uint8)
            ops.append(dist.P2POp(dist.isend, out, ranks[send_to], group=self.pg))
            if payload.numel():
                ops.append(dist.P2POp(dist.isend, payload, ranks[send_to], group=self.pg))
        inbox = None
        if recv_from is not None and heads[recv_from][0]:
            _, size, nbytes, _ = heads[recv_from]
            if not (0 < size <= MAX_LAYOUT and 0 <= nbytes <= self.opt.max_bytes()):
                raise RuntimeError(
                    f"buddy shipment from rank {ranks[recv_from]} refused: layout {size} "
                    f"bytes, payload {nbytes} bytes"
                )
            inbox = (torch.empty(size, dtype=torch.uint8), torch.empty(nbytes, dtype=torch.uint8))
            ops.append(dist.P2POp(dist.irecv, inbox[0], ranks[recv_from], group=self.pg))
            if nbytes:
                ops.append(dist.P2POp(dist.irecv, inbox[1], ranks[recv_from], group=self.pg))
        if ops:
            for req in dist.batch_isend_irecv(ops):
                req.wait()
        if inbox is None:
            return None
        return bytes(inbox[0].numpy().tobytes()), inbox[1]


def _outcome(
    recipe: Recipe,
    step: int,
    ranks: tuple[int, ...],
    *,
    heads: list[list[int]],
    said: list[list[int]],
    flagged: list[int],
    verdict: dict[int, str],
) -> RoundOutcome:
    n = len(ranks)
    named = {
        j if who == "owner" else (j + 1) % n
        for j, who in verdict.items()
        if who in ("owner", "buddy")
    }
    evidence = tuple(_u64(h[3]) if h[0] else None for h in heads)
    bitmap = tuple(j in named for j in range(n))
    if named:
        result = C3Result(SURFACE, Mode.EXACT, Status.ATTRIBUTED, bitmap, evidence, ranks)
        return RoundOutcome(recipe, step, ranks, True, {SURFACE: result})
    if flagged:
        reason = (
            "an owner's step and its buddy's replay differ; no referee in a group of 2"
            if n < 3
            else "an owner's step and its buddy's replay differ; the referee matches neither"
        )
    elif any(s[0] == _FAILED for s in said):
        reason = "a buddy could not replay its owner's optimizer slice"
    elif any(s[0] == _NONE for s in said):
        reason = "a buddy received no optimizer slice"
    else:
        result = C3Result(SURFACE, Mode.EXACT, Status.AGREE, (False,) * n, evidence, ranks)
        return RoundOutcome(recipe, step, ranks, True, {SURFACE: result})
    ready = C3Result(
        "optimizer/ready", Mode.EXACT, Status.INCONCLUSIVE, (False,) * n, evidence, ranks
    )
    return RoundOutcome(recipe, step, ranks, False, {"optimizer/ready": ready}, reason)


def _parts(pc: Piece) -> list[tuple[str, torch.Tensor]]:
    """A piece's tensors in :meth:`OptimizerReplay.flat`'s order, by name."""
    return [("param", pc.param), ("grad", pc.grad), *((k, pc.slots[k]) for k in sorted(pc.slots))]


def _device(opts: Sequence[torch.optim.Optimizer]) -> torch.device:
    for o in opts:
        for g in o.param_groups:
            for p in g["params"]:
                found: torch.device = p.device
                return found
    return torch.device("cpu")
