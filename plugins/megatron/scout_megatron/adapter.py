"""``MegatronAdapter``: what SCOUT's core needs to know about one Megatron job.

It implements the core's ``FrameworkAdapter`` for megatron-core model chunks and their
``MegatronOptimizer`` from this package's parts (:mod:`.layout`, :mod:`.modules`, :mod:`.moe`,
:mod:`.optimizers`, :mod:`.rng`). A layer keeps its TP shard and replays as a hook-free twin with
its groups re-pointed (:class:`.regroup.Regrouper`), so a replay never talks on a training group.
Why each group goes where: docs/megatron.md, "Replaying tensor-parallel layers".
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from scout_core import Config, UnsupportedSetupError
from scout_core.plugin_api import (
    AdapterBase,
    Discovered,
    ModuleRef,
    Ownership,
    PeerGroup,
    RngStream,
    agree_or_raise,
    diagnostic_groups,
    hook_free_twin,
)
from scout_megatron.layout import DEFAULT_ORDER, ParallelSizes, megatron_layout
from scout_megatron.live_groups import (
    check_live_groups,
    sizes_from_parallel_state,
    training_groups,
)
from scout_megatron.modules import chunk_modules
from scout_megatron.moe import MoeParts, call_part, moe_parts
from scout_megatron.optimizers import inner_optimizers
from scout_megatron.regroup import Regrouper
from scout_megatron.rng import tracker_streams

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["MegatronAdapter", "as_chunks", "discover"]

_MEGATRON_HOOKS = ("megatron.core.distributed",)
"""Modules whose forward pre-hooks dispatch parameter all-gathers (Megatron DDP, FSDP)."""


def as_chunks(model: Any) -> list[nn.Module]:
    """The model chunks: a list or tuple of modules, or one module."""
    items = list(model) if isinstance(model, (list, tuple)) else [model]
    if not items or not all(isinstance(m, nn.Module) for m in items):
        raise UnsupportedSetupError(
            "scout-megatron attaches to megatron-core model chunks (a list of modules, one "
            f"per virtual pipeline stage); got {type(model).__name__}"
        )
    return items


def discover(chunks: Sequence[nn.Module], config: Config) -> Discovered:
    """Layers, embedding and output layer of every chunk, and their MoE routers and experts."""
    found = chunk_modules(chunks, config.layers or "decoder.layers")
    many = len(found) > 1
    layers: list[ModuleRef] = []
    embedding = lm_head = None
    for chunk in found:
        prefix = f"chunk{chunk.index}." if many else ""
        for position, (_, layer) in enumerate(chunk.layers):
            layers.append(ModuleRef(f"{prefix}{chunk.layers_path}.{position}", layer))
        if chunk.embedding is not None and embedding is None:
            embedding = ModuleRef(f"{prefix}{config.embedding or 'embedding'}", chunk.embedding)
        if chunk.output_layer is not None:
            lm_head = ModuleRef(f"{prefix}{config.lm_head or 'output_layer'}", chunk.output_layer)
    parts = moe_parts(layers)
    return Discovered(
        layers=tuple(layers),
        embedding=embedding,
        lm_head=lm_head,
        routers=parts.routers,
        experts=parts.experts,
    )


def _drop_framework_hooks(twin: nn.Module) -> nn.Module:
    """Remove Megatron DDP/FSDP forward pre-hooks from a twin (its hook dicts are its own)."""
    for mod in twin.modules():
        hooks = mod._forward_pre_hooks
        for key in [k for k, h in hooks.items() if _is_megatron_hook(h)]:
            del hooks[key]
    return twin


def _is_megatron_hook(hook: Any) -> bool:
    owner = getattr(hook, "__self__", None)
    where = type(owner).__module__ if owner is not None else getattr(hook, "__module__", "")
    return str(where).startswith(_MEGATRON_HOOKS)


class MegatronAdapter(AdapterBase):
    """``FrameworkAdapter`` for Megatron model chunks. Collective at construction (the layout
    check, the single-rank replay groups): call it on every rank at the same point."""

    name = "megatron"

    def __init__(
        self, chunks: Any, optimizer: Any, config: Config, *, order: str = DEFAULT_ORDER
    ) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise UnsupportedSetupError(
                "scout-megatron needs torch.distributed initialised before SCOUT is switched on"
            )
        from megatron.core import parallel_state

        if not parallel_state.model_parallel_is_initialized():
            raise UnsupportedSetupError(
                "scout-megatron needs megatron.core.parallel_state.initialize_model_parallel "
                "to have run before SCOUT is switched on"
            )
        self.chunks = as_chunks(chunks)
        self.megatron_optimizer = optimizer
        rank = dist.get_rank()
        problem: str | None = None
        sizes: ParallelSizes | None = None
        try:
            sizes = sizes_from_parallel_state(order)
            layout = megatron_layout(sizes)
            problem = check_live_groups(layout, sizes, rank)
            inner = inner_optimizers(optimizer)
            found = discover(self.chunks, config)
        except UnsupportedSetupError as exc:
            problem = str(exc)
        agree_or_raise(
            problem, plugin="scout-megatron", what="this job's layout or objects are not supported"
        )
        assert sizes is not None
        self.sizes = sizes
        self.inner = inner
        self._solo: ProcessGroup | None = None
        if sizes.tp > 1:  # collective: every rank creates every single-rank group
            self._solo = diagnostic_groups([[r] for r in range(dist.get_world_size())])
        super().__init__(
            rank=rank,
            layout=layout,
            found=found,
            optimizers=[i.optimizer for i in inner],
            extra_rng=[RngStream(s.name, s.get, s.set) for s in tracker_streams()],
        )
        self._moe = MoeParts(found.routers, found.experts)
        self.bind_groups({})

    def _regrouper(self, groups: Mapping[str, PeerGroup], tp: Any) -> Regrouper:
        table: dict[tuple[int, ...], Any] = {}
        for kind in ("c", "e"):
            if kind in groups:
                table[groups[kind].ranks] = groups[kind].pg
        if tp is not None:
            table[self._layout.group_along(self._rank, ("t",))] = tp
        return Regrouper(by_ranks=table)

    def _regrouper_for(self, module: nn.Module) -> Regrouper:
        coupled = any(type(m).__name__ == "VocabParallelEmbedding" for m in module.modules())
        return self._coupled if coupled else self._decoupled

    def training_groups(self) -> Mapping[str, ProcessGroup]:
        """Megatron's groups by ``ProcessGroupCollection`` name (reference only)."""
        return training_groups()

    def optimizer_ownership(self) -> Ownership:
        # DistributedOptimizer: the inner optimizer holds this rank's fp32 shard only.
        return Ownership.UNIQUE if any(i.sharded for i in self.inner) else Ownership.REPLICATED

    def bind_groups(self, groups: Mapping[str, PeerGroup]) -> None:
        """SCOUT's ``t`` group for the embedding, ``c`` / ``e`` for context and expert partners."""
        shared = groups.get("t")
        self._decoupled = self._regrouper(groups, self._solo)
        self._coupled = self._regrouper(groups, None if shared is None else shared.pg)

    @contextmanager
    def materialize(self, ref: ModuleRef) -> Iterator[dict[str, torch.Tensor]]:
        """Copies of this rank's parameters of ``ref`` (its TP shard: nothing to gather)."""
        yield {
            name: p.detach().clone().requires_grad_(p.requires_grad and p.is_floating_point())
            for name, p in ref.module.named_parameters()
        }

    def local_shards(self, ref: ModuleRef) -> list[torch.Tensor]:
        """This rank's parameters of ``ref`` in name order (equal across replica peers)."""
        return [p.detach() for _, p in sorted(ref.module.named_parameters())]

    def call(
        self,
        module: nn.Module,
        state: Mapping[str, torch.Tensor],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """Run a hook-free twin of ``module`` on ``state`` with its groups re-pointed (the replay's
        backward keeps them); MoE routers and experts go through :func:`.moe.call_part`."""
        twin = _drop_framework_hooks(hook_free_twin(module))

        def run() -> Any:
            with self._regrouper_for(module).repointed(twin):
                return torch.func.functional_call(twin, dict(state), args, kwargs)

        return call_part(self._moe, module, run)

    def replay_groups(self, ref: ModuleRef) -> dict[str, tuple[tuple[int, ...], str]]:
        """Every multi-rank group ``ref`` holds and what replay uses instead (for tests)."""
        regrouper = self._regrouper_for(ref.module)
        subs = regrouper.substitutes
        out = {}
        for site in regrouper.sites(ref.module):
            sub = subs.get(site.ranks)
            what = "forbidden" if sub is None else f"scout{list(dist.get_process_group_ranks(sub))}"
            out[f"{site.module}:{site.attr}" if site.module else site.attr] = (site.ranks, what)
        return out
