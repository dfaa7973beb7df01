"""The replay driver: the step clock, and the per-step logic that runs due recipes.

One driver per session. It builds SCOUT's diagnostic peer groups from the adapter's
layout, the recipe :class:`~scout_core.replay.schedule.Schedule`, the capturer, the
layer and optimizer runners and the verdict maker, and owns the job's one step
clock (:class:`~scout_core.replay.boundary.StepClock` over every optimizer the
adapter lists): before an optimizer's first step of an iteration it snapshots the
optimizer slice, and at the iteration's *replay boundary* it runs the due recipes,
delivers their verdicts and publishes one :class:`~scout_core.replay.boundary.Boundary`
to its subscribers (the checkpoint gate, the observer, plugins). It only talks to
the framework through the :class:`~scout_core.integration.adapter.FrameworkAdapter`
protocol, so every plugin reuses it; nothing else writes into it.

[The full-catalog sweep]
:meth:`ReplayDriver.sweep` runs a list of catalog recipes *now* (recovery after a
hang asks for it). Layer recipes replay on the last complete capture of each layer
(the capturer keeps them once :meth:`ReplayDriver.keep_captures` is on), restamped
with the sweep's step so every peer agrees on readiness; a layer never captured
reads inconclusive. The optimizer recipe cannot be replayed without a pre-step
snapshot, so the sweep compares the full local optimizer state and parameters
across replica peers instead (exact surface ``optimizer/state``).
"""

from __future__ import annotations

import dataclasses
import logging
import socket
from collections import deque
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from scout_core.config import Config
from scout_core.decision.agreement import all_gather_single, any_flag
from scout_core.decision.c3 import Surface, exchange
from scout_core.decision.signature import signature_many
from scout_core.errors import ConfigError, UnsupportedSetupError
from scout_core.integration.adapter import FrameworkAdapter
from scout_core.records.evidence import EvidenceWriter, Record
from scout_core.replay.all_to_all import AllToAllRunner
from scout_core.replay.boundary import Boundary, BoundaryEvents, StepClock
from scout_core.replay.capture import Capturer
from scout_core.replay.control import ControlFlow
from scout_core.replay.custody import Custody
from scout_core.replay.experts import ExpertRunner
from scout_core.replay.moe_tracks import moe_recipes
from scout_core.replay.optimizer import OptimizerReplay
from scout_core.replay.pools import TimingPools
from scout_core.replay.referee import RefereeDesk, RefereeLink, apply_finding, wants_referee
from scout_core.replay.runner import LayerRunner, RoundOutcome
from scout_core.replay.schedule import (
    ALL_TO_ALL,
    EMBEDDING,
    EXPERTS,
    HIDDEN,
    LM_HEAD,
    OPTIMIZER,
    Recipe,
    Schedule,
)
from scout_core.replay.scope import check_cublas_workspace
from scout_core.replay.verdicts import VerdictMaker
from scout_core.topology.groups import PeerGroup, create_peer_groups, diagnostic_group
from scout_core.topology.mesh import Axis, MeshLayout
from scout_core.topology.shards import local_shard
from scout_core.vocabulary import Mode

__all__ = ["ReplayDriver", "exchange_hosts"]

log = logging.getLogger(__name__)

HISTORY = 256
"""Round outcomes the driver keeps (:attr:`ReplayDriver.history`): a long run must not grow."""

_NO_RECIPES: tuple[Recipe, ...] = ()
_NO_ROUNDS: tuple[RoundOutcome, ...] = ()


