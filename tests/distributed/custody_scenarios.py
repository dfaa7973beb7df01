"""Rank bodies of the parameter-custody tests (imported by the spawned ranks).

One body per family: the core's own layouts (``ddp``, ``fsdp``, ``hsdp``, ``dptp``, built
as the campaign builds them) and DeepSpeed ZeRO 1-3 (the DeepSpeed campaign's engine).
SCOUT attaches first; then, on the victim only, a bit of one parameter's local values
flips right after every optimizer step from ``start`` on
(:meth:`~scout_core.testing.Trigger.corrupt_param_after_step`, a step post-hook
registered after SCOUT's), or, with ``spec["slot"]``, a bit of that parameter's optimizer
slot (``corrupt_optimizer_state_after_step``). Each rank returns the verdicts it saw,
what fired and, with the gate on, what the gate holds.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

from scout_core.testing import BUSY_HOST
from scout_core.testing.injectors import BitFlip, Faults


def _config(spec: dict[str, Any]) -> dict[str, Any]:
    report = os.path.join(os.environ["SCOUT_TEST_RANK_DIR"], "report")
    cfg: dict[str, Any] = {
        "report_dir": report,
        "run_id": "custody",
        "observer": False,
        "custody_slices": int(spec["slices"]),
        "gate": bool(spec.get("gate", False)),
        **BUSY_HOST,
    }
    cfg.update(spec.get("scout", {}))
    return cfg


def _arm(spec: dict[str, Any], model: Any, opt: Any) -> Faults | None:
    """The fault on the victim, after SCOUT attached (its post-hook runs second)."""
    if spec.get("victim") is None:
        return None
    faults = Faults()
    when = faults.at(rank=int(spec["victim"]), steps=range(int(spec["start"]), 100_000))
    how = BitFlip(bit=int(spec["bit"]), index=int(spec["index"]))
    if spec.get("fault") == "grad":  # the step computes from a wrong gradient
        when.corrupt_grad(str(spec["param"]), how)
    elif spec.get("slot"):  # a stuck cell in the optimizer state, not the parameter
        when.corrupt_optimizer_state_after_step(str(spec["param"]), how, key=str(spec["slot"]))
    else:
        when.corrupt_param_after_step(str(spec["param"]), how)
    return faults.attach(model, opt)


def _reload_steps(spec: dict[str, Any]) -> tuple[int, int]:
    """``spec["reload"]``: save a checkpoint after step ``save``, load it back after step
    ``load`` (a rollback in the middle of the run, through the framework's own load with
    the gate off); ``(-1, -1)`` when the spec has none."""
    save, load = spec.get("reload", (-1, -1))
    return int(save), int(load)


def _dcp_reload(model: Any, opt: Any, path: str, *, save: bool) -> None:
    """A DCP checkpoint of the model's and the optimizer's state dicts, loaded back with
    torch's ``set_state_dict`` (which runs the optimizer's ``load_state_dict``, as
    TorchTitan's optimizer container does)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_sd, optim_sd = get_state_dict(model, opt)
    state = {"model": model_sd, "optim": optim_sd}
    if save:
        dcp.save(state, checkpoint_id=path)
        return
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])


def _result(session: Any, faults: Faults | None, trained: int) -> dict[str, Any]:
    gate = getattr(session, "checkpoints", None)
    pending = getattr(gate, "pending", None)
    replay = session.replay
    return {
        "rank": dist.get_rank(),
        "verdicts": [r.to_dict() for r in session.verdicts],
        "fired": faults.fired() if faults is not None else [],
        "trained": trained,
        "checked": replay.custody.checked if replay is not None else 0,
        "slices": replay.opt.slices() if replay is not None else 0,
        "buddy_agreed": sum(
            1
            for o in (replay.history if replay is not None else ())
            if "optimizer/buddy" in o.results
            and o.results["optimizer/buddy"].status.value == "agree"
        ),
        "total": replay.custody.total if replay is not None else 0,
        "pending": None if pending is None else str(getattr(pending, "reason", pending)),
    }


def torch_body(layout: str, spec: dict[str, Any]) -> dict[str, Any]:
    """DDP / FSDP2 / HSDP / DP x TP on TinyLM (the campaign's builder)."""
    from scout_core.campaign.torch_setups import build
    from scout_core.config import Config
    from scout_core.plugin.torch_plugin import enable_torch
    from scout_core.testing.models import train_step

    rank = dist.get_rank()
    wrapped, _ = build(layout)
    opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-2)
    data_rank = rank // 2 if layout == "dptp" else rank
    with enable_torch(wrapped, opt, Config(**_config(spec))) as session:
        faults = _arm(spec, wrapped, opt)
        save, load = _reload_steps(spec)
        trained = 0
        for step in range(int(spec["steps"])):
            train_step(wrapped, opt, step, data_rank)
            trained += 1
            if step in (save, load):
                _dcp_reload(wrapped, opt, str(spec["ckpt"]), save=step == save)
        out = _result(session, faults, trained)
    if faults is not None:
        faults.detach()
    return out


def deepspeed_body(stage: int, spec: dict[str, Any]) -> dict[str, Any]:
    """DeepSpeed ZeRO ``stage`` on TinyLM (the DeepSpeed campaign's engine): custody holds
    the inner optimizer's flat fp32 partition, which ``"#0.0"`` names."""
    import scout_deepspeed
    from scout_deepspeed.adapter import inner_optimizer
    from scout_deepspeed.campaign import MICRO, _engine, _lm_loss

    from scout_core.testing.models import batch

    engine, module, data = _engine({"zero_stage": stage}, _config(spec))
    session = scout_deepspeed.session_of(engine)
    assert session is not None
    faults = _arm(spec, module, inner_optimizer(engine))
    save, load = _reload_steps(spec)
    trained = 0
    for step in range(int(spec["steps"])):
        tokens = batch(step, data, size=MICRO)
        logits = engine(tokens[:, :-1])
        engine.backward(_lm_loss(logits, tokens[:, 1:]))
        engine.step()
        trained += 1
        if step == save:
            engine.save_checkpoint(str(spec["ckpt"]), tag="rollback")
        if step == load:
            engine.load_checkpoint(str(spec["ckpt"]), tag="rollback")
    out = _result(session, faults, trained)
    if faults is not None:
        faults.detach()
    session.close()
    return out
