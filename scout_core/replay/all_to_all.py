"""All-to-all replay of MoE layers (paper §6.2): one ``all_to_all`` round.

Contract: every rank replays its MoE layer's dispatch and combine on SCOUT's own EP group
(Gloo, or its NCCL payload twin for a CUDA layer), never on the training EP group, with a
synthetic plan and payload drawn from a seed shared by its peer group (the ranks at one EP
position of every replica). Readiness is AND-ed over the EP group before any payload moves,
so no partner is stranded inside an all-to-all; a rank that cannot build its payload still
takes part (zeros of the planned size), and its EP group reports a gap, not evidence. One
exchange on the peer group compares ``received``, ``plan``, ``dispatch`` and ``combine``
exactly and ``t_late`` (:func:`lateness`), ``t_a2a`` and ``t_bcast`` statistically. The
round, and why lateness names the slow rank: docs/moe.md, "Replay of the all-to-all".
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from scout_core.decision.agreement import all_ok, digest
from scout_core.decision.c3 import C3Result, Surface, exchange
from scout_core.integration.adapter import ModuleRef
from scout_core.replay import taps
from scout_core.replay.experts import layer_of
from scout_core.replay.gaps import Gap
from scout_core.replay.packing import sign
from scout_core.replay.runner import RoundOutcome, timed_broadcast
from scout_core.replay.schedule import Recipe
from scout_core.replay.scope import Interval
from scout_core.topology.groups import PeerGroup
from scout_core.vocabulary import Mode, Status

__all__ = ["AllToAllRunner", "AllToAllTarget", "all_to_all_targets", "lateness"]

log = logging.getLogger(__name__)

ROWS = 32
"""Most rows a rank sends one EP destination per dispatch (``1..ROWS``, from the seed):
uneven like a dropless dispatch; small: the round measures arrival and delivery, not bandwidth."""

SURFACES = ("received", "plan", "dispatch", "combine")
"""Exact surfaces of an all-to-all round, in exchange order."""

TAP = "ep"
"""Injected late arrival at the replayed all-to-all (:mod:`.taps`): slept before the call."""
LINK_TAP = "ep_link"
"""Injected slow link at this rank: slept inside the timed call, so every partner waits too."""


@dataclass(frozen=True)
class AllToAllTarget:
    """One MoE layer's all-to-all: what its dispatch moves."""

    layer: str
    """The MoE layer's path (``layers.0.moe``): the recipe's target."""
    width: int
    """Features of one dispatched row (the hidden size)."""
    dtype: torch.dtype
    device: torch.device


def _first_matrix(module: torch.nn.Module) -> torch.Tensor | None:
    for p in module.parameters():
        if p.is_floating_point() and p.dim() >= 2:
            return p
    return None


def all_to_all_targets(
    routers: Sequence[ModuleRef], experts: Sequence[ModuleRef]
) -> dict[str, AllToAllTarget]:
    """One target per MoE layer (each experts container's layer), in model order.

    Row width: the router's input width (the last dimension of its first weight matrix; a
    gate ``Linear(hidden, experts)`` holds ``[experts, hidden]``), else the experts' first
    weight matrix's. A layer with no weight matrix is left out (logged)."""
    out: dict[str, AllToAllTarget] = {}
    for ref in experts:
        layer = layer_of(ref.path)
        router = next((r for r in routers if r.path.startswith(f"{layer}.")), None)
        shaped = _first_matrix(router.module) if router is not None else None
        weight = _first_matrix(ref.module)
        shaped = shaped if shaped is not None else weight
        if shaped is None or weight is None:
            log.warning("MoE layer %s has no weight matrix; its all-to-all is not replayed", layer)
            continue
        out[layer] = AllToAllTarget(layer, int(shaped.shape[-1]), weight.dtype, weight.device)
    return out


def lateness(times: Sequence[Sequence[float]], me: int) -> tuple[float, float]:
    """``(t_late, t_a2a)`` of EP member ``me``; ``times[j][k]`` is member ``j``'s time inside
    timed phase ``k``. Summed over the phases: ``t_late = max_j t[j][k] - t[me][k]`` (how much
    later than the first partner this rank entered) and ``t_a2a = min_j t[j][k]`` (the
    exchange once everyone was in; the same on every member). See docs/moe.md."""
    late = a2a = 0.0
    for k in range(len(times[me])):
        column = [float(row[k]) for row in times]
        late += max(column) - column[me]
        a2a += min(column)
    return late, a2a


def _generator(seed: int, salt: int) -> torch.Generator:
    return torch.Generator().manual_seed((seed + 1_000_003 * salt) % 2**63)


