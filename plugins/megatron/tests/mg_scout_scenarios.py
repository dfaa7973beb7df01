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

from scout_core.testing import BUSY_HOST, RoundLog

STEP_FIELDS = ("step", "surface", "failure", "status", "outliers", "scope", "group")


def section(**over: Any) -> dict[str, Any]:
    """SCOUT settings of the tests: replay every step, everything else every 4 steps.

    Six ranks share two loaded CPU cores: the straggler thresholds are
    ``scout_core.testing.BUSY_HOST``'s (the injected straggler is 3 x 0.2 s per round).
    """
    base: dict[str, Any] = {
        **BUSY_HOST,
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


def train(
    faults: list[dict[str, Any]], steps: int, over: dict[str, Any], mode: str = "attach"
) -> dict[str, Any]:
    """Train ``steps`` iterations with SCOUT and the faults; the verdicts and rounds.

    ``mode`` ``"attach"``: :func:`scout_megatron.attach` before the loop; ``"bridge"``:
    the real Bridge ``CallbackManager`` drives the callbacks ``callbacks_from`` returns
    for a Bridge-shaped config whose ``env_vars`` name a SCOUT config file.
    """
    import json
    from types import SimpleNamespace

    import scout_megatron
    from scout_megatron import testing as mgt
    from scout_megatron.bridge import bridge_callbacks
    from scout_megatron.testing.bridge_loop import run_bridge_loop

    from scout_core import Config

    spec, model, ddp, opt = build(over.pop("spec", None))
    records: list[Any] = []
    rounds: list[Any] = []
    inner = opt.chained_optimizers[0].optimizer
    injector = faults_from(faults, steps).attach(model, inner)
    if mode == "attach":
        session = scout_megatron.attach([ddp], opt, Config(**section(**over)))
        session.on_boundary(lambda b: rounds.extend(b.rounds))
        for step in range(steps):
            mgt.train_step(ddp, opt, mgt.get_batch(spec, step))
        records = list(session.verdicts)
        attached = [session.step]
        session.close()
    else:
        rank = torch.distributed.get_rank()
        path = os.path.join(os.environ["SCOUT_TEST_RANK_DIR"], f"scout-{rank}.json")
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(section(**over), fh)
        bridge_config = SimpleNamespace(env_vars={"SCOUT_CONFIG": path})
        callbacks = scout_megatron.callbacks_from(bridge_config, callback=records.append)
        scout = callbacks[0]
        attached = []

        def count(ctx: Any) -> None:  # after ScoutCallback's on_train_start
            ctx.user_state["scout"].on_boundary(lambda b: rounds.extend(b.rounds))
            attached.append(ctx.user_state["scout"].step)

        api = bridge_callbacks()
        manager = api.CallbackManager()
        manager.add(callbacks)
        manager.register("on_train_start", count)
        state = run_bridge_loop(manager, [ddp], opt, spec, steps)
        attached.append(state.train_state.step)
        attached.append(scout.session is None)  # on_train_end closed it
    out = {
        "rank": torch.distributed.get_rank(),
        "verdicts": verdict_rows(records),
        "rounds": len(rounds),
        "unready": sum(1 for r in rounds if not r.ready),
        "fired": len(injector.fired()),
        "attached": attached,
    }
    injector.detach()
    mgt.teardown()
    return out


def clean_and_bitwise(steps: int, over: dict[str, Any]) -> dict[str, Any]:
    """Train ``steps`` clean iterations with SCOUT on (observer too), then the same job
    with SCOUT off in this process; verdicts, rounds and both runs' final digests."""
    import scout_megatron
    from scout_megatron import testing as mgt

    from scout_core import Config

    spec_kwargs = {"dropout": 0.1}
    runs: dict[str, Any] = {}
    log = RoundLog()
    for mode in ("on", "off"):
        spec, model, ddp, opt = build(spec_kwargs)
        session = None
        if mode == "on":
            session = scout_megatron.attach([ddp], opt, Config(**section(**over)))
            session.on_boundary(log)
        losses = [mgt.train_step(ddp, opt, mgt.get_batch(spec, s)) for s in range(steps)]
        runs[mode] = {
            "digest": mgt.digest(model, opt),
            "losses": losses,
            "rng": torch.get_rng_state().sum().item(),
        }
        if session is not None:
            runs["verdicts"] = verdict_rows(session.verdicts)
            runs.update(log.summary())
            runs["recipes"] = sorted({r.recipe.name for r in log.rounds})
            runs["observer"] = session.observer is not None
            session.close()
        mgt.teardown()
    return runs


def frozen(culprit: int, at_step: int, steps: int, over: dict[str, Any]) -> dict[str, Any]:
    """Train with SCOUT and the observer; before step ``at_step`` the culprit says so in
    ``freeze-ready`` and idles a moment, in which the test SIGSTOPs it; the others go on
    into the step's collectives and wait there."""
    import time
    from pathlib import Path

    import scout_megatron
    from scout_megatron import testing as mgt

    from scout_core import Config

    spec, _, ddp, opt = build()
    session = scout_megatron.attach([ddp], opt, Config(**section(**over)))
    rank = torch.distributed.get_rank()
    for step in range(steps):
        if rank == culprit and step == at_step:
            marker = Path(os.environ["SCOUT_TEST_RANK_DIR"]) / "freeze-ready"
            marker.with_suffix(".tmp").write_text(str(os.getpid()))
            marker.with_suffix(".tmp").rename(marker)
            time.sleep(2.0)  # stopped here
        mgt.train_step(ddp, opt, mgt.get_batch(spec, step))
    hangs = [v.to_dict() for v in session.verdicts if v.failure and v.failure.value == "hang"]
    out = {
        "rank": rank,
        "verdicts": verdict_rows(session.verdicts),
        "steps": session.step,
        "stages": [h["detail"]["stages"] for h in hangs],
        "position": [h["detail"].get("position") for h in hangs],
        "records": [v.to_dict() for v in session.verdicts],
    }
    session.close()
    mgt.teardown()
    return out