class ReplayDriver:
    """The hooks and per-step logic of replay; one per session."""

    _custody: tuple[Record, ...] = ()
    """This rank's first custody verdict since the last restore (for the gate)."""

    def __init__(
        self,
        adapter: FrameworkAdapter,
        config: Config,
        writer: EvidenceWriter,
        *,
        on_verdict: Callable[[Record], None] = lambda record: None,
    ) -> None:
        self.adapter = adapter
        self.config = config
        self.writer = writer
        self._on_verdict = on_verdict
        layout = adapter.layout()
        fsdp = layout.size(Axis.S) > 1
        tp = layout.size(Axis.T) > 1
        groups, self.hosts, job = _make_groups(adapter, config)
        self.peers: PeerGroup = groups["peer"]
        adapter.bind_groups(groups)
        self.optimizers = list(adapter.optimizers())
        if not self.optimizers:
            raise UnsupportedSetupError(
                f"replay needs at least one torch.optim.Optimizer; the {adapter.name} adapter "
                "lists none"
            )
        layers = list(adapter.repeated_layers())
        special = adapter.special_modules()
        embedding, lm_head = special.get("embedding"), special.get("lm_head")
        if not layers and HIDDEN in config.recipes:
            # Named layers that do not exist raise at discovery; an auto-detection that
            # found nothing must not switch the main recipe off in silence.
            log.warning(
                "found no repeated layers in the %s model (no ModuleList or ModuleDict of "
                "same-class blocks), so hidden-layer replay is off; found embedding %s, "
                "LM head %s. Name the blocks with the config key 'layers' (e.g. "
                "layers = \"model.layers\"), or leave 'hidden' out of 'recipes' to say so.",
                adapter.name,
                embedding.path if embedding else "none",
                lm_head.path if lm_head else "none",
            )
        keep = bool(getattr(adapter, "replays_ep_blocks", False))
        moe = moe_recipes(layers, special, layout, config, keep_ep_blocks=keep)
        layers, routers = moe.layers, moe.routers
        refs = {r.path: r for r in [*layers, *routers]}
        for extra in (embedding, lm_head):
            if extra is not None:
                refs[extra.path] = extra
        self.schedule = Schedule(
            layers=[r.path for r in layers],
            embedding=embedding.path if embedding else None,
            lm_head=lm_head.path if lm_head else None,
            optimizer=True,
            intervals={
                HIDDEN: config.replay_interval,
                EMBEDDING: config.embedding_interval,
                LM_HEAD: config.lm_head_interval,
                OPTIMIZER: config.optimizer_interval,
            },
            recipes=config.recipes,
            variants=len(config.variants),
            spread=config.spread_recipes,
            tracks=moe.tracks,
        )
        # Each pooled recipe kind's timing pool where it is wider than the peer group, and
        # referee replay (:mod:`.referee`): a third rank for a pair that disagrees.
        self.pools, self.referees = _pools(layout, adapter.rank(), self.schedule, job, config)
        self.capturer = Capturer(refs.values(), adapter.rng_streams())
        marker = embedding or (layers[0] if layers else lm_head)
        self.control = ControlFlow(
            marker.module if marker is not None else None,
            replaying=lambda: self.capturer.replaying,
        )
        self.runner = LayerRunner(
            peers=self.peers,
            modules=refs,
            capturer=self.capturer,
            rng_streams=adapter.rng_streams(),
            materialize=adapter.materialize,
            variants=config.variants,
            kappa=config.kappa,
            layout=layout,
            deterministic=config.deterministic,
            threads=config.replay_threads,
            gathered=fsdp or tp,
            call=adapter.call,
            # Replica peers hold equal local shards: comparing them first keeps a shard
            # partner, whose gathered parameters inherit the corruption, from being named.
            local_shards=(
                adapter.local_shards if (fsdp or tp) and self.peers.kind == "replica" else None
            ),
            closure=[g for k, g in groups.items() if k != "peer" and g.ranks != self.peers.ranks],
        )
        self.experts = ExpertRunner(
            peers=self.peers,
            targets=moe.experts,
            materialize=adapter.materialize,
            call=adapter.call,
            variants=config.variants,
            kappa=config.kappa,
            deterministic=config.deterministic,
            threads=config.replay_threads,
        )
        self.all_to_all = AllToAllRunner(
            peers=self.peers, ep=groups.get("e"), targets=moe.all_to_all, kappa=config.kappa
        )
        self.opt = OptimizerReplay(
            self.optimizers,
            self.peers,
            slice_size=config.optimizer_slice,
            kappa=config.kappa,
            ownership=adapter.optimizer_ownership(),
        )
        # The group a slow t_gather points at: the shard group under FSDP, else the TP group.
        comm_of: dict[int, tuple[str, tuple[int, ...]]] = {}
        if fsdp or tp:
            kind, axis = ("shard", Axis.S) if fsdp else ("tp", Axis.T)
            comm_of = {r: (kind, layout.group_along(r, (axis,))) for r in layout.ranks}
        self.verdicts = VerdictMaker(
            run_id=config.resolved_run_id(),
            hosts=self.hosts,
            rounds=config.straggler_rounds,
            min_excess_s=config.straggler_min_excess_s,
            min_ratio=config.straggler_min_ratio,
            kappa=config.kappa,
            peer_of=lambda r: layout.group_along(r, layout.axes_for("peer")),
            rank=adapter.rank(),
            # A slow t_a2a (all-to-all replay) points at the rank's EP group.
            comm_group_of=lambda leaf, r: (
                ("ep", layout.group_along(r, (Axis.E,))) if leaf == "t_a2a" else comm_of.get(r)
            ),
            peer_kind=self.peers.kind,
        )
        self.peer_size = len(self.peers.ranks)
        self.history: deque[RoundOutcome] = deque(maxlen=HISTORY)
        """This rank's most recent round outcomes, oldest first (bounded)."""
        self.events = BoundaryEvents()
        self._step = 0
        self._warned_extra = False
        # Custody's post-hook runs before the clock's: it signs what iteration `step`
        # wrote, under that step's number, before the boundary moves the clock on.
        self.custody = Custody(
            self.optimizers,
            slices=config.custody_slices,
            every=config.custody_every,
            step=lambda: self._step,
        )
        self.clock = StepClock(
            self.optimizers,
            list(adapter.steps_per_iteration()),
            pre=self._pre_step,
            boundary=self._boundary,
        )
        self.capturer.arm(0, self.schedule.modules_due(0))
        self.runner.announce()
        log.info(
            "replay on %s group %s, catalog K=%d, estimated overhead V/(I*N)=%.4f%%",
            self.peers.kind,
            list(self.peers.ranks),
            self.schedule.catalog_size,
            100 * self.schedule.overhead_estimate(),
        )

    @property
    def step(self) -> int:
        """The current iteration (0-based): the boundaries passed so far."""
        return self._step

    def on_boundary(self, fn: Callable[[Boundary], None]) -> Callable[[], None]:
        """Call ``fn`` with every :class:`Boundary` from now on; returns the remover."""
        return self.events.subscribe(fn)

    def keep_captures(self, enabled: bool = True) -> None:
        """Keep the last complete capture of each layer, for :meth:`sweep`."""
        self.capturer.keep_last(enabled)

    def resume_at(self, step: int) -> None:
        """Training continues with iteration ``step`` (after a restore); re-arms capture."""
        self._step = step
        self.clock.reset()
        self.custody.forget()
        self._custody = ()
        self.control.take()
        due = self.schedule.modules_due(step) if self.schedule.any_due(step) else ()
        self.capturer.arm(step, due)

    def close(self) -> None:
        self.custody.close()
        self.clock.close()
        self.control.close()
        self.capturer.close()
        self.adapter.close()

    # The clock calls these on every iteration; on a step where nothing is due they
    # cost one modulo per active interval and allocate nothing.

    def _pre_step(self, which: int) -> None:
        step = self._step
        if self.peer_size < 2 or not self.schedule.any_due(step) or not self.control.iterating:
            return
        for recipe in self.schedule.due(step, optimizer_slices=self.opt.slices()):
            if recipe.kind == OPTIMIZER:
                self.opt.snapshot(recipe.index, which, step=step)

    def _boundary(self) -> None:
        step = self._step
        if self.control.boundary():
            # An optimizer step without a training forward since the last one: no new
            # iteration. The clock stays, so this rank enters replay collectives at the
            # same iterations as its peers; the next round reports the extra step.
            if not self._warned_extra:
                log.warning(
                    "an optimizer step without a training forward since the previous "
                    "one (an extra step); the step clock stays at iteration %d",
                    step,
                )
                self._warned_extra = True
            return
        due, rounds = _NO_RECIPES, _NO_ROUNDS
        if self.schedule.any_due(step):
            due = tuple(self.schedule.due(step, optimizer_slices=self.opt.slices()))
            if self.peer_size >= 2:
                # Replay takes gradients; a framework may step its optimizer, and so
                # fire the boundary, under torch.no_grad() (Megatron's optimizer.step).
                with torch.enable_grad():
                    rounds = tuple(self._run(due, step))
        self._custody_verdicts()
        self._step = step + 1
        if self.schedule.any_due(step + 1):
            self.capturer.arm(step + 1, self.schedule.modules_due(step + 1))
        elif self.capturer.armed:
            self.capturer.arm(step + 1, ())
        self.events.publish(Boundary(step, due, rounds, self._custody))

    def _custody_verdicts(self) -> None:
        """Deliver this rank's custody violations found since the last boundary; the
        first is kept for the gate until a restore (:attr:`Boundary.custody`)."""
        found = self.custody.collect()
        if not found:
            return
        records = self.custody.records(
            found, run_id=self.verdicts.run_id, rank=self.adapter.rank(), hosts=self.hosts
        )
        for record in records:
            self._deliver(record)
        if not self._custody:
            self._custody = (records[0],)

    def _run(self, due: Sequence[Recipe], step: int) -> list[RoundOutcome]:
        out: list[RoundOutcome] = []
        counts = self.control.take()
        for recipe in due:
            if recipe.kind == OPTIMIZER:
                outcome: RoundOutcome | None = self.opt.run(step, counts=counts)
            elif recipe.kind == EXPERTS:
                outcome = self.experts.run(recipe, step)
            elif recipe.kind == ALL_TO_ALL:
                outcome = self.all_to_all.run(recipe, step)
            else:
                outcome = self.runner.run(recipe, step, counts=counts)
                asks = wants_referee(recipe.name, outcome.results, outcome.ready)
                if self.pools.ranks_for(recipe) is not None:
                    # every pool member, ready or not: its work key, t_M and referee flag,
                    # one all-gather
                    outcome.pool = self.pools.exchange(
                        recipe, *self.runner.last_timing, asking=bool(asks)
                    )
                # Only where some pair of the pool asked: a healthy round does nothing here.
                finding = self.referees.settle(outcome, asks, self.runner)
                if finding is not None:
                    apply_finding(outcome, finding)
                self.runner.release()
            if outcome is None:
                continue
            out.append(outcome)
            self.history.append(outcome)
            for record in self.verdicts.judge(outcome):
                self._deliver(record)
        return out

    def _deliver(self, record: Record) -> None:
        # A group's record is written once, by its lowest rank; a record about another
        # group (a slow shard group seen from a replica group) by that group's members.
        if not record.group:
            self.writer.write(record)
        elif self.writer.rank in record.group:
            self.writer.write_group(record)
        self._on_verdict(record)

    # -- the full-catalog sweep ----------------------------------------------------------

    def sweep(self, recipes: Sequence[Recipe]) -> list[RoundOutcome]:
        """Run ``recipes`` now, on kept captures (see the module doc). Collective over the
        job: every rank runs the same recipes in the same order. Empty without peers."""
        if self.peer_size < 2:
            return []
        step = self._step
        rounds: list[RoundOutcome] = []
        for recipe in recipes:
            if recipe.kind == OPTIMIZER:
                rounds.append(self._optimizer_state_round(recipe, step))
                continue
            if recipe.kind == EXPERTS:  # synthetic inputs: no capture needed
                rounds.append(self.experts.run(recipe, step))
                continue
            if recipe.kind == ALL_TO_ALL:
                rounds.append(self.all_to_all.run(recipe, step))
                continue
            assert recipe.path is not None
            kept = self.capturer.last(recipe.path)
            # Restamped with the sweep's step: every peer kept the same capture step for
            # this layer (the schedule is global), so readiness still agrees.
            cap = None if kept is None else dataclasses.replace(kept, step=step)
            rounds.append(self.runner.run(recipe, step, capture=cap))
        self.runner.release()
        return rounds

    def _optimizer_state_round(self, recipe: Recipe, step: int) -> RoundOutcome:
        """Exact C3 of the whole local optimizer state and parameters across replica peers."""
        tensors: list[torch.Tensor] = []
        for opt in self.optimizers:
            held = [p for g in opt.param_groups for p in g["params"]]
            tensors += [local_shard(p.detach()) for p in held]
            for p in held:
                state = opt.state.get(p, {})
                for key in sorted(state):
                    value = state[key]
                    if isinstance(value, torch.Tensor):
                        tensors.append(local_shard(value.detach()))
        surface = Surface("optimizer/state", Mode.EXACT, signature_many(tensors))
        results = exchange(
            [surface], group=self.peers.pg, ranks=self.peers.ranks, kappa=self.config.kappa
        )
        return RoundOutcome(recipe, step, self.peers.ranks, True, results)


