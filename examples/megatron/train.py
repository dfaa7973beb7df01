"""A small GPT trained with real megatron-core on CPU, 6 ranks (DP3 x TP2), watched by SCOUT.

Launch (CPU, Gloo, about two minutes on two cores)::

    torchrun --standalone --nproc_per_node 6 examples/megatron/train.py --inject sdc:rank=4,step=3

or, the same launcher as a module::

    python -m torch.distributed.run --standalone --nproc_per_node 6 \
        examples/megatron/train.py --inject straggler:rank=3,step=4

Both run on either supported range of megatron-core, with that environment's Python
and torchrun first on PATH: 0.19.2 on Python 3.12 (the project's ``.venv``, made by
``scripts/bootstrap.sh``) or 0.16.1 on Python 3.11 (``.venv-mcore016``, made by
``scripts/test_megatron016.sh``)::

    PATH=$PWD/.venv/bin:$PATH            # megatron-core 0.19.2
    PATH=$PWD/.venv-mcore016/bin:$PATH   # megatron-core 0.16.1

The SCOUT-specific lines of an ordinary megatron-core script are one call after the
model and optimizer exist, ``scout_megatron.attach(model_chunks, optimizer, config)``,
with the settings in ``scout.toml`` beside this file (a Megatron-Bridge job passes
``callbacks=scout_megatron.callbacks_from(cfg)`` to ``pretrain`` instead, a
Megatron-LM job adds ``extra_args_provider=scout_megatron.add_args``). Megatron's
DDP and optimizer setup need CUDA, so on CPU the job is assembled from the same
megatron-core parts with the CPU shims of ``scout_megatron.testing`` (torch DDP over
Megatron's data-parallel group, Megatron's ``ChainedOptimizer([FP32Optimizer(AdamW)])``).
Global rank = t + 2d: ranks 0/2/4 and 1/3/5 hold the same TP shard.

``--inject`` simulates a fault on one rank from a step on, with SCOUT's test injectors:

* ``sdc:rank=R,step=S``: every transformer layer on rank R flips the lowest mantissa
  bit of its output from step S on (a silent, persistent compute fault);
* ``straggler:rank=R,step=S``: every layer on rank R sleeps 200 ms per call for six
  steps from step S (a slow rank);
* ``hang:rank=R,step=S``: rank R freezes for ``hang_timeout_s`` + 5 s when step S
  starts (a hung trainer; its peers wait for it in the step's collectives).

Rank 0 prints every verdict of the run (from the evidence in ``--report-dir``, which
``scout report <dir>`` also renders) and the script exits 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

FAULTS = ("sdc", "straggler", "hang")


def parse_inject(text: str | None) -> dict[str, Any] | None:
    """``kind:rank=R,step=S`` -> {"kind", "rank", "step"}."""
    if not text:
        return None
    kind, _, rest = text.partition(":")
    fields = dict(item.split("=", 1) for item in rest.split(",") if "=" in item)
    if kind not in FAULTS or not {"rank", "step"} <= set(fields):
        raise SystemExit(f"--inject {text!r}: expected one of {'/'.join(FAULTS)}:rank=R,step=S")
    try:
        return {"kind": kind, "rank": int(fields["rank"]), "step": int(fields["step"])}
    except ValueError:
        raise SystemExit(f"--inject {text!r}: rank and step are integers") from None


def arm(
    spec: dict[str, Any] | None, model: Any, optimizer: Any, *, steps: int, hang_s: float
) -> Any:
    """The fault of ``spec`` on its rank, as ``scout_core.testing.Faults``; None for none."""
    from scout_core.testing import BitFlip, Faults

    if spec is None:
        return None
    faults = Faults()
    rank, step = spec["rank"], spec["step"]
    layers = [name for name, _ in model.decoder.layers.named_children()]
    if spec["kind"] == "sdc":
        when = faults.at(rank=rank, steps=range(step, steps))
        for i in layers:
            when.corrupt_output(f"decoder.layers.{i}", BitFlip(bit=0))
    elif spec["kind"] == "straggler":
        when = faults.at(rank=rank, steps=range(step, step + 6))
        for i in layers:
            when.delay_compute(f"decoder.layers.{i}", 0.2)
    else:
        faults.at(rank=rank, step=step).hang(hang_s)
    return faults.attach(model, optimizer)


def report(report_dir: str, run_id: str, spec: dict[str, Any] | None) -> None:
    """Print this run's verdicts, every rank's, from the evidence files."""
    from scout_core import load_report

    if spec is not None:
        print(f"injected: {spec['kind']} on rank {spec['rank']} from step {spec['step']}")
    verdicts = [r for r in load_report(report_dir).verdicts() if r.run_id == run_id]
    if not verdicts:
        print("SCOUT: no verdicts")
    lines: dict[tuple[Any, ...], list[str]] = {}
    for record in verdicts:  # one line per decision; its surfaces listed together
        v = record.to_dict()
        what = v["failure"] or v["status"]
        stages = v["detail"].get("stages", {})  # the hang observer's: where each rank was
        where = tuple(f"rank {r} {stages[str(r)]}" for r in v["outliers"] if str(r) in stages)
        key = (v["step"], what, tuple(v["outliers"]), v["scope"], tuple(v["group"]), where)
        lines.setdefault(key, []).append(v["surface"])
    for (step, what, outliers, scope, group, where), surfaces in sorted(lines.items()):
        who = ", ".join(f"rank {r}" for r in outliers) or "no single rank"
        seen = f"; {', '.join(where)}" if where else ""
        print(
            f"SCOUT verdict: step {step} {what} on {who} ({scope}, surface "
            f"{', '.join(surfaces)}, peers {list(group)}{seen})",
            flush=True,
        )


def main() -> None:
    here = Path(__file__).resolve().parent
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--config", default=str(here / "scout.toml"), help="SCOUT settings")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--report-dir", default=None, help="override the scout report_dir")
    parser.add_argument("--inject", default=None, help="sdc|straggler|hang:rank=R,step=S")
    args = parser.parse_args()
    spec = parse_inject(args.inject)

    warnings.filterwarnings("ignore", module="megatron")  # "Apex is not installed" ...
    import scout_megatron
    from scout_megatron import testing as mgt

    from scout_core import Config

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if dist.get_world_size() != 6:
        # Said once, by rank 0: every rank exits, and a line from each interleaved.
        world = dist.get_world_size()
        dist.destroy_process_group()
        raise SystemExit(
            f"run this example on 6 ranks (--nproc_per_node 6): DP3 x TP2, not {world}"
            if rank == 0
            else 1
        )
    config = Config.from_file(args.config)
    if args.report_dir is not None:
        config = dataclasses.replace(config, report_dir=args.report_dir)

    mgt.initialize(tensor_model_parallel_size=2)  # Megatron's groups, then the CPU shims
    spec_gpt = mgt.TinyGPT()
    model = mgt.build_model(spec_gpt)  # a megatron.core GPTModel
    ddp = mgt.wrap_ddp(model)
    optimizer = mgt.build_optimizer([model])

    session = scout_megatron.attach([ddp], optimizer, config)  # <- SCOUT

    inner = optimizer.chained_optimizers[0].optimizer
    faults = arm(spec, model, inner, steps=args.steps, hang_s=config.hang_timeout_s + 5.0)
    for step in range(args.steps):
        loss = mgt.train_step(ddp, optimizer, mgt.get_batch(spec_gpt, step))
        if rank == 0 and step % 4 == 0:
            print(f"step {step:3d}  loss {loss:.4f}", flush=True)

    if faults is not None:
        faults.detach()
    session.close()
    dist.barrier()  # every rank's evidence is written
    if rank == 0:
        report(config.report_dir, session.config.resolved_run_id(), spec)  # the agreed run id
        print("done")
    mgt.teardown()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    main()
