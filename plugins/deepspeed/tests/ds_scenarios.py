"""Rank bodies for the DeepSpeed plugin tests: build a real engine, inject, train, report.

Each body runs on every rank (spawned by ``run_ranks``) and returns JSON. The model
is the core demo's ``TinyLM`` (embedding, four residual blocks with dropout, LM
head); DeepSpeed runs it on CPU with Gloo and ``torch_adam`` (no JIT kernels).
Faults come from ``scout_core.testing`` except the parameter corruption,
which must reach each ZeRO stage's real parameter storage (the module copy under
ZeRO 1/2, this rank's partition ``ds_tensor`` under ZeRO-3) and so lives here.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from scout_core.testing import BUSY_HOST, VOCAB, RoundLog, TinyLM, batch

MICRO = 4


def ds_config(stage: int, scout: dict[str, Any] | None, *, world: int) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "train_batch_size": MICRO * world,
        "train_micro_batch_size_per_gpu": MICRO,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}},
        "zero_optimization": {"stage": stage},
        "steps_per_print": 10_000,
    }
    if scout is not None:
        cfg["scout"] = scout
    return cfg


def scout_section(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "report_dir": os.path.join(os.environ["SCOUT_TEST_RANK_DIR"], "report"),
        "run_id": "ds-test",
        "replay_interval": 1,
        "embedding_interval": 4,
        "lm_head_interval": 4,
        "optimizer_interval": 4,
        "observer": True,  # the hang observer runs beside every DeepSpeed test (issue 10)
        **BUSY_HOST,
    }
    base.update(over)
    return base


def round_log(session: Any) -> RoundLog:
    """Every boundary of ``session`` from now on: its due recipes and round outcomes."""
    log = RoundLog()
    session.on_boundary(log)
    return log


def faults_from(specs: list[dict[str, Any]]) -> Any:
    from scout_core.testing import BitFlip, Faults

    faults = Faults()
    for f in specs:
        if f["kind"] == "param":
            continue
        when: dict[str, Any] = {"rank": f["rank"]}
        if f.get("persistent"):
            when["persistent"] = True
        elif "steps" in f:
            when["steps"] = range(*f["steps"])
        else:
            when["step"] = f["step"]
        t = faults.at(**when)
        if f["kind"] == "output":
            t.corrupt_output(f["target"], BitFlip(bit=f.get("bit", 0)))
        elif f["kind"] == "delay":
            t.delay_compute(f["target"], f["seconds"])
    return faults


class ParamCorruption:
    """Flip one low mantissa bit of a parameter's real storage on (rank, step), before forward.

    ZeRO 1/2: the module's copy of the parameter (a view into DeepSpeed's flat
    buffer), which forward, backward and replay read until the next parameter
    all-gather rewrites it. ZeRO-3: this rank's partition ``ds_tensor``, which every
    rank's forward gathers.
    """

    def __init__(self, module: nn.Module, spec: dict[str, Any] | None, rank: int) -> None:
        self.spec = spec
        self.module = module
        self.rank = rank
        self.forwards = 0
        self.fired: list[int] = []
        self.step = 0
        self._advance = False

    def pre_forward(self, module: nn.Module, args: Any) -> None:
        from scout_core.testing import flip_bit

        if self._advance:
            self.step += 1
            self._advance = False
        spec = self.spec
        if spec is None or spec["rank"] != self.rank or spec["step"] != self.step:
            return
        if self.fired and self.fired[-1] == self.step:
            return
        p = self.module.get_parameter(spec["target"])
        part = getattr(p, "ds_tensor", None)
        flip_bit(part if part is not None else p.data, index=spec.get("index", 0), bit=spec["bit"])
        self.fired.append(self.step)

    def post_step(self, opt: Any, args: Any, kwargs: Any) -> None:
        self._advance = True


def train_step(engine: Any, step: int, rank: int) -> float:
    tokens = batch(step, rank, size=MICRO)
    logits = engine(tokens[:, :-1])
    loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
    engine.backward(loss)
    engine.step()
    return float(loss.detach())


def _state(engine: Any) -> dict[str, str]:
    """Signatures of this rank's parameter storage, optimizer state and CPU RNG."""
    from scout_deepspeed.adapter import inner_optimizer

    from scout_core.testing import signature, signature_many

    params = [
        p.ds_tensor if getattr(p, "ds_tensor", None) is not None else p.detach()
        for p in engine.module.parameters()
    ]
    opt = inner_optimizer(engine)
    # ZeRO-3 empties the inner optimizer's param_groups between steps: read the
    # fp32 partitions from the wrapper and the slots from the state dict itself.
    wrapper = engine.optimizer
    masters = list(
        getattr(wrapper, "fp32_partitioned_groups_flat", None)
        or getattr(wrapper, "single_partition_of_fp32_groups", None)
        or [p for group in opt.param_groups for p in group["params"]]
    )
    slots = [
        v
        for state in opt.state.values()
        for _, v in sorted(state.items())
        if isinstance(v, torch.Tensor)
    ]
    assert masters and slots, "no optimizer state to compare"
    return {
        "params": f"{signature_many(params):016x}",
        "masters": f"{signature_many(m.detach() for m in masters):016x}",
        "optim": f"{signature_many(slots):016x}",
        "rng": f"{signature(torch.get_rng_state()):016x}",
    }


