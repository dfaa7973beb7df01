"""The replay boundary for one layer recipe (paper Algorithm 2), on copied state.

Contract: at the boundary after a due optimizer step every peer of a comparison group runs the
same sequence, so the collectives always match: readiness C3 (a peer that missed the capture
makes the round inconclusive on every peer before any recipe collective), the source's
broadcast of inputs, output gradients and RNG states, the parameter gather under FSDP or TP,
the module call on copies for each input variant, then one exchange of exact signatures,
timings and gap codes. Three collectives per round on the peer group, plus one per crossing
gather group and sharded parameter; none when nothing is due. A replay that raises contributes
no evidence, never a failure of the job. docs/replay.md, "One round, step by step".
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from scout_core.decision.agreement import all_ok as all_ready
from scout_core.decision.c3 import C3Result, Surface, exchange
from scout_core.decision.pools import PoolTiming, work_key
from scout_core.errors import ConfigError
from scout_core.integration.adapter import ModuleRef, RngStream
from scout_core.replay import control, taps
from scout_core.replay.capture import Capture, Capturer
from scout_core.replay.compute import Call, Inputs, replay_module
from scout_core.replay.gaps import Gap
from scout_core.replay.kept import Kept
from scout_core.replay.overrides import InstanceForwards
from scout_core.replay.packing import pack, sign, unpack
from scout_core.replay.readiness import digest_of, leaf_meta, readiness_fields, referee_fields
from scout_core.replay.referee import Finding
from scout_core.replay.referee_wire import Expected, Refusal, Shipment
from scout_core.replay.schedule import ROUTER, Recipe
from scout_core.replay.scope import Interval
from scout_core.topology.groups import PeerGroup
from scout_core.topology.mesh import MeshLayout
from scout_core.vocabulary import Mode, Status

__all__ = ["LayerRunner", "RoundOutcome", "payload_device", "timed_broadcast"]

log = logging.getLogger(__name__)

SURFACES = ("received", "params", "forward", "input_grad", "param_grad")
"""Exact surfaces of a layer recipe, in exchange order."""

ROUTER_SURFACES = (("weights", "float_outputs"), ("topk", "int_outputs"))
"""A router round's extra exact surfaces: routing weights and top-k indices."""


@dataclass
class RoundOutcome:
    """What one recipe round decided, identical on every peer of the group."""

    recipe: Recipe
    step: int
    group: tuple[int, ...]
    ready: bool
    results: dict[str, C3Result] = field(default_factory=dict)
    reason: str | None = None
    """Why the round is inconclusive before any comparison (readiness), if it is."""
    source: int | None = None
    """The global rank that broadcast the replay inputs."""
    pool: PoolTiming | None = None
    """The round's pool (:mod:`scout_core.decision.pools`), if any: ``t_M`` is judged over it."""
    referee: Finding | None = None
    """What a referee said about this pair's disagreement (:mod:`.referee`), if it asked."""


Materialize = Callable[[ModuleRef], AbstractContextManager[Mapping[str, torch.Tensor]]]


