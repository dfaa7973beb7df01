"""Rank bodies for the plugin-platform tests (``test_platform.py``): each returns JSON."""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

from scout_core.testing import TinyLM, signature_many, train_step


def _report() -> str:
    return os.path.join(os.environ["SCOUT_TEST_RANK_DIR"], "report")


def _two_optimizers(model: torch.nn.Module) -> list[torch.optim.Optimizer]:
    """Blocks on one AdamW, everything else on another (Megatron's chained optimizers)."""
    blocks = [p for n, p in model.named_parameters() if "layers." in n]
    rest = [p for n, p in model.named_parameters() if "layers." not in n]
    return [torch.optim.AdamW(blocks, lr=1e-2), torch.optim.AdamW(rest, lr=1e-2)]


class _Chained:
    """Steps every optimizer once per iteration, like Megatron's ChainedOptimizer."""

    def __init__(self, optimizers: list[torch.optim.Optimizer]) -> None:
        self.optimizers = optimizers

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        for o in self.optimizers:
            o.step()


def two_optimizers(steps: int, corrupt: bool) -> dict[str, Any]:
    """Plain PyTorch with two optimizers: one boundary per iteration, slices over both."""
    from torch.nn.parallel import DistributedDataParallel

    import scout_core as scout
    from scout_core.testing import BitFlip, Faults

    rank = dist.get_rank()
    torch.manual_seed(0)
    ddp = DistributedDataParallel(TinyLM())
    opts = _two_optimizers(ddp.module)
    if corrupt:  # a moment of the *second* optimizer (the embedding, outside the blocks)
        Faults().at(rank=1, step=3).corrupt_optimizer_state(
            "embed.weight", BitFlip(bit=3), key="exp_avg"
        ).attach(ddp, opts[1])
    cfg = scout.Config(
        report_dir=_report(),
        run_id="platform",
        recipes=["optimizer"],
        optimizer_interval=1,
        optimizer_slice=4096,
        observer=False,
    )
    session = scout.enable(ddp, opts, config=cfg)
    seen: list[list[Any]] = []
    session.on_boundary(
        lambda b: seen.append([b.step, [r.recipe.index for r in b.rounds], len(b.due)])
    )
    chained = _Chained(opts)
    for step in range(steps):
        train_step(ddp, chained, step, rank)  # type: ignore[arg-type]  # duck-typed optimizer
    assert session.replay is not None
    out = {
        "step": session.step,
        "boundaries": seen,
        "slices": session.replay.opt.slices(),
        "sizes": [sum(p.numel() for g in o.param_groups for p in g["params"]) for o in opts],
        "verdicts": [[v.step, v.surface, list(v.outliers)] for v in session.verdicts],
    }
    session.close()
    return out


def two_optimizers_on_off(steps: int) -> dict[str, str]:
    """The same two-optimizer job trained with SCOUT off, then on: parameter signatures."""
    from torch.nn.parallel import DistributedDataParallel

    import scout_core as scout

    rank = dist.get_rank()
    out: dict[str, str] = {}
    for label in ("off", "on"):
        torch.manual_seed(0)
        ddp = DistributedDataParallel(TinyLM())
        opts = _two_optimizers(ddp.module)
        session = None
        if label == "on":
            cfg = scout.Config(
                report_dir=_report(),
                run_id="bitwise",
                replay_interval=1,
                embedding_interval=1,
                lm_head_interval=1,
                optimizer_interval=1,
                observer=False,
            )
            session = scout.enable(ddp, opts, config=cfg)
        torch.manual_seed(1)
        for step in range(steps):
            train_step(ddp, _Chained(opts), step, rank)  # type: ignore[arg-type]  # duck-typed
        tensors = [p.detach() for p in ddp.parameters()]
        for o in opts:
            for st in o.state.values():
                tensors += [v for v in st.values() if isinstance(v, torch.Tensor)]
        out[label] = f"{signature_many(tensors):016x}"
        if session is not None:
            session.close()
    return out


def agreement_refuses_foreign_groups() -> dict[str, Any]:
    """The agreement helpers refuse WORLD and a group SCOUT did not create."""
    from scout_core.decision.agreement import all_ok, any_flag, min_max, same_value
    from scout_core.plugin_api import diagnostic_group

    rank = dist.get_rank()
    out: dict[str, Any] = {}
    training = dist.new_group(backend="gloo")
    for label, group in (("world", dist.group.WORLD), ("training", training)):
        try:
            any_flag(True, group)  # type: ignore[arg-type]  # WORLD is what is refused
            out[label] = "accepted"
        except ValueError as exc:
            out[label] = str(exc)
    mine = diagnostic_group()
    out["min_max"] = list(min_max(rank * 10, mine))
    out["all_ok"] = [all_ok(True, mine), all_ok(rank != 1, mine)]
    out["any_flag"] = [any_flag(False, mine), any_flag(rank == 1, mine)]
    out["same_value"] = [same_value(("t3", 3), mine), same_value(rank, mine)]
    return out


