"""Rank bodies for Ulysses sequence-parallel and MoE expert-parallel DeepSpeed runs.

Two tiny GPT-style models, each trained by a real DeepSpeed engine on CPU with Gloo:

* :class:`UlyssesLM`: blocks whose attention is DeepSpeed's ``DistributedAttention``
  (all-to-all over the sequence-parallel group), set up the documented Ulysses way
  (``parallel_state_sp.initialize_sequence_parallel`` passed as ``mpu``). Each rank
  of a sequence-parallel group trains on its slice of the same sample's sequence.
* :class:`MoELM`: blocks whose MLP is a DeepSpeed ``MoE`` layer (top-1 gating, one
  local expert per rank, all-to-all over the expert-parallel group).

The bodies return JSON (verdicts, what fired, the adapter's layout and groups) for
the tests in ``test_deepspeed_parallel.py``.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist
from ds_scenarios import round_log
from torch import nn

from scout_core.testing import VOCAB, batch

MICRO = 2
SEQ = 8
DIM = 16
HEADS = 4


class _LocalAttention(nn.Module):
    """Plain softmax attention on ``[batch, seq, heads, head_dim]`` (the full sequence)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / q.shape[-1] ** 0.5
        return torch.einsum("bhqk,bkhd->bqhd", scores.softmax(dim=-1), v)


class UlyssesBlock(nn.Module):
    """Pre-norm attention (Ulysses) + MLP with dropout, on a sequence shard."""

    def __init__(self, dim: int, heads: int, group: Any) -> None:
        from deepspeed.sequence.layer import DistributedAttention

        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.attn = DistributedAttention(_LocalAttention(), group, scatter_idx=2, gather_idx=1)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 2 * dim)
        self.fc2 = nn.Linear(2 * dim, dim)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, d // self.heads).unbind(2)
        ctx = self.attn(q, k, v, 0)
        x = x + self.proj(ctx.reshape(b, s, d))
        out: torch.Tensor = x + self.drop(self.fc2(nn.functional.gelu(self.fc1(self.norm2(x)))))
        return out


class UlyssesLM(nn.Module):
    def __init__(self, group: Any, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(UlyssesBlock(DIM, HEADS, group) for _ in range(layers))
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.layers:
            x = block(x)
        out: torch.Tensor = self.head(x)
        return out


class _Expert(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, 2 * dim)
        self.fc2 = nn.Linear(2 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc2(nn.functional.gelu(self.fc1(x)))
        return out


class MoEBlock(nn.Module):
    """Pre-norm residual block whose MLP is a DeepSpeed ``MoE`` layer."""

    def __init__(self, dim: int, ep: int, experts: int | None = None) -> None:
        from deepspeed.moe.layer import MoE

        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.moe = MoE(
            dim, _Expert(dim), num_experts=experts or ep, ep_size=ep, k=1, min_capacity=16
        )
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _aux, _counts = self.moe(self.norm(x))
        out: torch.Tensor = x + self.drop(y)
        return out


class MoELM(nn.Module):
    def __init__(self, ep: int, layers: int = 2, experts: int | None = None) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(MoEBlock(DIM, ep, experts) for _ in range(layers))
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.layers:
            x = block(x)
        out: torch.Tensor = self.head(x)
        return out


def _section(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "report_dir": os.path.join(os.environ["SCOUT_TEST_RANK_DIR"], "report"),
        "run_id": "ds-parallel-test",
        "replay_interval": 1,
        "embedding_interval": 4,
        "lm_head_interval": 4,
        "optimizer_interval": 4,
        "observer": True,  # the hang observer runs beside every DeepSpeed test (issue 10)
    }
    base.update(over)
    return base


def _config(stage: int, scout: dict[str, Any] | None, batch_size: int) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "train_batch_size": batch_size,
        "train_micro_batch_size_per_gpu": MICRO,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}},
        "zero_optimization": {"stage": stage},
        "steps_per_print": 10_000,
    }
    if scout is not None:
        cfg["scout"] = scout
    return cfg


def _faults(specs: list[dict[str, Any]]) -> Any:
    from scout_core.testing import BitFlip, Faults

    faults = Faults()
    for f in specs:
        t = faults.at(rank=f["rank"], persistent=True)
        if f.get("skip_capture"):
            t.skip_capture(f.get("target"))
        else:
            t.corrupt_output(f["target"], BitFlip(bit=f.get("bit", 0)))
    return faults


