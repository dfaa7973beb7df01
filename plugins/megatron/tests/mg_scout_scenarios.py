"""Rank bodies for the SCOUT-on-Megatron tests: a real GPTModel, DP3 x TP2, SCOUT attached.

Each body builds the tiny GPT of :mod:`scout_megatron.testing` (two layers; global
rank = t + 2d, so the replica groups are {0, 2, 4} and {1, 3, 5}), attaches SCOUT
with :func:`scout_megatron.attach`, arms the faults from ``scout_core.testing`` on
one rank and trains. Every body returns JSON.
"""

from __future__ import annotations

import os
from typing import Any

import torch

STEP_FIELDS = ("step", "surface", "failure", "status", "outliers", "scope", "group")


def section(**over: Any) -> dict[str, Any]:
    """SCOUT settings of the tests: replay every step, everything else every 4 steps."""
    base: dict[str, Any] = {
        "report_dir": os.path.join(os.environ["SCOUT_TEST_RANK_DIR"], "report"),
        "run_id": "megatron-test",
        "replay_interval": 1,
        "embedding_interval": 4,
        "lm_head_interval": 4,
        "optimizer_interval": 4,
        "observer": False,
    }
    base.update(over)
    return base


def verdict_rows(records: Any) -> list[list[Any]]:
    """The fields tests compare, one row per verdict record."""
    rows = []
    for record in records:
        d = record.to_dict()
        rows.append([d[k] for k in STEP_FIELDS])
    return rows


def build(spec_kwargs: dict[str, Any] | None = None, seed: int = 1234) -> tuple[Any, ...]:
    """(spec, model, ddp, optimizer) of the tiny GPT, DP x TP2, Megatron initialised."""
    from scout_megatron import testing as mgt

    mgt.initialize(tensor_model_parallel_size=2, seed=seed)
    spec = mgt.TinyGPT(**(spec_kwargs or {}))
    model = mgt.build_model(spec)
    return spec, model, mgt.wrap_ddp(model), mgt.build_optimizer([model])


def faults_from(specs: list[dict[str, Any]], steps: int) -> Any:
    """A ``Faults`` schedule: ``sdc`` (flip the lowest bit of a layer's output) or
    ``straggler`` (sleep inside a layer), on one rank, over a range of steps."""
    from scout_core.testing import BitFlip, Faults

    faults = Faults()
    for f in specs:
        when = faults.at(rank=f["rank"], steps=range(f["start"], f.get("stop", steps)))
        for target in f["targets"]:
            if f["kind"] == "sdc":
                when.corrupt_output(target, BitFlip(bit=0))
            else:
                when.delay_compute(target, f["seconds"])
    return faults


def train(faults: list[dict[str, Any]], steps: int, over: dict[str, Any]) -> dict[str, Any]:
    """Train ``steps`` iterations with SCOUT and the faults; the verdicts and rounds."""
    import scout_megatron
    from scout_megatron import testing as mgt

    from scout_core import Config

    spec, model, ddp, opt = build(over.pop("spec", None))
    session = scout_megatron.attach([ddp], opt, Config(**section(**over)))
    rounds: list[Any] = []
    session.on_boundary(lambda b: rounds.extend(b.rounds))
    inner = session.adapter.optimizers()[0]
    injector = faults_from(faults, steps).attach(model, inner)
    for step in range(steps):
        mgt.train_step(ddp, opt, mgt.get_batch(spec, step))
    out = {
        "rank": torch.distributed.get_rank(),
        "verdicts": verdict_rows(session.verdicts),
        "rounds": len(rounds),
        "inconclusive": sum(
            1 for r in rounds if not r.ready or any(v.status.value == "inconclusive"
                                                    for v in r.results.values())
        ),
        "fired": len(injector.fired()),
        "steps": session.step,
    }
    injector.detach()
    session.close()
    mgt.teardown()
    return out
