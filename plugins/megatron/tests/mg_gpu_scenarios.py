"""GPU rank body: what the CPU tests cannot see (CUDA RNG tracker, Megatron's own DDP,
get_megatron_optimizer with FP32 / bf16 / distributed optimizers, recompute on CUDA, and
checkpoints of a DistributedOptimizer job). One rank, NCCL."""

from __future__ import annotations

import hashlib
from typing import Any

import torch
import torch.distributed as dist


def _digest(model: torch.nn.Module, inner: list[torch.optim.Optimizer]) -> str:
    h = hashlib.sha256()
    tensors = [p for _, p in sorted(model.named_parameters())]
    for opt in inner:
        for group in opt.param_groups:
            for p in group["params"]:
                tensors.append(p)
                tensors.extend(v for v in opt.state[p].values() if isinstance(v, torch.Tensor))
    for t in tensors:
        h.update(t.detach().float().cpu().contiguous().reshape(-1).numpy().tobytes())
    return h.hexdigest()


def _job(kind: str, recompute: bool = False) -> tuple[Any, Any, Any]:
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer import TransformerConfig

    bf16 = kind in ("bf16", "distopt")
    extra: dict[str, Any] = {}
    if recompute:
        extra = dict(
            recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1
        )
    config = TransformerConfig(
        num_layers=2, hidden_size=64, num_attention_heads=4, bf16=bf16,
        params_dtype=torch.bfloat16 if bf16 else torch.float32,
        hidden_dropout=0.0, attention_dropout=0.0, **extra,
    )  # fmt: skip
    model = GPTModel(
        config=config, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=128,
        max_sequence_length=32, position_embedding_type="learned_absolute",
    ).cuda()  # fmt: skip
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, use_distributed_optimizer=kind == "distopt"
    )
    ddp = DistributedDataParallel(config, ddp_config, model)
    opt = get_megatron_optimizer(
        OptimizerConfig(
            optimizer="adam", lr=1e-3, bf16=bf16, use_distributed_optimizer=kind == "distopt"
        ),
        [ddp],
    )
    return model, ddp, opt


def _step(ddp: Any, opt: Any, seed: int) -> None:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    tokens = torch.randint(0, 128, (2, 32), device="cuda", generator=gen)
    pos = torch.arange(32, device="cuda").unsqueeze(0).expand(2, -1)
    opt.zero_grad()
    ddp.zero_grad_buffer()
    loss = ddp(tokens, pos, None, labels=tokens).float().mean()
    loss.backward()
    ddp.finish_grad_sync()
    ok, _, _ = opt.step()
    assert ok


def _optimizer_facts(kind: str) -> dict[str, Any]:
    from scout_megatron.optimizers import inner_optimizers

    model, ddp, opt = _job(kind)
    inner = inner_optimizers(opt)
    model_params = {id(p) for p in model.parameters()}
    first = inner[0].optimizer
    params = [p for g in first.param_groups for p in g["params"]]
    before = [p.detach().clone() for p in model.parameters()]
    seen: dict[str, bool] = {}

    def post_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
        now = list(model.parameters())
        seen["model_params_changed_at_post_hook"] = any(
            not torch.equal(a, b) for a, b in zip(before, now, strict=True)
        )

    first.register_step_post_hook(post_hook)
    _step(ddp, opt, 0)
    after = list(model.parameters())
    return {
        "top": type(opt).__name__,
        "inner": [(i.wrapper, type(i.optimizer).__name__, i.sharded) for i in inner],
        "inner_params_are_model_params": all(id(p) in model_params for p in params),
        "inner_dtypes": sorted({str(p.dtype) for p in params}),
        "inner_numel": sum(p.numel() for p in params),
        "model_numel": sum(p.numel() for p in model.parameters()),
        "model_params_changed_after_step": any(
            not torch.equal(a, b) for a, b in zip(before, after, strict=True)
        ),
        **seen,
    }


def _count_hooks(layers: Any, in_recompute: Any) -> dict[int, list[int]]:
    """[first firings, recompute firings] per layer number."""
    counts = {number: [0, 0] for number, _ in layers}
    for number, layer in layers:

        def hook(module: Any, args: Any, output: Any, number: int = number) -> None:
            counts[number][1 if in_recompute() else 0] += 1

        layer.register_forward_hook(hook)
    return counts


def gpu_facts(directory: str) -> dict[str, Any]:
    dist.init_process_group("nccl", rank=0, world_size=1)
    torch.cuda.set_device(0)
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel
    from scout_megatron.checkpoint import MegatronCheckpointIO
    from scout_megatron.modules import chunk_modules
    from scout_megatron.optimizers import torch_optimizers
    from scout_megatron.rng import in_recompute, tracker_streams

    ps.initialize_model_parallel(1)
    tensor_parallel.model_parallel_cuda_manual_seed(1234)
    out: dict[str, Any] = {"tracker": type(tensor_parallel.get_cuda_rng_tracker()).__name__}
    streams = {s.name: s for s in tracker_streams()}
    out["streams"] = sorted(streams)
    mp = streams["megatron:model-parallel-rng"]
    saved = mp.get()
    out["state"] = [str(saved.dtype), str(saved.device)]
    tracker = tensor_parallel.get_cuda_rng_tracker()
    with tracker.fork():
        first = torch.rand(8, device="cuda")
    with tracker.fork():
        moved_on = torch.rand(8, device="cuda")
    mp.set(saved)
    with tracker.fork():
        again = torch.rand(8, device="cuda")
    out["rng_restored"] = torch.equal(first, again) and not torch.equal(first, moved_on)

    for kind in ("fp32", "bf16", "distopt"):
        out[kind] = _optimizer_facts(kind)

    model, ddp, _ = _job("fp32", recompute=True)
    (chunk,) = chunk_modules([ddp])
    counts = _count_hooks(chunk.layers, in_recompute)
    tokens = torch.randint(0, 128, (2, 32), device="cuda")
    pos = torch.arange(32, device="cuda").unsqueeze(0).expand(2, -1)
    ddp(tokens, pos, None, labels=tokens).float().mean().backward()
    out["recompute_hooks"] = {str(k): v for k, v in counts.items()}

    model, ddp, opt = _job("distopt")
    inner = torch_optimizers(opt)
    io = MegatronCheckpointIO(directory, [ddp], opt)
    _step(ddp, opt, 1)
    io.save(io.tag_for(0))
    at_save = _digest(model, inner)
    _step(ddp, opt, 2)
    moved = _digest(model, inner) != at_save
    io.load(None)
    out["distopt_checkpoint"] = {
        "tags": io.list_tags(),
        "moved": moved,
        "restored": _digest(model, inner) == at_save,
    }
    _step(ddp, opt, 2)  # training goes on after a restore
    ps.destroy_model_parallel()
    dist.destroy_process_group()
    return out