def _pools(
    layout: MeshLayout, rank: int, schedule: Schedule, job: dist.ProcessGroup, config: Config
) -> tuple[TimingPools, RefereeDesk]:
    """The timing pools (:mod:`.pools`) and this rank's referee desk, with a link on each
    pool's referee group (:mod:`.referee`). Collective over the job."""
    timeout_s = config.referee_timeout_s
    pools = TimingPools.create(
        layout, rank, schedule, job, kappa=config.kappa, referee_timeout_s=timeout_s
    )
    links = {
        kind: RefereeLink(pool.referee_pg, timeout_s)
        for kind, pool in pools.pools.items()
        if pool.referee_pg is not None
    }
    return pools, RefereeDesk(rank, layout.groups(layout.axes_for("peer")), links)


def _make_groups(
    adapter: FrameworkAdapter, config: Config
) -> tuple[dict[str, PeerGroup], dict[int, str], dist.ProcessGroup]:
    """SCOUT's diagnostic groups for this layout, every rank's host and SCOUT's job-wide
    group. Collective.

    Refuses (:class:`ConfigError`, on every rank together) deterministic replay on
    CUDA that cuBLAS could not honour (:func:`.scope.check_cublas_workspace`).
    """
    layout = adapter.layout()
    kinds = ["peer"]
    if layout.size(Axis.S) > 1 and layout.size(Axis.D) > 1:
        kinds.append("shard")
    if layout.size(Axis.T) > 1:
        kinds.append("t")  # TP shards are gathered on SCOUT's own TP group
    # Context/sequence and expert partners exchange activations inside a replayed
    # block (all-to-all on SCOUT's copies of their groups), so readiness must hold
    # across those groups too, or a ready group would wait on an unready partner.
    kinds.extend(k for k, axis in (("c", Axis.C), ("e", Axis.E)) if layout.size(axis) > 1)
    job = diagnostic_group(list(layout.ranks))
    hosts = exchange_hosts(layout, job)
    on_cuda = _on_cuda(adapter)
    refusal = check_cublas_workspace(uses_cuda=on_cuda, deterministic=config.deterministic)
    if any_flag(refusal is not None, job):  # every rank refuses together
        raise ConfigError(refusal or "another rank cannot run deterministic CUDA replay")
    payload = _payload_backend(on_cuda)
    groups = create_peer_groups(layout, adapter.rank(), kinds, payload_backend=payload)
    return groups, hosts, job


