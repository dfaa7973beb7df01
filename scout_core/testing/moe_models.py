r"""A tiny plain-PyTorch mixture-of-experts model with expert parallelism, for tests.

:class:`TinyMoE` is an embedding, a ``ModuleList`` of residual :class:`MoEBlock`\ s
and an LM head. Each block's :class:`MoELayer` has a top-k :class:`TopKRouter`, the
rank's local :class:`Expert`\ s, and a dropless all-to-all dispatch and combine over
the expert-parallel (EP) group: tokens go to the EP rank that owns their expert,
come back, and are combined with the routing weights. Layers may differ in expert
count and width (:class:`MoESpec`), the heterogeneous case the shape catalog must
handle. Token counts per expert follow the routing, so expert GEMM shapes change
from step to step.

[Layout] :func:`moe_parallel` builds the groups from ``WORLD_SIZE`` and ``ep_size``:
EP groups are consecutive ranks (``{0,1},{2,3},...`` for EP 2), one model replica
each; expert-data-parallel groups join the ranks at the same EP position of every
replica (``{0,2,4,6}``, ``{1,3,5,7}``): they hold the same experts. Dense parameters
are replicated on every rank. :func:`sync_gradients` all-reduces dense gradients
over all ranks and expert gradients over the expert-DP group, both divided by the
world size, so every rank steps on the gradient of the mean loss over all ranks.

Every expert is initialised from its own seed (``seed * 1000 + global expert id``),
so the replicas of an expert start identical wherever they live, and a one-process
model (``parallel=None``) holding all experts computes the same function: the
reference the multi-rank test checks the dispatch against. The combine is a gather
and a weighted sum (no atomics), so training is bitwise deterministic run to run.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from scout_core.testing.models import VOCAB, batch

if TYPE_CHECKING:
    from scout_core.moe.routing import ExpertLayerSpec

__all__ = [
    "Expert",
    "MoEBlock",
    "MoELayer",
    "MoEParallel",
    "MoESpec",
    "TinyMoE",
    "TopKRouter",
    "all_to_all",
    "moe_parallel",
    "moe_train_step",
    "sync_gradients",
]


@dataclass(frozen=True, slots=True)
class MoESpec:
    """One MoE layer: how many experts (over all EP ranks), their width, and top-k."""

    num_experts: int
    ffn: int
    top_k: int = 2


@dataclass(frozen=True, slots=True)
class MoEParallel:
    """This rank's place in the EP x expert-DP layout and its training groups."""

    ep_size: int
    ep_rank: int
    ep_group: Any
    """The EP group of this rank's replica (dispatch and combine run on it)."""
    expert_dp_group: Any
    """Ranks at the same EP position of every replica: they hold the same experts."""
    dense_group: Any
    """All ranks: dense parameters are replicated everywhere."""
    world_size: int


