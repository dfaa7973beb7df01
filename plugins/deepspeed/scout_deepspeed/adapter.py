"""``DeepSpeedAdapter``: what SCOUT's core needs to know about one DeepSpeed engine.

Contract: a ``FrameworkAdapter`` for ``DeepSpeedEngine`` and ``PipelineEngine`` under ZeRO 0-3:
the checked layout (:mod:`.layout`); blocks from the core's discovery (a pipeline stage's numbered
same-class children) and MoE parts (:mod:`.moe`); the inner torch optimizer (stepped once per
parameter group under ZeRO: one boundary per iteration, at the first group's step; ``UNIQUE``
under ZeRO 1-3); ZeRO-3 gathers on SCOUT's group (:mod:`.zero3`); Ulysses and MoE collectives
re-pointed to SCOUT's groups (:mod:`.regroup`). Docs: docs/deepspeed.md.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from scout_core import Axis, Config, MeshLayout, UnsupportedSetupError
from scout_core.plugin_api import (
    AdapterBase,
    Discovered,
    ModuleRef,
    Ownership,
    PeerGroup,
    RngStream,
    agree_or_raise,
    discover_modules,
    find_embedding,
    find_lm_head,
)
from scout_deepspeed import zero3
from scout_deepspeed.layout import check_layout, engine_layout, is_pipeline
from scout_deepspeed.moe import moe_parts
from scout_deepspeed.regroup import Repointer

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["DeepSpeedAdapter", "inner_optimizer", "inner_steps_per_step", "pipeline_layers"]

log = logging.getLogger(__name__)

_MISMATCH = "the parallel layout does not match DeepSpeed's process groups"


def inner_optimizer(engine: Any) -> torch.optim.Optimizer:
    """The ``torch.optim.Optimizer`` inside DeepSpeed's optimizer wrappers."""
    outer = getattr(engine, "optimizer", None)
    inner = getattr(outer, "optimizer", outer)
    if not isinstance(inner, torch.optim.Optimizer):
        raise UnsupportedSetupError(
            "scout-deepspeed needs a torch.optim.Optimizer inside the engine (pass an optimizer "
            "section or optimizer= to deepspeed.initialize); found "
            f"{type(inner).__name__} in {type(outer).__name__}"
        )
    return inner


def inner_steps_per_step(wrapper: Any) -> int:
    """How many times ``wrapper.step`` steps the inner optimizer (0: not a ZeRO wrapper)."""
    if not callable(getattr(wrapper, "_optimizer_step", None)):
        return 0
    for name in ("bit16_groups", "fp16_groups"):  # ZeRO 1/2, then ZeRO-3
        groups = getattr(wrapper, name, None)
        if isinstance(groups, list) and groups:
            return len(groups)
    return 0


def pipeline_layers(module: nn.Module) -> tuple[ModuleRef, ...]:
    """The repeated layers of a ``PipelineModule`` stage: same-class numbered children."""
    numbered = [(name, child) for name, child in module.named_children() if name.isdigit()]
    if not numbered:
        return ()
    counts = Counter(type(child) for _, child in numbered)
    cls, _ = counts.most_common(1)[0]
    chosen = [(int(name), name, child) for name, child in numbered if type(child) is cls]
    return tuple(ModuleRef(name, child) for _, name, child in sorted(chosen))


def _discover(engine: Any, config: Config) -> Discovered:
    module: nn.Module = engine.module
    if not is_pipeline(engine) or config.layers is not None:
        found = discover_modules(
            module, layers=config.layers, embedding=config.embedding, lm_head=config.lm_head
        )
        routers, experts = moe_parts(module)
        return dataclasses.replace(found, routers=routers, experts=experts)
    layers = pipeline_layers(module)
    emb = find_embedding(module, config.embedding)
    head = find_lm_head(module, layers, config.lm_head)
    if head is not None and emb is not None and head.module is emb.module:
        head = None
    return Discovered(layers=layers, embedding=emb, lm_head=head)


def _tracker_streams() -> list[RngStream]:
    """DeepSpeed's activation-checkpointing RNG tracker states (CUDA only)."""
    if not torch.cuda.is_available():
        return []
    try:
        from deepspeed.runtime.activation_checkpointing import checkpointing
    except ImportError:  # pragma: no cover - DeepSpeed without activation checkpointing
        return []
    tracker = checkpointing.get_cuda_rng_tracker()
    streams: list[RngStream] = []
    for name in sorted(tracker.get_states()):

        def get(name: str = name) -> torch.Tensor:
            state: torch.Tensor = tracker.get_states()[name]
            return state.cpu()

        def put(state: torch.Tensor, name: str = name) -> None:
            states = tracker.get_states()
            states[name] = state.clone()
            tracker.set_states(states)

        streams.append(RngStream(f"deepspeed/{name}", get, put))
    return streams


