"""Rank bodies shared by the replay tests: build a parallel setup, inject, train, report.

Each body runs on every rank (spawned by ``run_ranks``) and returns JSON: the
verdicts this rank saw, and for the bitwise test signatures of the final state.
Setups: ``ddp`` (pure d), ``fsdp`` (pure s, FSDP2), ``hsdp`` (d x s, FSDP2 on a 2-D
mesh; world/2 replicas of 2 shards) and ``dptp`` (d x t, TP degree 2: each block's
``fc1``/``fc2`` parallelized colwise/rowwise on the ``tp`` sub-mesh, then
``DistributedDataParallel(device_mesh=mesh["dp"])``, PyTorch's DDP+TP recipe). SCOUT
derives every layout itself (no ``mesh=``).
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from scout_core.testing import BUSY_HOST, RoundLog
from scout_core.testing.models import TinyLM, train_step


def _corruption(spec: list[Any]) -> Any:
    from scout_core.testing.injectors import AddNoise, BitFlip, Scale

    kind, *rest = spec
    return {"bitflip": BitFlip, "scale": Scale, "noise": AddNoise}[kind](*rest)


def _faults(specs: list[dict[str, Any]]) -> Any:
    from scout_core.testing.injectors import Faults

    faults = Faults()
    for f in specs:
        when: dict[str, Any] = {"rank": f["rank"]}
        if "steps" in f:
            when["steps"] = range(*f["steps"])
        else:
            when["step"] = f["step"]
        t = faults.at(**when)
        kind = f["kind"]
        if kind == "output":
            t.corrupt_output(f["target"], _corruption(f["how"]))
        elif kind == "param":
            t.corrupt_param(f["target"], _corruption(f["how"]))
        elif kind == "grad":
            t.corrupt_grad(f["target"], _corruption(f["how"]))
        elif kind == "optim":
            t.corrupt_optimizer_state(f["target"], _corruption(f["how"]), key=f.get("key", ""))
        elif kind == "delay":
            t.delay_compute(f["target"], f["seconds"])
        elif kind == "collective":
            t.delay_collective(f["seconds"], group=f.get("group", "any"))
        elif kind == "skip":
            t.skip_capture(f.get("target"))
    return faults


def build(setup: str) -> tuple[nn.Module, nn.Module, Any]:
    """(model the loop calls, the unwrapped TinyLM, mesh or None) for ``setup``: the
    campaign's builder (``scout_core.campaign.torch_setups``), which makes each setup
    the way these tests do."""
    from scout_core.campaign.torch_setups import build as build_setup

    wrapped, model = build_setup(setup)
    return wrapped, model, None


def data_rank(setup: str, rank: int) -> int:
    """The data-parallel index whose batch ``rank`` trains on (TP partners share one)."""
    return rank // 2 if setup == "dptp" else rank


def scenario(
    setup: str, faults: list[dict[str, Any]], steps: int, cfg: dict[str, Any]
) -> dict[str, Any]:
    """Train ``steps`` iterations with SCOUT and the faults; return the verdicts seen."""
    from scout_core.config import Config
    from scout_core.plugin.torch_plugin import enable_torch

    rank = dist.get_rank()
    wrapped, _, mesh = build(setup)
    opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-2)
    inj = _faults(faults).attach(wrapped, opt)
    report = os.path.join(os.environ["SCOUT_TEST_RANK_DIR"], "report")
    base: dict[str, Any] = {
        "report_dir": report,
        "run_id": "test",
        "replay_interval": 1,
        "embedding_interval": 1,
        "lm_head_interval": 1,
        "optimizer_interval": 1,
        "observer": False,
        **BUSY_HOST,
    }
    base.update(cfg)
    with enable_torch(wrapped, opt, Config(**base), mesh=mesh) as session:
        log = RoundLog()
        session.on_boundary(log)
        for step in range(steps):
            train_step(wrapped, opt, step, data_rank(setup, rank))
        verdicts = [r.to_dict() for r in session.verdicts]
    # Its taps (collective delays, capture vetoes) are process-wide: a shared job's next
    # case (scout_core.testing.shared_jobs) must not inherit them.
    inj.detach()
    return {"verdicts": verdicts, **log.summary(), "fired": inj.fired(), "rank": rank}


def _state_signature(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, str]:
    from scout_core.decision.signature import signature, signature_many

    def local(t: torch.Tensor) -> torch.Tensor:
        return t.to_local() if hasattr(t, "to_local") else t

    # The optimizer's parameters: DDP's TP transform unregisters TP parameters from
    # the model, but the optimizer still holds every one of them.
    held = [p for g in opt.param_groups for p in g["params"]]
    params = signature_many(local(p.detach()) for p in held)
    slots = []
    for p in held:
        for key in sorted(opt.state.get(p, {})):
            v = opt.state[p][key]
            if isinstance(v, torch.Tensor):
                slots.append(local(v))
    return {
        "params": f"{params:016x}",
        "optim": f"{signature_many(slots):016x}",
        "rng": f"{signature(torch.get_rng_state()):016x}",
    }


def bitwise(setup: str, steps: int) -> dict[str, Any]:
    """Train twice from the same seed, SCOUT off then on; return both state signatures."""
    from scout_core.config import Config
    from scout_core.plugin.torch_plugin import enable_torch

    rank = dist.get_rank()
    out: dict[str, Any] = {}
    log = RoundLog()
    for label in ("off", "on"):
        wrapped, _, mesh = build(setup)
        opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-2)
        torch.manual_seed(1)
        session = None
        if label == "on":
            report = os.path.join(os.environ["SCOUT_TEST_RANK_DIR"], "report")
            cfg = Config(
                report_dir=report,
                run_id="test",
                replay_interval=1,
                embedding_interval=1,
                lm_head_interval=1,
                optimizer_interval=1,
                observer=False,
                **BUSY_HOST,
            )
            session = enable_torch(wrapped, opt, cfg, mesh=mesh)
            session.on_boundary(log)
        for step in range(steps):
            train_step(wrapped, opt, step, data_rank(setup, rank))
        out[label] = _state_signature(wrapped, opt)
        if session is not None:
            out.update(log.summary())
            out["verdicts"] = [r.to_dict() for r in session.verdicts]
            session.close()
    return out


def bad_layer_path() -> str:
    """enable() with a layer path that does not exist; returns the error message."""
    from torch.nn.parallel import DistributedDataParallel

    from scout_core.config import Config
    from scout_core.errors import ConfigError
    from scout_core.plugin.torch_plugin import enable_torch

    torch.manual_seed(0)
    model = DistributedDataParallel(TinyLM())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    try:
        enable_torch(model, opt, Config(layers="model.blocks", observer=False))
    except ConfigError as exc:
        return str(exc)
    return "no error"