def _signatures(engine: Any) -> dict[str, str]:
    from scout_deepspeed.adapter import inner_optimizer

    from scout_core.testing import signature, signature_many

    opt = inner_optimizer(engine)
    slots = [
        v for st in opt.state.values() for _, v in sorted(st.items()) if isinstance(v, torch.Tensor)
    ]
    return {
        "params": f"{signature_many(p.detach() for p in engine.module.parameters()):016x}",
        "optim": f"{signature_many(slots):016x}",
        "rng": f"{signature(torch.get_rng_state()):016x}",
    }


def _build(
    kind: str, stage: int, section: dict[str, Any] | None, sp_or_ep: int, experts: int | None = None
) -> Any:
    """A fresh engine of ``kind`` ("ulysses" or "moe", with ``experts`` experts per MoE
    layer: default one per expert-parallel rank) through ``scout_deepspeed.initialize``."""
    import deepspeed
    import scout_deepspeed

    world = dist.get_world_size()
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    if kind == "ulysses":
        from deepspeed.runtime.sequence_parallel import parallel_state_sp as mpu

        if mpu._SEQUENCE_PARALLEL_GROUP is None:
            mpu.initialize_sequence_parallel(sp_or_ep)
        model: nn.Module = UlyssesLM(mpu.get_sequence_parallel_group())
        # Every rank of a sequence group trains on a slice of the same samples.
        cfg = _config(stage, section, MICRO * (world // sp_or_ep))
        engine, *_ = scout_deepspeed.initialize(
            model=model, model_parameters=model.parameters(), config=cfg, mpu=mpu
        )
    else:
        from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer

        model = MoELM(sp_or_ep, experts=experts)
        params = split_params_into_different_moe_groups_for_optimizer(
            {"params": list(model.parameters()), "name": "params"}
        )
        cfg = _config(stage, section, MICRO * world)
        engine, *_ = scout_deepspeed.initialize(model=model, model_parameters=params, config=cfg)
    return engine


def _tokens(kind: str, step: int, rank: int, sp_or_ep: int) -> torch.Tensor:
    if kind == "ulysses":
        data_rank, c = divmod(rank, sp_or_ep)
        full = batch(step, data_rank, size=MICRO, seq=SEQ)
        shard = SEQ // sp_or_ep
        # Inputs and next-token labels of this rank's slice of the sequence.
        return full[:, c * shard : (c + 1) * shard + 1]
    return batch(step, rank, size=MICRO, seq=SEQ)


def _train_step(engine: Any, kind: str, step: int, rank: int, sp_or_ep: int) -> float:
    tokens = _tokens(kind, step, rank, sp_or_ep)
    logits = engine(tokens[:, :-1])
    loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
    engine.backward(loss)
    engine.step()
    return float(loss.detach())


def parallel_scenario(
    kind: str, sp_or_ep: int, stage: int, faults: list[dict[str, Any]], steps: int
) -> dict[str, Any]:
    """Train ``steps`` iterations with SCOUT on and the (persistent) faults injected."""
    import scout_deepspeed
    from scout_deepspeed.adapter import inner_optimizer

    rank = dist.get_rank()
    engine = _build(kind, stage, _section(recipes=["hidden"]), sp_or_ep)
    session = scout_deepspeed.session_of(engine)
    assert session is not None and session.adapter is not None
    adapter = session.adapter
    rounds = round_log(session).rounds
    inj = _faults(faults).attach(engine.module, inner_optimizer(engine))
    for step in range(steps):
        _train_step(engine, kind, step, rank, sp_or_ep)
    out = {
        "rank": rank,
        "verdicts": [r.to_dict() for r in session.verdicts],
        "rounds": len(rounds),
        "ready": sum(1 for o in rounds if o.ready),
        "fired": inj.fired(),
        "layout": str(adapter.layout()),
        "address": list(adapter.address().as_tuple()),
        "peers": list(adapter.layout().replica_group(rank)),
        "groups": sorted(adapter.training_groups()),
        "repointed": adapter.repointed_summary(),
        "layers": [ref.path for ref in adapter.repeated_layers()],
        "reasons": [[o.step, o.recipe.name, o.ready, o.reason] for o in rounds],
    }
    session.close()
    return out


def bitwise_on_off(kind: str, sp_or_ep: int, stage: int, steps: int) -> dict[str, Any]:
    """Train twice from the same seed, the "scout" section absent then present."""
    import scout_deepspeed

    rank = dist.get_rank()
    out: dict[str, Any] = {"rank": rank}
    for label in ("off", "on"):
        section = _section() if label == "on" else None
        engine = _build(kind, stage, section, sp_or_ep)
        session = scout_deepspeed.session_of(engine)
        assert session is not None
        out[f"{label}_attached"] = session.adapter is not None
        rounds = round_log(session).rounds
        torch.manual_seed(1)
        losses = [_train_step(engine, kind, s, rank, sp_or_ep) for s in range(steps)]
        out[label] = _signatures(engine)
        out[f"{label}_losses"] = [float(x).hex() for x in losses]
        if label == "on":
            out["rounds"] = len(rounds)
            out["ready"] = sum(1 for o in rounds if o.ready)
            out["verdicts"] = [r.to_dict() for r in session.verdicts]
        session.close()
    return out


# -- AutoTP: DeepSpeed's own tensor-parallel training ----------------------------------

TP_DIM = 8
TP_HIDDEN = 16
AUTOTP_SPECS = {
    "use_default_specs": False,
    "layer_specs": [
        {"patterns": [r".*\.up\.weight$"], "partition_type": "column"},
        {"patterns": [r".*\.down\.weight$"], "partition_type": "row"},
    ],
}
"""AutoTP's partition rules for :class:`TPNet`: ``up`` column-parallel (its output rows
split), ``down`` row-parallel (its input columns split, outputs all-reduced)."""


class _TPBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(TP_DIM, TP_HIDDEN)
        self.down = nn.Linear(TP_HIDDEN, TP_DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


class TPNet(nn.Module):
    """Two MLP blocks that AutoTP shards by :data:`AUTOTP_SPECS`."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_TPBlock() for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def autotp_layout(tp: int) -> dict[str, Any]:
    """A real DeepSpeed AutoTP training engine (``tensor_parallel.autotp_size = tp``,
    ZeRO-1) trains one step; the plugin's layout is derived from it and compared, on
    this rank, with the groups DeepSpeed built (``deepspeed.utils.groups``)."""
    import deepspeed
    from deepspeed.utils import groups
    from scout_deepspeed.layout import check_layout, engine_layout, layout_group

    from scout_core import Axis, UnsupportedSetupError
    from scout_core.plugin_api import group_ranks

    def sorted_ranks(group: Any) -> list[int]:
        return [] if group is None else sorted(group_ranks(group))

    rank, world = dist.get_rank(), dist.get_world_size()
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = TPNet()
    cfg = {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}},
        "zero_optimization": {"stage": 1},
        "steps_per_print": 10_000,
        "tensor_parallel": {"autotp_size": tp, "partition_config": AUTOTP_SPECS},
    }
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    # The ranks of a TP group see the same batch (DeepSpeed checks that at the first
    # forward); the data-parallel ranks see different ones.
    gen = torch.Generator().manual_seed(rank // tp)
    loss = engine(torch.randn(MICRO, TP_DIM, generator=gen)).square().mean()
    engine.backward(loss)
    engine.step()
    layout = engine_layout(engine, world)
    try:
        engine_layout(engine, 2 * world)
        wrong_world = None
    except UnsupportedSetupError as exc:
        wrong_world = str(exc)
    return {
        "rank": rank,
        "loss": float(loss.detach()),
        "shapes": {n: list(p.shape) for n, p in engine.module.named_parameters()},
        "mp_world_size": int(engine.mp_world_size),
        "dp_world_size": int(engine.dp_world_size),
        "ds_tp_group": sorted_ranks(groups.get_tensor_model_parallel_group()),
        "ds_dp_group": sorted_ranks(engine.data_parallel_group),
        "sizes": {a.value: layout.size(a) for a in Axis},
        "layout_tp_group": list(layout_group(layout, rank, (Axis.T,))),
        "layout_peers": list(layout.replica_group(rank)),
        "check": check_layout(engine, layout, rank),
        "wrong_world": wrong_world,
    }
