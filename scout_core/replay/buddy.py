"""Buddy optimizer replay: an owner's optimizer step, replayed by the next rank of its group.

Contract: where optimizer state is uniquely owned (pure FSDP, ZeRO 1-3), each owner ships the
rotating slice :class:`~.optimizer.OptimizerReplay` snapshots before the step (parameter,
reduced gradient, slots, with a JSON layout: no pickle) to its buddy, the next rank of the peer
group, which applies its own optimizer class and hyperparameters and compares the result's
signature with the owner's post-step slice. A mismatch asks a referee (the rank after the
buddy; in a pair, the rank at the owner's position in the next peer group, read from one
job-wide all-gather) to replay the same slice, and two of three decide (``optimizer/buddy``,
rank scope). No referee, a layout the buddy cannot replay or a referee that matches neither
give an inconclusive round with the reason, never a culprit. docs/replay.md, "Buddy
optimizer replay".
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
from scout_core.replay.referee import Finding
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
_NAMED = ("owner", "buddy")
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

    def __init__(
        self, opt: OptimizerReplay, peers: PeerGroup, job: dist.ProcessGroup, ranks: Sequence[int]
    ) -> None:
        self.opt = opt
        self.peers = peers
        self.pg = peers.pg
        self.job = job
        """SCOUT's job-wide Gloo group, for the words every rank reads and a pair's referee."""
        self.job_ranks = sorted(ranks)

    def _layout(self, pieces: list[Piece]) -> bytes:
        """What a buddy needs to rebuild ``pieces``: their optimizer, group, tensors'
        names, shapes and dtypes, and the class and hyperparameters of each group they
        were stepped in (the buddy replays only with equal ones)."""
        opts = self.opt.optimizers
        used = sorted({(pc.optimizer, pc.group) for pc in pieces})
        return json.dumps(
            {
                "groups": [
                    [
                        oi,
                        gi,
                        type(opts[oi]).__qualname__,
                        hyperparameters(opts[oi].param_groups[gi]),
                    ]
                    for oi, gi in used
                ],
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
        for oi, gi, cls, hyper in meta["groups"]:
            if not (0 <= oi < len(opts) and 0 <= gi < len(opts[oi].param_groups)):
                raise ValueError(f"no optimizer {oi} group {gi} here")
            if cls != type(opts[oi]).__qualname__:
                raise ValueError(
                    f"optimizer classes differ: {cls} here {type(opts[oi]).__qualname__}"
                )
            if hyper != hyperparameters(opts[oi].param_groups[gi]):
                raise ValueError(f"hyperparameters of optimizer {oi} group {gi} differ")
        known = {(oi, gi) for oi, gi, _, _ in meta["groups"]}
        specs: list[tuple[list[int], torch.dtype]] = []
        shapes: list[tuple[int, int, list[str]]] = []
        for oi, gi, parts in meta["pieces"]:
            if (oi, gi) not in known:
                raise ValueError(f"no optimizer {oi} group {gi} in the layout's groups")
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
        """Collective over the job: ship to the buddy, replay, and on a mismatch referee."""
        pieces, after, index = self.opt.take()
        ranks = self.peers.ranks
        n, me = len(ranks), ranks.index(dist.get_rank())
        layout = b"" if pieces is None else self._layout(pieces)
        payload = torch.empty(0, dtype=torch.uint8)
        if pieces is not None:
            payload = pack(OptimizerReplay.flat(pieces))
        ship = [int(pieces is not None), len(layout), payload.numel()]
        heads = self._gather([*ship, _i64(after)], self.pg, n)
        prev, nxt = ranks[(me - 1) % n], ranks[(me + 1) % n]
        got = self._swap(
            self.pg,
            send=nxt if ship[0] else None,
            recv=_announced(prev, heads[(me - 1) % n][:3]),
            mine=(layout, payload),
        )
        code, sig = _NONE, None
        if got is not None:
            code, sig = self._replayed(*got)
            if code == _AGREE and sig != _u64(heads[(me - 1) % n][3]):
                code = _DIFFER
        # Job-wide, so that a pair's referee may sit in another group: what each buddy
        # says of its owner, and where it sits.
        said = dict(
            zip(
                self.job_ranks,
                self._gather(
                    [code, _i64(sig), ranks[0], me, n, *ship], self.job, len(self.job_ranks)
                ),
                strict=True,
            )
        )
        referee_of = _referees(said)
        verdict: dict[int, str] = {}
        refs: dict[int, list[int]] = {}
        if referee_of:
            mine_to = referee_of.get(ranks[me])
            serving = [o for o, r in referee_of.items() if r == dist.get_rank()]
            got = self._swap(
                self.job,
                send=mine_to,
                recv=_announced(serving[0], said[serving[0]][5:8]) if serving else None,
                mine=(layout, payload),
            )
            rcode, rsig = (_NONE, None) if got is None else self._replayed(*got)
            refs = dict(
                zip(
                    self.job_ranks,
                    self._gather([rcode, _i64(rsig)], self.job, len(self.job_ranks)),
                    strict=True,
                )
            )
        findings: list[Finding] = []
        for j, owner in enumerate(ranks):
            buddy = ranks[(j + 1) % n]
            if said[buddy][0] != _DIFFER:
                continue
            referee = referee_of.get(owner, -1)
            ref = refs.get(referee)
            sigs = {owner: _u64(heads[j][3]), buddy: _u64(said[buddy][1])}
            if ref is not None and ref[0] == _AGREE:
                sigs[referee] = _u64(ref[1])
            verdict[j] = decide(sigs[owner], sigs[buddy], sigs.get(referee))
            if verdict[j] in _NAMED:
                culprit = owner if verdict[j] == "owner" else buddy
                findings.append(
                    Finding(
                        (owner, buddy),
                        ("buddy",),
                        referee,
                        culprit,
                        f"the referee's replay matches rank {owner + buddy - culprit}",
                        {r: {"buddy": v} for r, v in sigs.items()},
                    )
                )
        codes = [said[r][0] for r in ranks]
        outcome = _outcome(
            Recipe(OPTIMIZER, None, index), step, ranks, heads=heads, codes=codes, verdict=verdict
        )
        if len(findings) == 1:  # one pair settled: the referee's rank scope and evidence
            outcome.referee = findings[0]
        return outcome

    @staticmethod
    def _gather(words: Sequence[int], pg: dist.ProcessGroup, size: int) -> list[list[int]]:
        mine = torch.tensor(list(words), dtype=torch.int64)
        parts = [torch.empty_like(mine) for _ in range(size)]
        dist.all_gather(parts, mine, group=pg)
        return [p.tolist() for p in parts]

    def _swap(
        self,
        pg: dist.ProcessGroup,
        *,
        send: int | None,
        recv: tuple[int, int, int] | None,
        mine: tuple[bytes, torch.Tensor],
    ) -> tuple[bytes, torch.Tensor] | None:
        """Send this rank's shipment to global rank ``send`` and receive the one that
        ``recv = (rank, layout bytes, payload bytes)`` announced (nothing where None)."""
        ops: list[dist.P2POp] = []
        if send is not None:
            layout, payload = mine
            out = torch.frombuffer(bytearray(layout), dtype=torch.uint8)
            ops.append(dist.P2POp(dist.isend, out, send, group=pg))
            if payload.numel():
                ops.append(dist.P2POp(dist.isend, payload, send, group=pg))
        inbox = None
        if recv is not None:
            src, size, nbytes = recv
            if not (0 < size <= MAX_LAYOUT and 0 <= nbytes <= self.opt.max_bytes()):
                raise RuntimeError(
                    f"buddy shipment from rank {src} refused: layout {size} bytes, "
                    f"payload {nbytes} bytes"
                )
            inbox = (torch.empty(size, dtype=torch.uint8), torch.empty(nbytes, dtype=torch.uint8))
            ops.append(dist.P2POp(dist.irecv, inbox[0], src, group=pg))
            if nbytes:
                ops.append(dist.P2POp(dist.irecv, inbox[1], src, group=pg))
        if ops:
            for req in dist.batch_isend_irecv(ops):
                req.wait()
        if inbox is None:
            return None
        return bytes(inbox[0].numpy().tobytes()), inbox[1]


def _announced(src: int, ship: list[int]) -> tuple[int, int, int] | None:
    """``(src, layout bytes, payload bytes)`` from a ``[has, layout, payload]`` header."""
    return (src, ship[1], ship[2]) if ship[0] else None


def _referees(said: dict[int, list[int]]) -> dict[int, int]:
    """Owner -> referee, for every owner whose buddy's replay differs, from the job-wide
    words ``[code, sig, group id, position, group size, ...]``: the rank after the buddy
    in a group of three or more; in a pair, the rank at the same position of the next
    group (groups in order of their first rank), when there is another group."""
    groups: dict[int, dict[int, int]] = {}
    for rank, w in said.items():
        groups.setdefault(w[2], {})[w[3]] = rank
    order = sorted(groups)
    out: dict[int, int] = {}
    for w in said.values():
        if w[0] != _DIFFER:
            continue
        gid, pos, n = w[2], w[3], w[4]
        owner = groups[gid][(pos - 1) % n]
        if n >= 3:
            out[owner] = groups[gid][(pos + 1) % n]
        elif len(order) >= 2:
            other = groups[order[(order.index(gid) + 1) % len(order)]]
            if (pos - 1) % n in other:
                out[owner] = other[(pos - 1) % n]
    # A referee serves one owner (groups of unequal sizes could map two onto one): the
    # lowest owner keeps it, the same on every rank, so no send is left unmatched.
    taken: set[int] = set()
    for owner in sorted(out):
        if out[owner] in taken:
            del out[owner]
        else:
            taken.add(out[owner])
    return out


def _outcome(
    recipe: Recipe,
    step: int,
    ranks: tuple[int, ...],
    *,
    heads: list[list[int]],
    codes: list[int],
    verdict: dict[int, str],
) -> RoundOutcome:
    """The round from each owner's header, each buddy's code (about its owner) and the
    two-of-three of every owner whose buddy differed."""
    n = len(ranks)
    named = {j if who == "owner" else (j + 1) % n for j, who in verdict.items() if who in _NAMED}
    evidence = tuple(_u64(h[3]) if h[0] else None for h in heads)
    if named:
        bitmap = tuple(j in named for j in range(n))
        result = C3Result(SURFACE, Mode.EXACT, Status.ATTRIBUTED, bitmap, evidence, ranks)
        return RoundOutcome(recipe, step, ranks, True, {SURFACE: result})
    if verdict:
        reason = "an owner's step and its buddy's replay differ; no referee decided"
    elif _FAILED in codes:
        reason = "a buddy could not replay its owner's optimizer slice"
    elif _NONE in codes:
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