def zero_engine(stage: int, section: dict[str, Any]) -> tuple[Any, Any]:
    """(engine, SCOUT session) of a ZeRO-``stage`` TinyLM with the ``scout`` ``section``."""
    import scout_deepspeed

    torch.manual_seed(0)
    model = TinyLM()
    cfg = ds_config(stage, scout_section(**section), world=dist.get_world_size())
    engine, *_ = scout_deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=cfg
    )
    session = scout_deepspeed.session_of(engine)
    assert session is not None
    return engine, session


def scenario(
    stage: int, faults: list[dict[str, Any]], steps: int, section: dict[str, Any]
) -> dict[str, Any]:
    """Train ``steps`` iterations of a ZeRO-``stage`` engine with SCOUT and the faults."""
    from scout_deepspeed.adapter import inner_optimizer

    rank = dist.get_rank()
    engine, session = zero_engine(stage, section)
    assert session.adapter is not None
    rounds = round_log(session).rounds
    opt = inner_optimizer(engine)
    inj = faults_from(faults).attach(engine.module, opt)
    param_spec = next((f for f in faults if f["kind"] == "param"), None)
    pc = ParamCorruption(engine.module, param_spec, rank)
    engine.module.register_forward_pre_hook(pc.pre_forward)
    opt.register_step_post_hook(pc.post_step)
    for step in range(steps):
        train_step(engine, step, rank)
    out = {
        "verdicts": [r.to_dict() for r in session.verdicts],
        "rounds": len(rounds),
        "fired": inj.fired() + [["param", param_spec["target"], s] for s in pc.fired]
        if param_spec
        else inj.fired(),
        "rank": rank,
        "steps": session.step,
    }
    session.close()
    return out


class _Embed(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.embed(tokens)
        return out


class _Head(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.norm(x))
        return out


def _lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1))


def build_pipeline(section: dict[str, Any]) -> tuple[Any, Any]:
    """A 2-stage PipelineEngine (embed, 4 blocks, head), data parallel within each stage,
    with SCOUT on (``section`` over :func:`scout_section`); returns (engine, session)."""
    import deepspeed
    import scout_deepspeed
    from deepspeed.pipe import PipelineModule

    from scout_core.testing import Block

    deepspeed.init_distributed(dist_backend="gloo")  # PipelineModule needs deepspeed.comm
    world = dist.get_world_size()
    torch.manual_seed(0)
    dim = 16
    layers = [_Embed(dim), *(Block(dim) for _ in range(4)), _Head(dim)]
    module = PipelineModule(
        layers=layers, num_stages=2, loss_fn=_lm_loss, partition_method="uniform"
    )
    dp = world // 2
    cfg = ds_config(1, scout_section(**section), world=dp)
    cfg["gradient_accumulation_steps"] = 2
    cfg["train_batch_size"] = MICRO * 2 * dp
    engine, *_ = scout_deepspeed.initialize(
        model=module, model_parameters=module.parameters(), config=cfg
    )
    session = scout_deepspeed.session_of(engine)
    assert session is not None and session.adapter is not None
    return engine, session


