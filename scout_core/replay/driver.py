"""The replay driver: the per-step logic that runs due recipes at the replay boundary.

One driver per session. It builds SCOUT's diagnostic peer groups from the adapter's
layout, the recipe :class:`~scout_core.replay.schedule.Schedule`, the capturer, the
layer and optimizer runners and the verdict maker, and hooks the adapter's
optimizer: a step pre-hook snapshots the optimizer slice, a step post-hook is the
*replay boundary*. It only talks to the framework through the
:class:`~scout_core.integration.adapter.FrameworkAdapter` protocol, so every plugin reuses it.
"""

from __future__ import annotations

import logging
import socket
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from scout_core.config import Config
from scout_core.errors import UnsupportedSetupError
from scout_core.integration.adapter import FrameworkAdapter
from scout_core.records.evidence import EvidenceWriter
from scout_core.replay.capture import Capturer
from scout_core.replay.optimizer import OptimizerReplay
from scout_core.replay.runner import LayerRunner
from scout_core.replay.schedule import EMBEDDING, HIDDEN, LM_HEAD, OPTIMIZER, Schedule
from scout_core.replay.verdicts import VerdictMaker
from scout_core.topology.groups import PeerGroup, create_peer_groups
from scout_core.topology.mesh import Axis, MeshLayout

if TYPE_CHECKING:
    from scout_core.session import Session

__all__ = ["ReplayDriver", "exchange_hosts"]

log = logging.getLogger("scout")


class ReplayDriver:
    """The hooks and per-step logic of replay; one per session."""

    def __init__(
        self,
        session: Session,
        adapter: FrameworkAdapter,
        config: Config,
        writer: EvidenceWriter,
    ) -> None:
        self.session = session
        self.adapter = adapter
        self.writer = writer
        layout = adapter.layout()
        rank = adapter.rank()
        kinds = ["peer"]
        fsdp = layout.size(Axis.S) > 1
        tp = layout.size(Axis.T) > 1
        if fsdp and layout.size(Axis.D) > 1:
            kinds.append("shard")
        if tp:
            kinds.append("t")  # TP shards are gathered on SCOUT's own TP group
        # Context/sequence and expert partners exchange activations inside a replayed
        # block (all-to-all on SCOUT's copies of their groups), so readiness must hold
        # across those groups too, or a ready group would wait on an unready partner.
        kinds.extend(k for k, axis in (("c", Axis.C), ("e", Axis.E)) if layout.size(axis) > 1)
        groups = create_peer_groups(layout, rank, kinds)
        self.hosts = exchange_hosts(layout)
        self.peers: PeerGroup = groups["peer"]
        adapter.bind_groups(groups)
        optimizers = list(adapter.optimizers())
        if len(optimizers) != 1:
            raise UnsupportedSetupError(
                f"replay watches exactly one torch.optim.Optimizer, the {adapter.name} adapter "
                f"reports {len(optimizers)}"
            )
        self.optimizer = optimizers[0]
        layers = list(adapter.repeated_layers())
        special = adapter.special_modules()
        embedding, lm_head = special.get("embedding"), special.get("lm_head")
        refs = {r.path: r for r in layers}
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
        )
        self.capturer = Capturer(refs.values(), adapter.rng_streams())
        self.runner = LayerRunner(
            peers=self.peers,
            modules=refs,
            capturer=self.capturer,
            rng_streams=adapter.rng_streams(),
            materialize=adapter.materialize,
            variants=config.variants,
            kappa=config.kappa,
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
        self.opt = OptimizerReplay(
            self.optimizer,
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
            comm_group_of=lambda kind, r: comm_of.get(r),
            peer_kind=self.peers.kind,
        )
        self.peer_size = len(self.peers.ranks)
        self._handles = [
            self.optimizer.register_step_pre_hook(self._pre_step),
            self.optimizer.register_step_post_hook(self._post_step),
        ]
        self.capturer.arm(0, self.schedule.modules_due(0))
        log.info(
            "scout: replay on %s group %s, catalog K=%d, estimated overhead V/(I*N)=%.4f%%",
            self.peers.kind,
            list(self.peers.ranks),
            self.schedule.catalog_size,
            100 * self.schedule.overhead_estimate(),
        )

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self.capturer.close()
        self.adapter.close()

    # The two step hooks run on every iteration; on a step where nothing is due they
    # cost one modulo per active interval and allocate nothing.

    def _pre_step(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        step = self.session.step
        if self.peer_size < 2 or not self.schedule.any_due(step):
            return
        for recipe in self.schedule.due(step, optimizer_slices=self.opt.slices()):
            if recipe.kind == OPTIMIZER:
                self.opt.snapshot(recipe.index)

    def _post_step(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        step = self.session.step
        if self.peer_size >= 2 and self.schedule.any_due(step):
            for recipe in self.schedule.due(step, optimizer_slices=self.opt.slices()):
                outcome = (
                    self.opt.run(step)
                    if recipe.kind == OPTIMIZER
                    else self.runner.run(recipe, step)
                )
                if outcome is None:
                    continue
                self.session.rounds.append(outcome)
                for record in self.verdicts.judge(outcome):
                    self.session.emit(record, self.writer)
        self.session.step = step + 1
        if self.schedule.any_due(step + 1):
            self.capturer.arm(step + 1, self.schedule.modules_due(step + 1))
        elif self.capturer.armed:
            self.capturer.arm(step + 1, ())


def exchange_hosts(layout: MeshLayout) -> dict[int, str]:
    """Every rank's host name, exchanged as fixed-width bytes on a diagnostic group."""
    ranks = list(layout.ranks)
    group = dist.new_group(ranks, backend="gloo")
    name = socket.gethostname().encode()[:64]
    mine = torch.zeros(64, dtype=torch.uint8)
    mine[: len(name)] = torch.tensor(list(name), dtype=torch.uint8)
    out = torch.empty(64 * len(ranks), dtype=torch.uint8)
    dist.all_gather_into_tensor(out, mine, group=group)
    rows = out.view(len(ranks), 64).tolist()
    return {
        r: bytes(b for b in row if b).decode(errors="replace")
        for r, row in zip(ranks, rows, strict=True)
    }