class AllToAllRunner:
    """Runs ``all_to_all`` recipes: the exchange on SCOUT's EP group ``ep``, the
    comparison on the peer group (the same EP position of every replica)."""

    def __init__(
        self,
        *,
        peers: PeerGroup,
        ep: PeerGroup | None,
        targets: Mapping[str, AllToAllTarget],
        kappa: float,
        rows: int = ROWS,
    ) -> None:
        if targets and (ep is None or ep.size < 2):
            raise ValueError("all-to-all replay needs SCOUT's EP group of two or more ranks")
        self.peers = peers
        self.ep = ep
        self.targets = dict(targets)
        self.kappa = kappa
        self.rows = rows
        self._stack = json.dumps([torch.__version__, str(torch.backends.cpu.get_cpu_capability())])

    def run(self, recipe: Recipe, step: int, **_: Any) -> RoundOutcome:
        """One round (docs/moe.md); collective over the peer group and the EP group."""
        assert recipe.path is not None and self.ep is not None
        target = self.targets[recipe.path]
        group, name = self.peers.ranks, recipe.name
        ready_digest = digest(
            {
                "recipe": name,
                "step": step,
                "width": target.width,
                "dtype": str(target.dtype),
                "ep": self.ep.size,
                "rows": self.rows,
                "stack": self._stack,
            }
        )
        ready = exchange(
            [Surface(f"{name}/ready", Mode.EXACT, ready_digest)],
            group=self.peers.pg,
            ranks=group,
            kappa=self.kappa,
        )
        ok = ready[f"{name}/ready"].status is Status.AGREE
        # Every rank takes part in the AND, ready or not, before anyone returns.
        if not all_ok(ok, self.ep.pg):
            reason = "peers differ" if not ok else "an EP partner's peer group is not ready"
            return RoundOutcome(recipe, step, group, False, dict(ready), reason)
        src = group[step % len(group)]
        seed, t_bcast = self._seed(src)
        values = self._exchange(target, seed)
        surfaces = [Surface(f"{name}/{s}", Mode.EXACT, values.get(s)) for s in SURFACES]
        surfaces.append(Surface(f"{name}/gap", Mode.EXACT, values.get("gap", 0)))
        for timing in ("t_late", "t_a2a"):
            surfaces.append(Surface(f"{name}/{timing}", Mode.STATISTICAL, values.get(timing)))
        surfaces.append(Surface(f"{name}/t_bcast", Mode.STATISTICAL, t_bcast))
        results: dict[str, C3Result] = exchange(
            surfaces, group=self.peers.pg, ranks=group, kappa=self.kappa
        )
        return RoundOutcome(recipe, step, group, True, {**ready, **results}, source=src)

    def _seed(self, src: int) -> tuple[int, float]:
        if dist.get_rank() == src:
            value = int.from_bytes(os.urandom(8), "little") >> 1
            buf = torch.tensor([value], dtype=torch.int64).view(torch.uint8)
        else:
            buf = torch.empty(8, dtype=torch.uint8)
        t_bcast = timed_broadcast(buf, src, self.peers)
        return int(buf.view(torch.int64).item()), t_bcast

    def _device(self, target: AllToAllTarget) -> tuple[torch.device, dist.ProcessGroup]:
        """The NCCL payload group for a CUDA layer when SCOUT made one, else Gloo on the host."""
        assert self.ep is not None
        if self.ep.payload_pg is not None and target.device.type == "cuda":
            return target.device, self.ep.payload_pg
        return torch.device("cpu"), self.ep.pg

    def _plan(self, seed: int) -> list[int]:
        assert self.ep is not None
        plan = torch.randint(1, self.rows + 1, (self.ep.size,), generator=_generator(seed, 0))
        return [int(n) for n in plan.tolist()]

    def _payload(
        self, target: AllToAllTarget, seed: int, send: Sequence[int], device: torch.device
    ) -> torch.Tensor:
        """The rows for each EP destination, drawn from the seed (the local work before a
        dispatch: a rank that is slow at it reaches the dispatch late)."""
        blocks = [
            torch.randn(n, target.width, generator=_generator(seed, 1 + q))
            for q, n in enumerate(send)
        ]
        return torch.cat(blocks).to(device=device, dtype=target.dtype)

    def _exchange(self, target: AllToAllTarget, seed: int) -> dict[str, Any]:
        """Plan, dispatch, combine, then the in-call times. Collective over the EP group even
        when this rank's payload fails (it sends zeros of the planned size and a ``gap``)."""
        assert self.ep is not None
        device, pg = self._device(target)
        values: dict[str, Any] = {"received": sign([torch.tensor([seed], dtype=torch.int64)])}
        send = self._plan(seed)
        counts = torch.tensor(send, dtype=torch.int64, device=device)
        got = torch.empty_like(counts)
        dist.all_to_all_single(got, counts, group=pg)
        recv = [int(n) for n in got.tolist()]
        try:
            rows = self._payload(target, seed, send, device)
        except Exception as exc:  # evidence goes missing; peers read inconclusive
            log.warning("all-to-all payload of %s failed on this rank: %s", target.layer, exc)
            values["gap"] = int(Gap.RAISED)
            rows = torch.zeros(sum(send), target.width, dtype=target.dtype, device=device)
        timer = Interval(device)
        dispatched = rows.new_empty((sum(recv), target.width))
        taps.sleep_injected(TAP)  # an injected late arrival: before the call, not in it
        with timer.timing():
            taps.sleep_injected(LINK_TAP)  # an injected slow exchange: inside the call
            dist.all_to_all_single(dispatched, rows, recv, send, group=pg)
        t_dispatch = timer.seconds
        returned = rows.new_empty((sum(send), target.width))
        taps.sleep_injected(TAP)
        with timer.timing():
            taps.sleep_injected(LINK_TAP)
            dist.all_to_all_single(returned, dispatched, send, recv, group=pg)
        failed = float("gap" in values)
        mine = torch.tensor([t_dispatch, timer.seconds - t_dispatch, failed], dtype=torch.float64)
        everyone = [torch.empty_like(mine) for _ in self.ep.ranks]
        dist.all_gather(everyone, mine, group=self.ep.pg)
        if "gap" in values:
            return values
        if any(t[2].item() for t in everyone):  # a partner sent zeros: nothing comparable
            values["gap"] = int(Gap.PARTNER_RAISED)
            return values
        times = [t[:2].tolist() for t in everyone]
        late, a2a = lateness(times, self.ep.index_of(dist.get_rank()))
        values.update(
            plan=sign([got.cpu()]),
            dispatch=sign([dispatched.cpu()]),
            combine=sign([returned.cpu()]),
            t_late=late,
            t_a2a=a2a,
        )
        return values