def functional_call(
    module: nn.Module, state: dict[str, torch.Tensor], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """Run ``module`` with ``state`` bound in place of its parameters and buffers."""
    return torch.func.functional_call(module, state, args, kwargs)


def payload_device(peers: PeerGroup, like: Sequence[torch.Tensor]) -> torch.device:
    """The tensors' CUDA device when the peer group has an NCCL payload group, else the host."""
    if peers.payload_pg is not None:
        for t in like:
            if t.device.type == "cuda":
                return t.device
    return torch.device("cpu")


def timed_broadcast(buf: torch.Tensor, src: int, peers: PeerGroup) -> float:
    """Broadcast ``buf`` from ``src`` on the peer group; ``t_bcast`` in seconds, ending when
    the device has the data (device buffers on the NCCL payload group, host ones on Gloo).
    An injected slow link (:func:`.taps.add_comm_delay`, the peer group's kind) stalls this
    rank inside the interval before it enters the broadcast, as a slow NIC would."""
    pg = peers.payload_pg if buf.device.type != "cpu" and peers.payload_pg else peers.pg
    timer = Interval(buf.device)
    with timer.timing():
        taps.sleep_injected(peers.kind)
        dist.broadcast(buf, src=src, group=pg)
    return timer.seconds


class LayerRunner:
    """Runs layer recipes for one comparison group."""

    def __init__(
        self,
        *,
        peers: PeerGroup,
        modules: Mapping[str, ModuleRef],
        capturer: Capturer,
        rng_streams: Sequence[RngStream],
        materialize: Materialize,
        variants: Sequence[float],
        kappa: float,
        layout: MeshLayout,
        deterministic: bool = True,
        threads: int | None = None,
        gathered: bool = False,
        call: Call = functional_call,
        local_shards: Callable[[ModuleRef], Sequence[torch.Tensor]] | None = None,
        closure: Sequence[PeerGroup] = (),
    ) -> None:
        self.peers = peers
        self.modules = dict(modules)
        self.capturer = capturer
        self.rng = list(rng_streams)
        self.materialize = materialize
        self.variants = tuple(variants)
        self.kappa = kappa
        self.layout = layout
        self.deterministic = deterministic
        self.threads = threads
        self.gathered = gathered
        self.call = call
        self.local_shards = local_shards
        self.closure = tuple(closure)
        """Gather groups that cross replica groups: readiness is AND-ed over them."""
        self.forwards = InstanceForwards(layout)
        self.overrides = self.forwards.seen
        """Layers with an instance-level ``forward`` seen so far, and the hazard that keeps
        them from being replayed (``None``: replayed on the live module)."""
        self._stack = json.dumps([torch.__version__, str(torch.backends.cpu.get_cpu_capability())])
        self.last_timing: tuple[int | None, float | None] = (None, None)
        """This rank's last work key and ``t_M`` (None: not replayed), for its timing pool."""
        self.kept: Kept | None = None
        """The last round's state, for a referee phase (:meth:`release` drops it)."""
        self._referee_digest: int | None = None
        self._params: dict[str, torch.Tensor] | None = None

    def run(
        self,
        recipe: Recipe,
        step: int,
        *,
        capture: Capture | bool | None = True,
        counts: control.Counts | None = None,
    ) -> RoundOutcome:
        """One round of ``recipe`` at ``step``. Collective over the peer group.

        ``capture``: ``True`` takes this iteration's from the capturer, else an explicit one
        (a kept capture for the full-catalog sweep) or None; ``counts``: this rank's
        control-flow counts since the last round."""
        assert recipe.path is not None
        ref = self.modules[recipe.path]
        self.last_timing = (None, None)
        self.release()
        if capture is True:
            cap = self.capturer.take(recipe.path)
        else:
            cap = capture if isinstance(capture, Capture) else None
        group = self.peers.ranks
        ready = self._readiness(recipe, step, ref, cap, counts)
        meta = ready[f"{recipe.name}/ready"]
        split = control.diverged(recipe.name, ready)
        ok = meta.status is Status.AGREE and cap is not None and not split
        # Every rank takes part in the AND, ready or not, before anyone returns.
        all_ok = all_ready(ok, [g.pg for g in self.closure]) if self.closure else ok
        if ok and not all_ok:
            reason = "a gather partner's replica group is not ready"
            return RoundOutcome(recipe, step, group, False, dict(ready), reason)
        if not ok or cap is None:
            if split:
                reason = "control flow diverged"
            elif None in meta.evidence:
                reason = "capture missing on some peer"
            else:
                reason = "peers differ"
            return RoundOutcome(recipe, step, group, False, dict(ready), reason)
        threads = self.threads or int(
            min(int(e) for e in ready[f"{recipe.name}/threads"].evidence if isinstance(e, int))
        )
        src = group[step % len(group)]
        received, t_bcast = self._broadcast(cap, src)
        values = self._replay(ref, cap, received, threads)
        t_m = values.get("t_M")
        if isinstance(t_m, float):
            self.last_timing = (self._work_key(recipe, ref, cap), t_m)
        referee = self._referee_digest
        if self._params is not None and referee is not None and not values.get("gap"):
            self.kept = Kept(recipe, step, ref, cap, received, self._params, referee, threads)
        self._params = None
        names = SURFACES if self.local_shards is None else ("shard", *SURFACES)
        surfaces = [
            Surface(f"{recipe.name}/{name}", Mode.EXACT, values.get(name)) for name in names
        ]
        if recipe.kind == ROUTER:
            for surface, key in ROUTER_SURFACES:
                surfaces.append(Surface(f"{recipe.name}/{surface}", Mode.EXACT, values.get(key)))
        surfaces.append(Surface(f"{recipe.name}/gap", Mode.EXACT, values.get("gap", 0)))
        surfaces.append(Surface(f"{recipe.name}/t_M", Mode.STATISTICAL, values.get("t_M")))
        surfaces.append(Surface(f"{recipe.name}/t_bcast", Mode.STATISTICAL, t_bcast))
        if self.gathered:
            surfaces.append(
                Surface(f"{recipe.name}/t_gather", Mode.STATISTICAL, values.get("t_gather"))
            )
        results = exchange(surfaces, group=self.peers.pg, ranks=group, kappa=self.kappa)
        return RoundOutcome(recipe, step, group, True, {**ready, **results}, source=src)

    @staticmethod
    def _work_key(recipe: Recipe, ref: ModuleRef, cap: Capture) -> int:
        """What this round's replay costs (:func:`scout_core.decision.pools.work_key`)."""
        params = list(ref.module.parameters())
        return work_key(
            kind=recipe.kind,
            module_class=f"{type(ref.module).__module__}.{type(ref.module).__qualname__}",
            params=[(str(p.dtype), tuple(p.shape)) for p in params],
            inputs=[leaf_meta(x) for x in cap.leaves],
            device=params[0].device.type if params else "cpu",
        )

    def _readiness(
        self,
        recipe: Recipe,
        step: int,
        ref: ModuleRef,
        cap: Capture | None,
        counts: control.Counts | None,
    ) -> dict[str, C3Result]:
        digest: int | None = None
        self._referee_digest = None
        if cap is not None:
            fields = readiness_fields(
                recipe, step, ref, cap, variants=self.variants, stack=self._stack
            )
            digest = digest_of(fields)
            self._referee_digest = digest_of(referee_fields(fields, recipe, ref))
        surfaces = [
            Surface(f"{recipe.name}/ready", Mode.EXACT, digest),
            Surface(f"{recipe.name}/threads", Mode.EXACT, self.threads or torch.get_num_threads()),
            *control.surfaces(recipe.name, counts),
        ]
        return exchange(surfaces, group=self.peers.pg, ranks=self.peers.ranks, kappa=self.kappa)

    def _broadcast(self, cap: Capture, src: int) -> tuple[Inputs, float]:
        tensors = [x for x in cap.leaves if isinstance(x, torch.Tensor)]
        grads = [g for g in cap.grads if g is not None]
        rng_names = sorted(cap.rng)
        like = tensors + grads + [cap.rng[k] for k in rng_names]
        device = payload_device(self.peers, like)
        if dist.get_rank() == src:
            buf = pack(like, device=device)
        else:
            size = sum(t.numel() * t.element_size() for t in like)
            buf = torch.empty(size, dtype=torch.uint8, device=device)
        t_bcast = timed_broadcast(buf, src, self.peers)
        got = unpack(buf, like)
        it = iter(got[: len(tensors)])
        leaves = [next(it) if isinstance(x, torch.Tensor) else x for x in cap.leaves]
        git = iter(got[len(tensors) : len(tensors) + len(grads)])
        grads_out: list[torch.Tensor | None] = [
            next(git) if g is not None else None for g in cap.grads
        ]
        rng = dict(zip(rng_names, got[len(tensors) + len(grads) :], strict=True))
        return Inputs(leaves, grads_out, rng), t_bcast

    def _replay(self, ref: ModuleRef, cap: Capture, got: Inputs, threads: int) -> dict[str, Any]:
        values: dict[str, Any] = {}
        values["received"] = sign(
            [x for x in got.leaves if isinstance(x, torch.Tensor)]
            + list(got.grads)
            + [got.rng[k] for k in sorted(got.rng)]
        )
        if self.local_shards is not None:
            values["shard"] = sign(self.local_shards(ref))
        try:
            timer = Interval()
            with timer.timing(), self.materialize(ref) as full:
                params = dict(full)
            if self.gathered:
                values["t_gather"] = timer.seconds
            values["params"] = sign(params[k] for k in sorted(params))
            self._params = params
            call = self._call_for(ref)
            if call is None:
                values["gap"] = int(Gap.TRAINING_COLLECTIVE)
                return values
            self.capturer.replaying = True
            try:
                computed = replay_module(
                    ref.module,
                    cap,
                    got,
                    params,
                    call=call,
                    variants=self.variants,
                    rng=self.rng,
                    deterministic=self.deterministic,
                    threads=threads,
                )
            finally:
                self.capturer.replaying = False
        except ConfigError as exc:  # a refusal (cuBLAS workspace): loud, never routine
            log.error("replay of %s refused on this rank: %s", ref.path, exc)
            values["gap"] = int(Gap.RAISED)
            return values
        except Exception as exc:  # evidence goes missing; peers read inconclusive
            log.warning("replay of %s failed on this rank: %s", ref.path, exc)
            values["gap"] = int(Gap.RAISED)
            return values
        values.update(computed)
        return values

    # -- the referee phase (:mod:`.referee`) ---------------------------------------------

    def release(self) -> None:
        """Drop the last round's kept state."""
        self.kept = None
        self._referee_digest = None
        self._params = None

    def shipment(self, step: int) -> Shipment | None:
        """What this rank, a pair's source, ships to the referee: its round at ``step``."""
        return None if self.kept is None else self.kept.shipment(step)

    def expected(self, step: int) -> Expected | None:
        """What a shipment for this rank's own round at ``step`` must look like (None: no round)."""
        return None if self.kept is None else self.kept.expected(step)

    def recompute(
        self,
        params: dict[str, torch.Tensor],
        inputs: Sequence[torch.Tensor],
        grads: Sequence[torch.Tensor],
        rng: dict[str, torch.Tensor],
        threads: int,
    ) -> dict[str, Any] | Refusal:
        """Replay this rank's kept round on shipped state (a referee's work): the
        computed surfaces, or why it cannot."""
        kept = self.kept
        if kept is None:
            return Refusal.NO_CAPTURE
        ref, cap = kept.ref, kept.cap
        call = self._call_for(ref)
        if call is None:
            return Refusal.NOT_REPLAYABLE
        where = next((p.device for p in kept.params.values()), torch.device("cpu"))
        it = iter(inputs)
        leaves = [next(it).to(x.device) if isinstance(x, torch.Tensor) else x for x in cap.leaves]
        git = iter(grads)
        grads_out: list[torch.Tensor | None] = [
            next(git).to(g.device) if g is not None else None for g in cap.grads
        ]
        states = {k: v.to(cap.rng[k].device) for k, v in rng.items()}
        # The referee's own copies say which parameters take a gradient, and their order
        # (the source's: the same class), not the wire's sorted one: the parameter
        # gradients are signed as a list in this order.
        weights = {
            k: params[k].to(where).detach().requires_grad_(mine.requires_grad)
            for k, mine in kept.params.items()
        }
        self.capturer.replaying = True
        try:
            return replay_module(
                ref.module,
                cap,
                Inputs(leaves, grads_out, states),
                weights,
                call=call,
                variants=self.variants,
                rng=self.rng,
                deterministic=self.deterministic,
                threads=threads,
            )
        except Exception as exc:  # no testimony, never a failure of the job
            log.warning("referee replay of %s failed on this rank: %s", ref.path, exc)
            return Refusal.RAISED
        finally:
            self.capturer.replaying = False

    def announce(self) -> dict[str, str | None]:
        """Say once which layers have an instance-level ``forward`` (:mod:`.overrides`)."""
        return self.forwards.announce(self.modules)

    def _call_for(self, ref: ModuleRef) -> Call | None:
        return self.forwards.call_for(ref.path, ref.module, call=self.call, live=functional_call)