def reduce_max_gathers_small_and_all_reduces_large() -> dict[str, Any]:
    """reduce_max gives the same maxima by either collective, one collective per call."""
    from scout_core.decision import agreement
    from scout_core.plugin_api import diagnostic_group

    rank = dist.get_rank()
    mine = diagnostic_group()
    words = [rank, -rank, (-1) ** rank * (1 << 62), 7, -(1 << 63) + rank]
    calls: list[str] = []
    gather = "all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor"
    originals = {name: getattr(dist, name) for name in ("all_reduce", gather)}

    def counted(name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls.append("all_reduce" if name == "all_reduce" else "gather")
            return originals[name](*args, **kwargs)

        return call

    out: dict[str, Any] = {}
    try:
        for name in originals:
            setattr(dist, name, counted(name))
        out["small"] = agreement.reduce_max(words, mine)
        out["small_calls"] = list(calls)
        calls.clear()
        # Past GATHER_WORDS (ranks x words) the same call all-reduces.
        big = words * (agreement.GATHER_WORDS // (len(words) * dist.get_world_size()) + 1)
        out["large"] = agreement.reduce_max(big, mine)[: len(words)]
        out["large_calls"] = list(calls)
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)
    return out


@contextmanager
def _failing_writes(io: Any) -> Any:
    """Every rank's next DCP shard write raises (the store then commits nothing)."""
    store = io._store  # test-only: break the store this IO writes through

    def broken(*args: Any, **kwargs: Any) -> None:
        raise OSError("disk full (injected)")

    store._write_shard = broken
    try:
        yield
    finally:
        del store._write_shard


def dcp_io_conformance(directory: str) -> dict[str, Any]:
    """The shared CheckpointIO conformance body against the core's DCP store."""
    from torch.nn.parallel import DistributedDataParallel

    from scout_core.plugin_api import DcpCheckpointIO
    from scout_core.testing import check_checkpoint_io

    rank = dist.get_rank()
    torch.manual_seed(0)
    ddp = DistributedDataParallel(TinyLM())
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
    extra = {"step": torch.zeros(1)}
    io = DcpCheckpointIO(directory, ddp.module, opt, extra_state=lambda: extra)
    steps = [0]

    def advance() -> None:
        train_step(ddp, opt, steps[0], rank)
        steps[0] += 1
        extra["step"] += 1

    def state() -> list[torch.Tensor]:
        tensors = [p.detach() for p in ddp.parameters()] + [extra["step"]]
        for s in opt.state.values():
            tensors += [v for v in s.values() if isinstance(v, torch.Tensor)]
        return tensors

    advance()
    check_checkpoint_io(io, state=state, advance=advance, break_save=lambda: _failing_writes(io))
    return {"tags": list(io.list_tags()), "sig": f"{signature_many(state()):016x}"}


def framework_gate_on_dcp(directory: str) -> dict[str, Any]:
    """The core's FrameworkGate over its own DCP store: certify, refuse after SDC, restore."""
    from torch.nn.parallel import DistributedDataParallel

    import scout_core as scout
    from scout_core.plugin.torch_plugin import plugin
    from scout_core.plugin_api import DcpCheckpointIO, FrameworkGate
    from scout_core.session import compose
    from scout_core.testing import BitFlip, Faults

    rank = dist.get_rank()
    torch.manual_seed(0)
    ddp = DistributedDataParallel(TinyLM())
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
    Faults().at(rank=2, steps=range(8, 100)).corrupt_output("layers.1", BitFlip(bit=0)).attach(
        ddp, opt
    )
    cfg = scout.Config(
        report_dir=_report(), run_id="gate", recipes=("hidden",), replay_interval=1, observer=False
    )
    adapter = plugin.build_adapter(ddp, cfg, opt)
    session = compose(adapter, cfg, gates_checkpoints=True)
    gate = session.checkpoints
    assert isinstance(gate, FrameworkGate)
    io = DcpCheckpointIO(directory, ddp.module, opt)
    out: dict[str, Any] = {"saved": {}, "sigs": {}}

    def sig() -> str:
        return f"{signature_many([p.detach() for p in ddp.parameters()]):016x}"

    def train(upto: int) -> None:
        while session.step <= upto:
            train_step(ddp, opt, session.step, rank)

    for at in (3, 7, 9):
        train(at)
        out["saved"][at] = gate.save(io)
        out["sigs"][at] = sig()
    out["roles"] = {e.tag: e.role for e in gate.ledger.in_dir(directory)}
    out["verdicts"] = [[v.step, v.surface, list(v.outliers)] for v in session.verdicts]
    gate.load(io)  # no tag: the newest verified
    out["restored"] = sig() == out["sigs"][3]
    out["step_after_load"] = session.step
    gate.target(io)
    got = gate.recover("straggler")
    out["recover_straggler"] = list(got)
    session.close()
    return out
