"""A small GPT-style model trained with DeepSpeed, watched by SCOUT; prints the verdicts.

Launch (CPU, Gloo, 4 local ranks, about a minute on two cores)::

    torchrun --standalone --nproc_per_node 4 examples/deepspeed/train.py --inject sdc:rank=2,step=5

or with DeepSpeed's launcher::

    deepspeed --num_gpus 4 examples/deepspeed/train.py --inject straggler:rank=1,step=8

The only SCOUT-specific change to an ordinary DeepSpeed script is the ``"scout"``
section in ``ds_config.json`` and calling ``scout_deepspeed.initialize`` where the
script called ``deepspeed.initialize`` (``scout.enable(engine)`` after
``deepspeed.initialize`` does the same). ``--inject`` simulates a fault on one rank
from a step on, using SCOUT's test injectors:

* ``sdc:rank=R,step=S``: every transformer block on rank R flips the lowest
  mantissa bit of its output from step S on (a silent, persistent compute fault);
* ``straggler:rank=R,step=S``: every block on rank R sleeps 100 ms per call from
  step S on (a slow rank that stays slow);
* ``hang:rank=R,step=S``: rank R freezes for ``hang_timeout_s`` + 5 s when step S
  starts (a hung trainer; its peers wait for it in the step's collectives). The hang
  observer is on in ``ds_config.json`` (``"observer": true``); this sets
  ``hang_timeout_s`` to 5 s unless the ``"scout"`` section sets it.

Rank 0 prints every verdict; the evidence also lands in the report directory of
the ``"scout"`` section (``scout report <dir>`` renders it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path
from typing import Any

import scout_deepspeed
import torch
import torch.distributed as dist
from torch import nn

VOCAB = 64
SEQ = 16


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        out: torch.Tensor = self.proj(y)
        return out


class GPTBlock(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln1(x)))
        out: torch.Tensor = x + self.drop(self.mlp(self.ln2(x)))
        return out


class TinyGPT(nn.Module):
    def __init__(self, dim: int = 32, heads: int = 4, layers: int = 4) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, dim)
        self.pos = nn.Parameter(torch.zeros(SEQ, dim))
        self.blocks = nn.ModuleList(GPTBlock(dim, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        out: torch.Tensor = self.lm_head(self.ln_f(x))
        return out


def parse_inject(text: str | None) -> dict[str, Any] | None:
    """``kind:rank=R,step=S`` → {"kind", "rank", "step"}."""
    if not text:
        return None
    kind, _, rest = text.partition(":")
    if kind not in {"sdc", "straggler", "hang"}:
        raise SystemExit(f"--inject: unknown fault {kind!r}; use sdc, straggler or hang")
    fields = dict(item.split("=", 1) for item in rest.split(",") if item)
    try:
        return {"kind": kind, "rank": int(fields["rank"]), "step": int(fields["step"])}
    except (KeyError, ValueError):
        raise SystemExit(f"--inject {text!r}: expected {kind}:rank=R,step=S") from None


def attach_fault(
    spec: dict[str, Any] | None, model: TinyGPT, opt: Any, steps: int, hang_s: float
) -> Any:
    from scout_core.testing import BitFlip, Faults

    if spec is None:
        return None
    faults = Faults()
    if spec["kind"] == "sdc":
        when = faults.at(rank=spec["rank"], steps=range(spec["step"], steps))
        for i in range(len(model.blocks)):
            when.corrupt_output(f"blocks.{i}", BitFlip(bit=0))
    elif spec["kind"] == "straggler":
        # Slow from step S to the end, as a degraded GPU stays slow: a window of a few
        # steps could end before two replay rounds confirm it on a busy machine.
        when = faults.at(rank=spec["rank"], steps=range(spec["step"], steps))
        for i in range(len(model.blocks)):
            when.delay_compute(f"blocks.{i}", 0.1)
    else:
        faults.at(rank=spec["rank"], step=spec["step"]).hang(hang_s)
    return faults.attach(model, opt)


def report(spec: dict[str, Any] | None, verdicts: list[Any], replicas: int) -> None:
    """Print the injected fault and every verdict of this rank's session."""
    if spec is not None:
        print(f"injected: {spec['kind']} on rank {spec['rank']} from step {spec['step']}")
    if not verdicts:
        print("SCOUT: no verdicts")
    if replicas < 3:
        # Two peers have no majority: SCOUT names no rank, and a slow one is not flagged.
        print(
            f"note: {replicas} replica(s) (--nproc_per_node): SCOUT needs 3 or more to name "
            "a rank, so a fault here may go unnamed"
        )
    for record in verdicts:
        v = record.to_dict()
        who = ", ".join(f"rank {r}" for r in v["outliers"]) or "no single rank"
        stages = v["detail"].get("stages", {})  # the hang observer's: where each rank was
        seen = "".join(f"; rank {r} {stages[str(r)]}" for r in v["outliers"] if str(r) in stages)
        print(
            f"SCOUT verdict: step {v['step']} {v['failure'] or v['status']} on {who} "
            f"({v['scope']}, surface {v['surface']}, peers {v['group']}{seen})",
            flush=True,
        )


def main() -> None:
    here = Path(__file__).resolve().parent
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(here / "ds_config.json"))
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--zero-stage", type=int, default=None, help="override the config")
    parser.add_argument("--report-dir", default=None, help="override the scout report_dir")
    parser.add_argument("--inject", default=None, help="sdc|straggler|hang:rank=R,step=S")
    parser.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    spec = parse_inject(args.inject)

    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    config = json.loads(Path(args.config).read_text())
    config["train_batch_size"] = config["train_micro_batch_size_per_gpu"] * world
    if args.zero_stage is not None:
        config["zero_optimization"]["stage"] = args.zero_stage
    if args.report_dir is not None:
        config["scout"]["report_dir"] = args.report_dir
    if spec is not None and spec["kind"] == "hang":
        config["scout"]["observer"] = True
        config["scout"].setdefault("hang_timeout_s", 5.0)

    torch.manual_seed(0)
    model = TinyGPT()
    engine, _, _, _ = scout_deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=config
    )
    session = scout_deepspeed.session_of(engine)
    inner = getattr(engine.optimizer, "optimizer", engine.optimizer)
    hang_s = float(config["scout"].get("hang_timeout_s", 0.0)) + 5.0
    faults = attach_fault(spec, model, inner, args.steps, hang_s)

    for step in range(args.steps):
        gen = torch.Generator().manual_seed(1000 * step + rank)
        tokens = torch.randint(
            0, VOCAB, (config["train_micro_batch_size_per_gpu"], SEQ + 1), generator=gen
        )
        logits = engine(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        engine.backward(loss)
        engine.step()
        if rank == 0 and step % 4 == 0:
            print(f"step {step:3d}  loss {loss.item():.4f}", flush=True)

    if rank == 0:
        report(spec, [] if session is None else list(session.verdicts), world)
    if faults is not None:
        faults.detach()
    if session is not None:
        session.close()
    dist.barrier()
    if os.environ.get("LOCAL_RANK", "0") == "0" and rank == 0:
        print("done")


if __name__ == "__main__":
    main()