class DeepSpeedAdapter(AdapterBase):
    """``FrameworkAdapter`` for one DeepSpeed engine. Collective at construction: every rank
    checks its layout and the ranks agree, so call it on every rank at the same point."""

    name = "deepspeed"
    gates_checkpoints = True
    """DeepSpeed's own checkpoints are gated, so the core keeps no in-memory gate copies."""
    replays_ep_blocks = True
    """Blocks with a DeepSpeed ``MoE`` layer stay in the rotation under expert parallelism:
    :meth:`call` re-points their all-to-alls to SCOUT's own groups (:mod:`.regroup`)."""

    def __init__(self, engine: Any, config: Config) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise UnsupportedSetupError(
                "scout-deepspeed needs torch.distributed initialised (deepspeed.initialize "
                "does that) before SCOUT is switched on"
            )
        self.engine = engine
        self.zero_stage = int(engine.zero_optimization_stage() or 0)
        self._rank = dist.get_rank()
        world = dist.get_world_size()
        problem: str | None = self._unsupported(engine)
        layout: MeshLayout | None = None
        if problem is None:
            try:
                layout = engine_layout(engine, world)
                problem = check_layout(engine, layout, self._rank)
            except UnsupportedSetupError as exc:
                problem = str(exc)
        agree_or_raise(problem, plugin="scout-deepspeed", what=_MISMATCH)
        assert layout is not None
        # Collective: SCOUT's own SP/EP groups, then agreement on each Ulysses/MoE layer's group.
        self._repoint = Repointer(engine.module, layout, self._rank)
        agree_or_raise(self._repoint.problem, plugin="scout-deepspeed", what=_MISMATCH)
        optimizer = inner_optimizer(engine)
        wrapper = engine.optimizer
        steps = inner_steps_per_step(wrapper) if wrapper is not optimizer else 0
        super().__init__(
            rank=self._rank,
            layout=layout,
            found=_discover(engine, config),
            optimizers=(optimizer,),
            steps_per_iteration=(max(1, steps),),
            extra_rng=_tracker_streams(),
        )
        self._peers: PeerGroup | None = None

    @staticmethod
    def _unsupported(engine: Any) -> str | None:
        """Setups replay cannot watch safely yet, as a message; None when supported."""
        zc = getattr(getattr(engine, "_config", None), "zero_config", None)
        if zc is not None and int(getattr(zc, "zero_hpz_partition_size", 1) or 1) > 1:
            return "ZeRO++ hierarchical partitioning (zero_hpz_partition_size > 1) is not supported"
        if zc is not None and int(getattr(zc, "mics_shard_size", -1) or -1) > 0:
            return "MiCS sharding is not supported"
        return None

    def training_groups(self) -> Mapping[str, ProcessGroup]:
        """DeepSpeed's groups by role (reference only: SCOUT never talks on them)."""
        e = self.engine
        found: dict[str, Any] = {
            "data_parallel": getattr(e, "data_parallel_group", None),
            "seq_data_parallel": getattr(e, "seq_data_parallel_group", None),
        }
        if self._layout.size(Axis.C) > 1:
            found["seq_parallel"] = getattr(e, "seq_parallel_group", None)
        ep = self._layout.size(Axis.E)
        if ep > 1:
            from deepspeed.utils import groups

            found["expert_parallel"] = groups._get_expert_parallel_group(f"ep_size_{ep}")
            found["expert_data_parallel"] = groups._get_expert_data_parallel_group(f"ep_size_{ep}")
        if is_pipeline(e):
            found["pipe"] = e.grid.get_pipe_parallel_group()
            found["pipe_data_parallel"] = e.grid.get_data_parallel_group()
            if self._layout.size(Axis.T) > 1:
                found["slice"] = e.grid.get_slice_parallel_group()
        mpu = getattr(e, "mpu", None)
        # The Ulysses mpu aliases its sequence group as the "model parallel" group.
        is_sp_mpu = hasattr(mpu, "initialize_sequence_parallel")
        if mpu is not None and hasattr(mpu, "get_model_parallel_group") and not is_sp_mpu:
            found["tensor_parallel"] = mpu.get_model_parallel_group()
        return {k: v for k, v in found.items() if v is not None}

    def optimizer_ownership(self) -> Ownership:
        # ZeRO 1-3: the inner optimizer steps on this rank's own flat partition.
        return Ownership.REPLICATED if self.zero_stage == 0 else Ownership.UNIQUE

    @contextmanager
    def materialize(self, ref: ModuleRef) -> Iterator[dict[str, torch.Tensor]]:
        """Full copies of ``ref``'s parameters; under ZeRO-3 gathered on SCOUT's group."""
        named = list(ref.module.named_parameters())
        if not any(zero3.is_partitioned(p) for _, p in named):
            yield {name: p.detach().clone() for name, p in named}
            return
        if self._peers is None:
            raise UnsupportedSetupError("ZeRO-3 parameters need SCOUT's diagnostic peer group")
        yield zero3.gather_full(named, self._peers)

    def local_shards(self, ref: ModuleRef) -> list[torch.Tensor]:
        """This rank's ZeRO-3 partitions of ``ref`` (whole parameters under ZeRO 0-2)."""
        return [
            zero3.partition(p) if zero3.is_partitioned(p) else p.detach()
            for _, p in sorted(ref.module.named_parameters())
        ]

    def call(
        self,
        module: nn.Module,
        state: Mapping[str, torch.Tensor],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """Run ``module`` on ``state`` with DeepSpeed's (ZeRO-3 fetch/release) hooks hidden; its
        Ulysses/MoE layers (and their backward) talk on SCOUT's group over the same ranks."""
        with zero3.without_deepspeed_hooks(module), self._repoint.patched(module):
            return torch.func.functional_call(module, dict(state), args, kwargs)

    def repointed_summary(self) -> dict[str, list[int]]:
        """Which DeepSpeed group attributes replay re-points, and to which ranks."""
        return self._repoint.summary()

    def bind_groups(self, groups: Mapping[str, PeerGroup]) -> None:
        """ZeRO-3 partitions are gathered on SCOUT's peer group (the shard group)."""
        self._peers = groups.get("shard", groups.get("peer"))
