"""The replay driver: the step clock, and the per-step logic that runs due recipes.

Contract: one driver per session builds SCOUT's diagnostic groups (:mod:`.setup_groups`), the
schedule, the capturer, the runners and the verdict maker from the adapter's layout, and owns
the job's one step clock over every optimizer the adapter lists. Before an optimizer's first
step of an iteration it snapshots the optimizer slice; at the iteration's replay boundary it
runs the due recipes, delivers their verdicts and publishes one :class:`~.boundary.Boundary`.
:meth:`ReplayDriver.sweep` runs catalog recipes now, on the last kept captures. It talks to
the framework only through the adapter protocol. Docs: docs/replay.md; the sweep:
docs/checkpoint_gate.md, "What the wiring does".
"""

from __future__ import annotations

import dataclasses
import logging
from collections import deque
from collections.abc import Callable, Sequence

import torch

from scout_core.config import Config
from scout_core.decision.c3 import Surface, exchange
from scout_core.decision.signature import signature_many
from scout_core.errors import UnsupportedSetupError
from scout_core.integration.adapter import FrameworkAdapter
from scout_core.records.evidence import EvidenceWriter
from scout_core.records.record import Record
from scout_core.replay.all_to_all import AllToAllRunner
from scout_core.replay.boundary import Boundary, BoundaryEvents, StepClock
from scout_core.replay.buddy import BuddyReplay
from scout_core.replay.capture import Capturer
from scout_core.replay.control import ControlFlow
from scout_core.replay.custody import Custody
from scout_core.replay.experts import ExpertRunner
from scout_core.replay.moe_tracks import moe_recipes
from scout_core.replay.optimizer import OptimizerReplay
from scout_core.replay.referee import apply_finding, wants_referee
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
from scout_core.replay.setup_groups import make_groups, setup_pools
from scout_core.replay.verdicts import VerdictMaker
from scout_core.topology.groups import PeerGroup
from scout_core.topology.mesh import Axis
from scout_core.topology.shards import local_shard
from scout_core.vocabulary import Mode

__all__ = ["ReplayDriver"]

log = logging.getLogger(__name__)

HISTORY = 256
"""Round outcomes the driver keeps (:attr:`ReplayDriver.history`): a long run must not grow."""

_NO_RECIPES: tuple[Recipe, ...] = ()
_NO_ROUNDS: tuple[RoundOutcome, ...] = ()


class ReplayDriver:
    """The hooks and per-step logic of replay; one per session."""

    _custody: tuple[Record, ...] = ()
    """This rank's first custody or buddy verdict since the last restore (for the gate)."""

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
        groups, self.hosts, job = make_groups(adapter, config)
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
        self.pools, self.referees = setup_pools(layout, adapter.rank(), self.schedule, job, config)
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
        self.buddy = BuddyReplay(self.opt, self.peers, job, layout.ranks)
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
            # An extra optimizer step (:mod:`.control`): the clock stays at this iteration.
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
        me = self.adapter.rank()
        for recipe in due:
            if recipe.kind == OPTIMIZER and not self.opt.supported:
                outcome: RoundOutcome | None = self.buddy.run(step)
            elif recipe.kind == OPTIMIZER:
                outcome = self.opt.run(step, counts=counts)
            elif recipe.kind == EXPERTS:
                outcome = self.experts.run(recipe, step)
            elif recipe.kind == ALL_TO_ALL:
                outcome = self.all_to_all.run(recipe, step)
            else:
                outcome = self.runner.run(recipe, step, counts=counts)
                asks = wants_referee(recipe.name, outcome.results, outcome.ready)
                if self.pools.ranks_for(recipe) is not None:
                    # every pool member, ready or not (:meth:`.pools.TimingPools.exchange`)
                    outcome.pool = self.pools.exchange(
                        recipe, *self.runner.last_timing, asking=bool(asks)
                    )
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
                if recipe.kind == OPTIMIZER and not self.opt.supported and me in record.outliers:
                    # a buddy verdict: outside the gate's catalog, kept like custody's
                    self._custody = self._custody or (record,)
        return out

    def _deliver(self, record: Record) -> None:
        # A group's record is written once, by its lowest rank; a record about another
        # group (a slow shard group seen from a replica group) by that group's members.
        if not record.group:
            self.writer.write(record)
        elif self.writer.rank in record.group:
            self.writer.write_group(record)
        self._on_verdict(record)

    def sweep(self, recipes: Sequence[Recipe]) -> list[RoundOutcome]:
        """Run ``recipes`` now, on kept captures (see docs/checkpoint_gate.md). Collective over the
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