def _on_cuda(adapter: FrameworkAdapter) -> bool:
    """Whether the replayed modules' parameters live on a CUDA device."""
    for ref in adapter.repeated_layers():
        for p in ref.module.parameters():
            return p.device.type == "cuda"
    return False


def _payload_backend(on_cuda: bool) -> str | None:
    """NCCL payload groups when the job itself trains over NCCL on CUDA (one device per
    rank); else None: payloads travel through host memory on the Gloo groups (ranks
    that share one GPU over Gloo, and every CPU job)."""
    if not (on_cuda and dist.is_nccl_available()):
        return None
    return "nccl" if "nccl" in str(dist.get_backend()).lower() else None


def exchange_hosts(layout: MeshLayout, group: dist.ProcessGroup | None = None) -> dict[int, str]:
    """Every rank's host name, exchanged as fixed-width bytes on a diagnostic group."""
    ranks = list(layout.ranks)
    group = diagnostic_group(ranks) if group is None else group
    name = socket.gethostname().encode()[:64]
    mine = torch.zeros(64, dtype=torch.uint8)
    mine[: len(name)] = torch.tensor(list(name), dtype=torch.uint8)
    out = torch.empty(64 * len(ranks), dtype=torch.uint8)
    all_gather_single()(out, mine, group=group)
    rows = out.view(len(ranks), 64).tolist()
    return {
        r: bytes(b for b in row if b).decode(errors="replace")
        for r, row in zip(ranks, rows, strict=True)
    }
