"""Rank bodies for the observer under DP x TP 3x2: plain PyTorch, Megatron-style manual TP.

Six ranks, laid out ``tp-dp`` (tensor parallel fastest): TP groups (0, 1), (2, 3),
(4, 5); replica peer groups (0, 2, 4) and (1, 3, 5). Each block is a column-parallel
``fc1`` and a row-parallel ``fc2`` whose partial sums are all-reduced on the TP group
in forward (and the input gradient in backward); gradients are all-reduced on the
data-parallel group, flattened, after backward. Every collective goes through
``torch.distributed``, so SCOUT's patch sees each one and the observers compare
equivalent ranks by the *role* of the group (:mod:`scout_core.observer.roles`).

:func:`pp_body` is a pipeline job instead: 2 stages x 3 replicas, the stages talking
through ``dist.send`` / ``dist.recv``.

``scout.enable`` runs with ``recipes=()`` (no numerical replay: the TP blocks issue
training collectives, which replay must never reach) and the observer on.
"""

from __future__ import annotations

import functools
import json
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

HANG_S = 2.0
STALL_S = HANG_S + 4.0
TRAIN_TIMEOUT_S = 30.0
TP, DP = 2, 3
DIM = 8
FAULT_STEP = 3


class _State:
    tp: Any = None
    rank = -1
    step = -1
    fault = ""
    culprit = -1
    fired = False


def _mark(name: str, value: Any = None) -> None:
    path = Path(os.environ["SCOUT_TEST_RANK_DIR"]) / name
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value))
    tmp.rename(path)


def _fault_now(kind: str) -> bool:
    return _State.fault == kind and _State.step == FAULT_STEP


class _ToTP(torch.autograd.Function):
    """Identity forward; the input gradient is summed over the TP group."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.contiguous()
        dist.all_reduce(grad, group=_State.tp)
        return grad


class _FromTP(torch.autograd.Function):
    """The row-parallel partial sums, all-reduced on the TP group; identity backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        if _fault_now("wrong_collective") and _State.rank == _State.culprit and not _State.fired:
            _State.fired = True
            src = dist.get_global_rank(_State.tp, 0)
            dist.broadcast(x, src=src, group=_State.tp)  # its TP partner all-reduces
        else:
            dist.all_reduce(x, group=_State.tp)
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


class TPBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(DIM, 2 * DIM // TP)
        self.fc2 = nn.Linear(2 * DIM // TP, DIM, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.fc1(_ToTP.apply(x)))
        out: torch.Tensor = x + _FromTP.apply(self.fc2(h))
        return out


class TPNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(TPBlock() for _ in range(3))
        self.head = nn.Linear(DIM, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.layers:
            x = block(x)
        out: torch.Tensor = self.head(x)
        return out


def _stalling(orig: Any, ranks: tuple[int, ...]) -> Any:
    """``all_reduce`` that, on ``ranks``' TP group at the fault step, blocks inside the
    collective (after SCOUT published it) for ``STALL_S``: a stalled TP collective."""

    @functools.wraps(orig)
    def all_reduce(*args: Any, **kwargs: Any) -> Any:
        group = kwargs.get("group", args[2] if len(args) > 2 else None)
        stall = _fault_now("tp_stall") and _State.rank in ranks and group is _State.tp
        if stall and not _State.fired:  # the first TP all-reduce of the step, once
            _State.fired = True
            _mark(f"stalled-{_State.rank}", time.monotonic())
            time.sleep(STALL_S)
        return orig(*args, **kwargs)

    return all_reduce


def dptp_body(fault: str, report_dir: str, steps: int, culprit: int) -> dict[str, Any]:
    """One rank of the DP x TP job; ``fault`` is sigstop, wrong_collective, tp_stall or clean."""
    import scout_core as scout
    from scout_core.topology.mesh import MeshLayout

    rank = dist.get_rank()
    _State.rank, _State.fault, _State.culprit = rank, fault, culprit
    timeout = timedelta(seconds=TRAIN_TIMEOUT_S)
    tp_groups = [dist.new_group([2 * d, 2 * d + 1], timeout=timeout) for d in range(DP)]
    dp_groups = [dist.new_group([t, t + 2, t + 4], timeout=timeout) for t in range(TP)]
    _State.tp = tp_groups[rank // TP]
    dp = dp_groups[rank % TP]
    if fault == "tp_stall":  # before enable: SCOUT's patch wraps the stalling function
        stall = _stalling(dist.all_reduce, (culprit, culprit + 1))
        dist.all_reduce = stall
        dist.distributed_c10d.all_reduce = stall
    torch.manual_seed(rank % TP)  # TP partners hold different shards, replicas equal ones
    model = TPNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    seen: list[Any] = []
    cfg = scout.Config(
        report_dir=report_dir,
        run_id="dptp-observer",
        hang_timeout_s=HANG_S,
        observer_join_timeout_s=20.0,
        recipes=(),
    )
    layout = MeshLayout.from_order("tp-dp", tp=TP, dp=DP)
    session = scout.enable(model, opt, mesh=layout, config=cfg, callback=seen.append)
    _mark(f"observer-{rank}", session.observer.pid)
    out: dict[str, Any] = {"rank": rank, "peers": list(layout.peer_group(rank).ranks)}
    start = time.monotonic()
    try:
        for step in range(steps):
            _State.step = step
            if fault == "sigstop" and step == FAULT_STEP and rank == culprit:
                _mark("freeze-ready", time.monotonic())
                time.sleep(1.0)  # the test stops this process here, before forward
            gen = torch.Generator().manual_seed(1000 * step + rank // TP)
            x = torch.randn(4, DIM, generator=gen)  # the same batch on TP partners
            model(x).square().mean().backward()
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, group=dp)
            torch.nn.utils.vector_to_parameters(flat / DP, grads)
            opt.step()
            opt.zero_grad()
    except RuntimeError as exc:  # the mismatch ends in the training groups' timeout
        out["error"] = str(exc)[:200]
    deadline = time.monotonic() + 10
    while fault != "clean" and not seen and time.monotonic() < deadline:
        time.sleep(0.05)
    out["elapsed"] = time.monotonic() - start
    out["verdicts"] = [r.to_dict() for r in seen]
    out["stats"] = session.observer.stats().__dict__
    session.close()
    return out


# -- pipeline: 2 stages x 3 replicas ------------------------------------------------------

PP = 2


class _Stage(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(DIM, DIM) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


def pp_body(report_dir: str, steps: int, culprit: int) -> dict[str, Any]:
    """One rank of a PP 2 x DP 3 job (``pp-dp``: rank = stage + 2 x replica).

    Stage 0 sends its activations to its replica's stage 1 and receives the input
    gradient back (``dist.send`` / ``dist.recv``); each stage all-reduces its gradients
    over its data-parallel group. Before step ``FAULT_STEP`` the culprit writes
    ``freeze-ready`` and idles a moment, in which the test stops it with SIGSTOP.
    """
    import scout_core as scout
    from scout_core.topology.mesh import MeshLayout

    rank = dist.get_rank()
    stage, replica = rank % PP, rank // PP
    timeout = timedelta(seconds=TRAIN_TIMEOUT_S)
    dp_groups = [dist.new_group([s, s + 2, s + 4], timeout=timeout) for s in range(PP)]
    dp = dp_groups[stage]
    partner = rank + 1 if stage == 0 else rank - 1
    torch.manual_seed(stage)  # replicas of a stage hold equal weights
    model = _Stage()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    seen: list[Any] = []
    cfg = scout.Config(
        report_dir=report_dir,
        run_id="pp-observer",
        hang_timeout_s=HANG_S,
        observer_join_timeout_s=20.0,
        recipes=(),
    )
    layout = MeshLayout.from_order("pp-dp", pp=PP, dp=DP)
    session = scout.enable(model, opt, mesh=layout, config=cfg, callback=seen.append)
    out: dict[str, Any] = {"rank": rank, "peers": list(layout.peer_group(rank).ranks)}
    for step in range(steps):
        if step == FAULT_STEP and rank == culprit:
            _mark("freeze-ready", time.monotonic())
            time.sleep(1.0)  # the test stops this process here, before forward
        gen = torch.Generator().manual_seed(1000 * step + replica)
        if stage == 0:
            act = model(torch.randn(4, DIM, generator=gen))
            dist.send(act.detach().contiguous(), partner)
            grad = torch.empty_like(act)
            dist.recv(grad, partner)
            act.backward(grad)
        else:
            x = torch.empty(4, DIM)
            dist.recv(x, partner)
            x.requires_grad_(True)
            model(x).square().mean().backward()
            assert x.grad is not None
            dist.send(x.grad.contiguous(), partner)
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=dp)
        torch.nn.utils.vector_to_parameters(flat / DP, grads)
        opt.step()
        opt.zero_grad()
    deadline = time.monotonic() + 10
    while not seen and time.monotonic() < deadline:
        time.sleep(0.05)
    out["verdicts"] = [r.to_dict() for r in seen]
    session.close()
    return out
