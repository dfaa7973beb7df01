"""A tiny real megatron-core ``GPTModel`` trained on CPU over Gloo: the pieces tests reuse.

Megatron's own ``DistributedDataParallel`` and its pipeline schedules are CUDA-only
(grad buffers and token counts on ``cuda``), and ``get_megatron_optimizer`` needs
chunks wrapped in that DDP. On CPU the job is therefore put together the way
Megatron would, from the parts that do run:

* ``parallel_state.initialize_model_parallel`` builds every training group (Gloo);
  :func:`initialize` then installs the CPU shims of :mod:`.shims` and seeds
  Megatron's RNG streams;
* :func:`build_model`: ``GPTModel`` with ``use_cpu_initialization=True``, the local
  layer spec and learned absolute positions (RoPE moves its frequencies to CUDA);
* :func:`wrap_ddp`: torch ``DistributedDataParallel`` over Megatron's data-parallel
  group (with context parallel when CP > 1), which averages gradients there as
  Megatron's DDP does (tensor by tensor, so a resumed job reduces exactly as an
  uninterrupted one);
* :func:`build_optimizer`: Megatron's own parameter grouping (``_get_param_groups``)
  and optimizer constructor (``_get_megatron_optimizer_based_on_param_groups``), the
  two functions ``get_megatron_optimizer`` calls (its DDP buffers are used only by
  the distributed optimizer), which yield a real ``FP32Optimizer`` around
  ``torch.optim.AdamW`` with Megatron's ``init_state_fn``, wrapped in a real
  ``ChainedOptimizer`` exactly as ``get_megatron_optimizer`` returns it in 0.16.
  Gradient clipping stays off (``clip_grad=0``): ``clip_grad_by_total_norm_fp32``
  asserts ``torch.cuda.FloatTensor`` grads.

Everything is deterministic: the model comes from the CPU generator seeded by
:func:`initialize`, batches from ``(step, data-parallel rank)`` alone, and the CPU
kernels and Gloo reductions give the same bits on every run (a test checks this).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from torch import nn

from scout_megatron.testing.shims import cuda_factories_on_cpu, install_cpu_shims

__all__ = [
    "Batch",
    "TinyGPT",
    "build_model",
    "build_optimizer",
    "digest",
    "get_batch",
    "initialize",
    "teardown",
    "train_step",
    "transformer_config",
    "wrap_ddp",
]


@dataclass(frozen=True)
class TinyGPT:
    """Sizes of the tiny GPT (all divisible by TP = 2 where Megatron needs it)."""

    num_layers: int = 2
    hidden_size: int = 32
    num_attention_heads: int = 4
    vocab_size: int = 64
    seq_length: int = 16
    micro_batch_size: int = 2
    dropout: float = 0.0
    """Hidden and attention dropout; > 0 exercises Megatron's RNG streams."""
    recompute: bool = False
    """Full activation recompute of every layer (``recompute_granularity='full'``)."""
    num_moe_experts: int | None = None
    """Experts per MoE layer (every layer an MoE layer); None: dense MLPs."""
    moe_topk: int = 2
    """Experts each token is routed to."""
    moe_grouped_gemm: bool = False
    """Experts as one grouped GEMM (``GroupedMLP`` / ``TEGroupedMLP``, CUDA only) instead
    of a ``SequentialMLP`` of per-expert ``MLP`` s."""


@dataclass(frozen=True)
class Batch:
    """One micro-batch in the argument order of ``GPTModel.forward``."""

    tokens: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor


def initialize(
    *,
    tensor_model_parallel_size: int = 1,
    pipeline_model_parallel_size: int = 1,
    seed: int = 1234,
    **kwargs: Any,
) -> None:
    """``initialize_model_parallel`` (extra ``kwargs`` go to it), then the CPU shims.

    ``torch.distributed`` must already be initialised with Gloo. One intra-op thread
    keeps CPU kernels on one reduction order.
    """
    torch.set_num_threads(1)
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=tensor_model_parallel_size,
        pipeline_model_parallel_size=pipeline_model_parallel_size,
        **kwargs,
    )
    install_cpu_shims(seed)


def teardown() -> None:
    """Destroy Megatron's groups and globals so another layout can be initialised."""
    parallel_state.destroy_model_parallel()


def transformer_config(spec: TinyGPT) -> Any:
    """The ``TransformerConfig`` of ``spec`` for the current parallel layout."""
    from megatron.core.transformer import TransformerConfig

    extra: dict[str, Any] = {}
    if spec.recompute:
        extra = {
            "recompute_granularity": "full",
            "recompute_method": "uniform",
            "recompute_num_layers": 1,
        }
    if spec.num_moe_experts:
        # The allgather dispatcher: the alltoall one creates a CUDA stream when it is
        # built. No load-balancing loss, so the loss is the LM loss alone.
        extra.update(
            num_moe_experts=spec.num_moe_experts,
            moe_router_topk=spec.moe_topk,
            moe_ffn_hidden_size=spec.hidden_size,
            moe_token_dispatcher_type="allgather",
            moe_router_load_balancing_type="none",
            moe_grouped_gemm=spec.moe_grouped_gemm,
            expert_model_parallel_size=parallel_state.get_expert_model_parallel_world_size(),
            add_bias_linear=False,
        )
    return TransformerConfig(
        num_layers=spec.num_layers,
        hidden_size=spec.hidden_size,
        num_attention_heads=spec.num_attention_heads,
        use_cpu_initialization=True,
        tensor_model_parallel_size=parallel_state.get_tensor_model_parallel_world_size(),
        pipeline_model_parallel_size=parallel_state.get_pipeline_model_parallel_world_size(),
        context_parallel_size=parallel_state.get_context_parallel_world_size(),
        hidden_dropout=spec.dropout,
        attention_dropout=spec.dropout,
        **extra,
    )