def pipeline_batches(engine: Any, step: int) -> Any:
    """The two micro-batches of ``step`` for this rank's data replica."""
    data_rank = engine.grid.get_data_parallel_id()
    for micro in range(2):
        tokens = batch(2 * step + micro, data_rank, size=MICRO)
        yield tokens[:, :-1], tokens[:, 1:]


def pipeline_scenario(faults: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    """Train the 2-stage pipeline ``steps`` iterations with the faults; report."""
    from scout_deepspeed.adapter import inner_optimizer

    rank = dist.get_rank()
    engine, session = build_pipeline({"recipes": ["hidden"]})
    adapter = session.adapter
    rounds = round_log(session).rounds
    opt = inner_optimizer(engine)
    inj = faults_from(faults).attach(engine.module, opt)
    for step in range(steps):
        engine.train_batch(data_iter=pipeline_batches(engine, step))
    out = {
        "verdicts": [r.to_dict() for r in session.verdicts],
        "rounds": len(rounds),
        "fired": inj.fired(),
        "rank": rank,
        "stage": engine.grid.get_stage_id(),
        "layers": [ref.path for ref in adapter.repeated_layers()],
        "peers": list(adapter.layout().replica_group(rank)),
        "address": list(adapter.address().as_tuple()),
    }
    session.close()
    return out


def clean_and_bitwise(stage: int, steps: int) -> dict[str, Any]:
    """Train twice from the same seed, the "scout" section absent then present."""
    import scout_deepspeed

    rank = dist.get_rank()
    out: dict[str, Any] = {"rank": rank}
    for label in ("off", "on"):
        torch.manual_seed(0)
        model = TinyLM()
        section = scout_section() if label == "on" else None
        cfg = ds_config(stage, section, world=dist.get_world_size())
        engine, *_ = scout_deepspeed.initialize(
            model=model, model_parameters=model.parameters(), config=cfg
        )
        session = scout_deepspeed.session_of(engine)
        assert session is not None
        out[f"{label}_attached"] = session.adapter is not None
        log = round_log(session)
        torch.manual_seed(1)
        losses = [train_step(engine, step, rank) for step in range(steps)]
        out[label] = _state(engine)
        out[f"{label}_losses"] = [float(x).hex() for x in losses]
        if label == "on":
            out.update(log.summary())
            out["surfaces"] = sorted({o.recipe.name for o in log.rounds})
            out["verdicts"] = [r.to_dict() for r in session.verdicts]
        session.close()
    return out


def _fresh() -> TinyLM:
    torch.manual_seed(0)
    return TinyLM()


def _bad_sections(stage: int, json_path: str) -> dict[str, Any]:
    """Bad "scout" sections (dict and JSON file): the ConfigError messages."""
    import json

    import scout_deepspeed

    from scout_core import ConfigError

    world = dist.get_world_size()
    out: dict[str, Any] = {}
    # A bad section fails before the engine is built, naming the key.
    for name, section in {
        "unknown": {"replay_intervall": 5},
        "negative": {"replay_interval": -3},
    }.items():
        m = _fresh()
        try:
            scout_deepspeed.initialize(
                model=m,
                model_parameters=m.parameters(),
                config=ds_config(stage, section, world=world),
            )
            out[name] = "no error"
        except ConfigError as exc:
            out[name] = str(exc)
    # The same check for a JSON file given by path.
    if dist.get_rank() == 0:
        with open(json_path, "w", encoding="utf-8") as fh:
            json.dump(ds_config(stage, {"kappa": 0}, world=world), fh)
    dist.barrier()
    m = _fresh()
    try:
        scout_deepspeed.initialize(model=m, model_parameters=m.parameters(), config=json_path)
        out["file"] = "no error"
    except ConfigError as exc:
        out["file"] = str(exc)

    return out


def _not_attached(stage: int) -> dict[str, Any]:
    """No section, and "enabled": false: a disabled session and no hooks."""
    import scout_deepspeed
    from scout_deepspeed.adapter import inner_optimizer

    world = dist.get_world_size()
    out: dict[str, Any] = {}
    # No section, and "enabled": false: nothing attached.
    for name, section in {"absent": None, "disabled": {"enabled": False}}.items():
        m = _fresh()
        engine, *_ = scout_deepspeed.initialize(
            model=m, model_parameters=m.parameters(), config=ds_config(stage, section, world=world)
        )
        session = scout_deepspeed.session_of(engine)
        opt = inner_optimizer(engine)
        out[name] = {
            "session": session is not None,
            "adapter": session is not None and session.adapter is not None,
            "hooks": len(opt._optimizer_step_post_hooks) + len(opt._optimizer_step_pre_hooks),
            "forward_hooks": sum(len(mod._forward_pre_hooks) for mod in engine.module.modules()),
        }
        if name == "absent":
            out["absent"]["forward_hooks_baseline"] = out[name]["forward_hooks"]

    return out


def activation(stage: int, json_path: str) -> dict[str, Any]:
    """The switch: bad sections, no section, enabled false, scout.enable twice, conformance."""
    import deepspeed
    import scout_deepspeed
    from scout_deepspeed.adapter import inner_optimizer

    import scout_core as scout
    from scout_core.testing import check_adapter, check_plugin

    world = dist.get_world_size()
    out: dict[str, Any] = {}

    out.update(_bad_sections(stage, json_path))
    out.update(_not_attached(stage))

    # The entry point: plain deepspeed.initialize, then scout.enable(engine), twice.
    m = _fresh()
    engine, *_ = deepspeed.initialize(
        model=m,
        model_parameters=m.parameters(),
        config=ds_config(stage, scout_section(), world=world),
    )
    session = scout.enable(engine)
    opt = inner_optimizer(engine)
    out["hooks_after_once"] = len(opt._optimizer_step_post_hooks)
    again = scout.enable(engine)
    out["enabled_forward_hooks"] = sum(
        len(mod._forward_pre_hooks) for mod in engine.module.modules()
    )
    out["same_session"] = session is again
    out["hooks_after_twice"] = len(opt._optimizer_step_post_hooks)
    check_plugin(scout_deepspeed.plugin, engine)
    check_adapter(session.adapter)
    adapter = session.adapter
    out["layout"] = str(adapter.layout())
    out["ownership"] = adapter.optimizer_ownership().value
    out["layers"] = [r.path for r in adapter.repeated_layers()]
    out["special"] = sorted(adapter.special_modules())
    out["groups"] = sorted(adapter.training_groups())
    with adapter.materialize(adapter.repeated_layers()[1]) as full:
        out["materialized"] = {k: list(v.shape) for k, v in sorted(full.items())}
        from scout_core.testing import signature_many

        out["materialized_sig"] = f"{signature_many(full[k] for k in sorted(full)):016x}"
    # Reference: DeepSpeed's own gather (test only; it talks on the training group).
    layer = adapter.repeated_layers()[1].module
    with deepspeed.zero.GatheredParameters(list(layer.parameters()), enabled=stage == 3):
        ref = dict(layer.named_parameters())
        out["reference_sig"] = f"{signature_many(ref[k].detach() for k in sorted(ref)):016x}"
    session.close()
    out["hooks_after_close"] = len(opt._optimizer_step_post_hooks)
    return out