def moe_parallel(ep_size: int, *, backend: str | None = None) -> MoEParallel:
    """Build the EP, expert-DP and dense groups (collective: every rank calls it).

    ``backend`` defaults to the default process group's (Gloo on CPU, NCCL on CUDA).
    """
    world, rank = dist.get_world_size(), dist.get_rank()
    if ep_size < 1 or world % ep_size:
        raise ValueError(f"ep_size {ep_size} must divide the world size {world}")
    ep_group = expert_dp_group = None
    for start in range(0, world, ep_size):  # every rank creates every group, in order
        g = dist.new_group(list(range(start, start + ep_size)), backend=backend)
        if start <= rank < start + ep_size:
            ep_group = g
    for pos in range(ep_size):
        g = dist.new_group(list(range(pos, world, ep_size)), backend=backend)
        if rank % ep_size == pos:
            expert_dp_group = g
    dense = dist.new_group(list(range(world)), backend=backend)
    return MoEParallel(ep_size, rank % ep_size, ep_group, expert_dp_group, dense, world)


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` with uneven splits; backward sends gradients the reverse way."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, out_splits: list[int], in_splits: list[int], group: Any
    ) -> torch.Tensor:
        ctx.splits, ctx.group = (out_splits, in_splits), group
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        out_splits, in_splits = ctx.splits
        back = grad.new_empty((sum(in_splits), *grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return back, None, None, None


def all_to_all(
    x: torch.Tensor, out_splits: list[int], in_splits: list[int], group: Any
) -> torch.Tensor:
    """Differentiable all-to-all of ``x``'s rows: ``in_splits[p]`` rows go to peer ``p``."""
    out: torch.Tensor = _AllToAll.apply(x, out_splits, in_splits, group)  # type: ignore[no-untyped-call]
    return out


class TopKRouter(nn.Module):
    """Linear gate, top-k experts per token, softmax over the chosen k logits."""

    def __init__(self, dim: int, num_experts: int, top_k: int) -> None:
        super().__init__()
        self.gate = nn.Linear(dim, num_experts, bias=False)
        self.top_k = top_k

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.gate(tokens)
        top, idx = torch.topk(logits, self.top_k, dim=-1)
        return torch.softmax(top, dim=-1), idx


class Expert(nn.Module):
    """A two-layer GELU MLP: ``up`` (dim -> ffn) and ``down`` (ffn -> dim)."""

    def __init__(self, dim: int, ffn: int) -> None:
        super().__init__()
        self.up = nn.Linear(dim, ffn)
        self.down = nn.Linear(ffn, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down(torch.nn.functional.gelu(self.up(x)))
        return out


def _seeded_expert(dim: int, ffn: int, seed: int) -> Expert:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Expert(dim, ffn)


class MoELayer(nn.Module):
    """Router, this rank's local experts, and all-to-all dispatch/combine over EP."""

    def __init__(self, dim: int, spec: MoESpec, *, parallel: MoEParallel | None, seed: int) -> None:
        super().__init__()
        ep = parallel.ep_size if parallel is not None else 1
        if spec.num_experts % ep:
            raise ValueError(f"{spec.num_experts} experts do not split over EP {ep}")
        self.num_experts, self.ep_size, self.parallel = spec.num_experts, ep, parallel
        self.local = spec.num_experts // ep
        first = (parallel.ep_rank if parallel is not None else 0) * self.local
        self.router = TopKRouter(dim, spec.num_experts, min(spec.top_k, spec.num_experts))
        self.experts = nn.ModuleList(
            _seeded_expert(dim, spec.ffn, seed * 1000 + first + j) for j in range(self.local)
        )
        self.expert_ids = tuple(range(first, first + self.local))
        self.last_tokens_per_expert: tuple[int, ...] = (0,) * self.local
        """Rows each local expert processed in the last forward (the expert GEMM shapes)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])
        weights, idx = self.router(tokens)
        k = idx.shape[-1]
        flat = idx.reshape(-1)
        order = torch.argsort(flat, stable=True)  # (token, slot) pairs grouped by expert
        routed = tokens[order // k]
        counts = torch.bincount(flat, minlength=self.num_experts)
        if self.parallel is None:
            recv_counts, received = counts, routed
        else:
            recv_counts = torch.empty_like(counts)
            dist.all_to_all_single(recv_counts, counts, group=self.parallel.ep_group)
            send = counts.view(self.ep_size, self.local).sum(1).tolist()
            recv = recv_counts.view(self.ep_size, self.local).sum(1).tolist()
            received = all_to_all(routed, recv, send, self.parallel.ep_group)
        # received: chunks ordered by (source peer, local expert)
        sizes = recv_counts.tolist()
        chunks = list(torch.split(received, sizes))
        per_expert = []
        for j, expert in enumerate(self.experts):
            mine = [p * self.local + j for p in range(self.ep_size)]
            rows = torch.cat([chunks[c] for c in mine])
            per_expert.append(rows.shape[0])
            for c, y in zip(mine, expert(rows).split([sizes[c] for c in mine]), strict=True):
                chunks[c] = y
        self.last_tokens_per_expert = tuple(per_expert)
        done = torch.cat(chunks)
        if self.parallel is not None:
            done = all_to_all(done, send, recv, self.parallel.ep_group)
        back = done[torch.argsort(order)]  # undo the grouping: a gather, no atomics
        out: torch.Tensor = (back.view(-1, k, x.shape[-1]) * weights.unsqueeze(-1)).sum(1)
        return out.view_as(x)


class MoEBlock(nn.Module):
    """Pre-norm residual MoE block."""

    def __init__(self, dim: int, spec: MoESpec, *, parallel: MoEParallel | None, seed: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.moe = MoELayer(dim, spec, parallel=parallel, seed=seed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.moe(self.norm(x))
        return out


class TinyMoE(nn.Module):
    """Embedding, a ``ModuleList`` of MoE blocks (possibly heterogeneous), an LM head."""

    def __init__(
        self,
        specs: Sequence[MoESpec] = (MoESpec(4, 32), MoESpec(4, 32)),
        *,
        dim: int = 16,
        vocab: int = VOCAB,
        parallel: MoEParallel | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__()
        torch.manual_seed(seed)  # dense parameters: the same on every rank
        self.embed = nn.Embedding(vocab, dim)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)
        self.layers = nn.ModuleList(
            MoEBlock(dim, spec, parallel=parallel, seed=seed * 100 + i)
            for i, spec in enumerate(specs)
        )
        self.specs = tuple(specs)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.layers:
            x = block(x)
        out: torch.Tensor = self.head(self.norm(x))
        return out

    def moe_layers(self) -> Iterator[tuple[str, MoELayer]]:
        for i, block in enumerate(self.layers):
            assert isinstance(block, MoEBlock)
            yield f"layers.{i}.moe", block.moe

    def layer_specs(self, tokens_per_rank: int) -> list[ExpertLayerSpec]:
        """The MoE layers as the shape catalog sees them (one GEMM per expert).

        A token picks an expert at most once, so a local expert receives at most
        ``tokens_per_rank`` rows from each EP peer: the admitted row counts are
        ``0 .. tokens_per_rank * ep_size``.
        """
        from scout_core.moe.routing import ExpertLayerSpec

        return [
            ExpertLayerSpec(
                name=name,
                num_experts=layer.num_experts,
                ep_size=layer.ep_size,
                d_model=self.embed.embedding_dim,
                d_ff=spec.ffn,
                max_tokens_per_expert=tokens_per_rank * layer.ep_size,
                min_tokens_per_expert=0,
                experts_per_kernel=1,
            )
            for (name, layer), spec in zip(self.moe_layers(), self.specs, strict=True)
        ]

    def expert_parameters(self) -> Iterator[nn.Parameter]:
        for _, layer in self.moe_layers():
            yield from layer.experts.parameters()

    def dense_parameters(self) -> Iterator[nn.Parameter]:
        expert = {id(p) for p in self.expert_parameters()}
        yield from (p for p in self.parameters() if id(p) not in expert)


def sync_gradients(model: TinyMoE, parallel: MoEParallel) -> None:
    """Average gradients: dense over all ranks, experts over their expert-DP group."""
    for params, group in (
        (model.dense_parameters(), parallel.dense_group),
        (model.expert_parameters(), parallel.expert_dp_group),
    ):
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad, group=group)
            p.grad.div_(parallel.world_size)


def moe_train_step(
    model: TinyMoE,
    optimizer: torch.optim.Optimizer,
    step: int,
    rank: int,
    parallel: MoEParallel | None,
) -> float:
    """One training iteration: forward, loss, backward, gradient sync, optimizer step."""
    tokens = batch(step, rank)
    logits = model(tokens[:, :-1])
    loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()  # type: ignore[no-untyped-call]  # torch stub lacks annotations
    if parallel is not None:
        sync_gradients(model, parallel)
    optimizer.step()
    return float(loss.detach())