def build_model(spec: TinyGPT = TinyGPT()) -> nn.Module:
    """A ``GPTModel`` (local spec, learned absolute positions) from the CPU generator;
    with ``spec.num_moe_experts``, every layer's MLP is an ``MoELayer``."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    layer_spec = get_gpt_layer_local_spec(
        num_experts=spec.num_moe_experts, moe_grouped_gemm=spec.moe_grouped_gemm
    )
    model: nn.Module = GPTModel(
        config=transformer_config(spec),
        transformer_layer_spec=layer_spec,
        vocab_size=spec.vocab_size,
        max_sequence_length=spec.seq_length,
        position_embedding_type="learned_absolute",
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
    )
    return model


def wrap_ddp(model: nn.Module) -> nn.Module:
    """Torch DDP over Megatron's data-parallel group (with context parallel).

    Gradients are averaged tensor by tensor (a DDP communication hook), not bucket by
    bucket: DDP re-buckets after its first iteration, and with three or more replicas
    Gloo's ring sum rounds an element differently at another position in a bucket, so a
    job resumed from a checkpoint would drift from the uninterrupted one. Megatron's own
    DDP reduces a grad buffer whose layout never changes.
    """
    group = parallel_state.get_data_parallel_group(with_context_parallel=True)
    ddp = nn.parallel.DistributedDataParallel(model, process_group=group)
    ddp.register_comm_hook(group, _average_per_tensor)
    return ddp


def _average_per_tensor(group: Any, bucket: Any) -> torch.futures.Future[torch.Tensor]:
    size = dist.get_world_size(group)
    for grad in bucket.gradients():  # views into bucket.buffer()
        dist.all_reduce(grad, group=group)
        grad.div_(size)
    done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    done.set_result(bucket.buffer())
    return done


# DDP checks a hook's annotations by identity; under postponed evaluation they are strings.
_average_per_tensor.__annotations__.update(
    bucket=dist.GradBucket,  # type: ignore[attr-defined]  # public, missing from the stubs
    **{"return": torch.futures.Future[torch.Tensor]},
)


def build_optimizer(chunks: Iterable[nn.Module], lr: float = 1e-2) -> Any:
    """``ChainedOptimizer([FP32Optimizer(AdamW)])`` built by Megatron's own constructor."""
    from megatron.core import optimizer as mcore_optimizer

    chunks = list(chunks)
    config = mcore_optimizer.OptimizerConfig(
        optimizer="adam", lr=lr, weight_decay=0.01, clip_grad=0.0, bf16=False, fp16=False
    )
    # Megatron's own grouping (no weight decay on biases and norms), as
    # get_megatron_optimizer builds it; the keys identify groups in checkpoints.
    groups = mcore_optimizer._get_param_groups(chunks, config, None)
    with cuda_factories_on_cpu():
        inner = mcore_optimizer._get_megatron_optimizer_based_on_param_groups(
            config=config,
            model_chunks=chunks,
            param_groups=groups,
            model_parallel_group=parallel_state.get_model_parallel_group(),
        )
    return mcore_optimizer.ChainedOptimizer([inner])


def get_batch(spec: TinyGPT, step: int) -> Batch:
    """The micro-batch of ``step`` for this rank: a function of (step, DP rank) only.

    Tensor-parallel partners get the same batch, data-parallel replicas different ones.
    """
    dp_rank = parallel_state.get_data_parallel_rank()
    gen = torch.Generator().manual_seed(1_000_003 * (step + 1) + dp_rank)
    shape = (spec.micro_batch_size, spec.seq_length + 1)
    data = torch.randint(0, spec.vocab_size, shape, generator=gen)
    seq = spec.seq_length
    positions = torch.arange(seq).unsqueeze(0).expand(spec.micro_batch_size, -1)
    # Megatron's mask convention: True marks a position that must NOT be attended to.
    # (Without a mask the softmax builds its default causal mask on CUDA.)
    mask = torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1).view(1, 1, seq, seq)
    return Batch(data[:, :-1].contiguous(), positions, mask, data[:, 1:].contiguous())


def train_step(model: nn.Module, optimizer: Any, batch: Batch) -> float:
    """One iteration: forward (per-token loss), backward, ``optimizer.step()``; the loss.

    Single pipeline stage only (CPU has no Megatron schedule).
    """
    optimizer.zero_grad()
    per_token = model(batch.tokens, batch.position_ids, batch.attention_mask, labels=batch.labels)
    loss = per_token.float().mean()
    loss.backward()
    with cuda_factories_on_cpu():
        ok, _, _ = optimizer.step()
    if not ok:
        raise RuntimeError("the Megatron optimizer skipped its step")
    return float(loss.detach())


def _tensors(obj: Any, prefix: str = "") -> Iterable[tuple[str, torch.Tensor]]:
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, dict):
        for key in sorted(obj, key=str):
            yield from _tensors(obj[key], f"{prefix}/{key}")
    elif isinstance(obj, (list, tuple)):
        for i, item in enumerate(obj):
            yield from _tensors(item, f"{prefix}/{i}")


def digest(model: nn.Module, optimizer: Any = None) -> str:
    """SHA-256 over every parameter and every optimizer-state tensor, by name, bitwise."""
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    if optimizer is not None:
        for name, t in _tensors(optimizer.state_dict()):
            h.update(name.encode())
            h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
