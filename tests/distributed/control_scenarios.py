"""Rank bodies for replay under unusual control flow: instance ``forward`` overrides,
asymmetric optimizer steps and micro-batches, and collective counting.

Each body runs on every rank (spawned by ``run_ranks``) and returns JSON: the
verdicts this rank saw, what SCOUT logged at ``enable``, and counts.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from scout_core.testing import BUSY_HOST, RoundLog
from scout_core.testing.models import VOCAB, batch, train_step

_COLLECTIVES = (
    "all_gather_single",
    "all_gather_into_tensor",
    "all_gather",
    "all_reduce",
    "broadcast",
    "reduce_scatter_tensor",
    "all_to_all_single",
    "isend",
    "irecv",
    "barrier",
)


class _Logs(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _config(**over: Any) -> Any:
    from scout_core.config import Config

    base: dict[str, Any] = {
        "report_dir": os.path.join(os.environ["SCOUT_TEST_RANK_DIR"], "report"),
        "run_id": "test",
        "observer": False,
        **BUSY_HOST,
    }
    base.update(over)
    return Config(**base)


def _wrap(block: nn.Module, kind: str) -> None:
    """Replace ``block.forward`` on the instance, the way accelerate-style hooks do."""
    inner = block.forward
    if kind == "slow":

        def forward(*args: Any, **kwargs: Any) -> Any:
            time.sleep(0.15)  # x3 in a replayed round: past BUSY_HOST's 0.3 s
            return inner(*args, **kwargs)

    else:

        def forward(*args: Any, **kwargs: Any) -> Any:
            return inner(*args, **kwargs) + 1e-3

    block.forward = forward  # type: ignore[method-assign]


def override(
    setup: str, rank_with: int, kind: str, before_enable: bool, steps: int, *, cfg: dict[str, Any]
) -> dict[str, Any]:
    """Wrap every block's ``forward`` on ``rank_with`` (before or after ``enable``), train."""
    from replay_scenarios import build, data_rank

    from scout_core.plugin.torch_plugin import enable_torch

    rank = dist.get_rank()
    handler = _Logs()
    logging.getLogger("scout_core").addHandler(handler)
    wrapped, model, mesh = build(setup)
    opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-2)
    if before_enable and rank == rank_with:
        for block in model.layers:
            _wrap(block, kind)
    with enable_torch(wrapped, opt, _config(**cfg), mesh=mesh) as session:
        if not before_enable and rank == rank_with:
            for block in model.layers:
                _wrap(block, kind)
        log = RoundLog()
        session.on_boundary(log)
        for step in range(steps):
            train_step(wrapped, opt, step, data_rank(setup, rank))
        verdicts = [r.to_dict() for r in session.verdicts]
        overrides = dict(session.replay.runner.overrides) if session.replay else {}
    logging.getLogger("scout_core").removeHandler(handler)
    return {
        "verdicts": verdicts,
        **log.summary(),
        "logs": handler.lines,
        "overrides": overrides,
        "rank": rank,
    }


def asymmetric(kind: str, odd_rank: int, at_step: int, steps: int, cfg: dict[str, Any]) -> Any:
    """DDP; ``odd_rank`` takes one extra ``optimizer.step()`` (``kind="step"``) or runs one
    micro-batch fewer (``kind="micro"``, of 2) at ``at_step``."""
    from torch.nn.parallel import DistributedDataParallel

    from scout_core.plugin.torch_plugin import enable_torch
    from scout_core.testing.models import TinyLM

    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(TinyLM())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    t0 = time.monotonic()
    with enable_torch(model, opt, _config(**cfg)) as session:
        log: list[Any] = []
        session.on_boundary(lambda boundary: log.extend(boundary.rounds))
        for step in range(steps):
            odd = rank == odd_rank and step == at_step
            micro = 1 if (odd and kind == "micro") else 2
            opt.zero_grad(set_to_none=True)
            for m in range(micro):
                # DDP decides in the forward whether the backward all-reduces: every
                # micro-batch but the last runs entirely under no_sync.
                with model.no_sync() if m < micro - 1 else contextlib.nullcontext():
                    tokens = batch(step * 2 + m, rank)
                    logits = model(tokens[:, :-1])
                    loss = nn.functional.cross_entropy(
                        logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1)
                    )
                    loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
            if odd and kind == "step":
                opt.step()  # the extra step
        verdicts = [r.to_dict() for r in session.verdicts]
        clock = session.step
    return {
        "verdicts": verdicts,
        "rounds": len(log),
        "clock": clock,
        "elapsed_s": time.monotonic() - t0,
        "rank": rank,
    }


class _SkewedAdamW(torch.optim.AdamW):
    """AdamW that, while ``skewed`` is set, adds 1e-3 to every parameter it updates: a
    rank whose optimizer computes the update wrongly. Replay's shadow optimizer is the
    same class, so the replayed update is wrong on that rank too."""

    skewed = False
    """Set by the scenario, on the class: the shadow instances see it too."""

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = super().step(closure)
        if _SkewedAdamW.skewed:
            for group in self.param_groups:
                for p in group["params"]:
                    p.add_(1e-3)
        return loss


def count_collectives(
    steps: int, cfg: dict[str, Any], skew: tuple[int, int] | None = None, layout: str = "ddp"
) -> dict[str, Any]:
    """DDP (or ``layout``, one of the campaign's torch layouts) with SCOUT at ``cfg``'s
    cadence; per step, the collectives SCOUT issued at the boundary (between two
    optimizer post hooks around SCOUT's) and the recipes due. ``skew=(rank, step)``:
    that rank's optimizer miscomputes from that step on (:class:`_SkewedAdamW`)."""
    from torch.nn.parallel import DistributedDataParallel

    from scout_core.campaign.torch_setups import build
    from scout_core.plugin.torch_plugin import enable_torch
    from scout_core.testing.models import TinyLM

    rank = dist.get_rank()
    inside = [False]
    calls: list[list[str]] = []
    for name in _COLLECTIVES:
        fn = getattr(dist, name, None)
        if fn is None:
            continue

        def counted(*args: Any, _fn: Any = fn, _name: str = name, **kwargs: Any) -> Any:
            if inside[0]:
                calls[-1].append(_name)
            return _fn(*args, **kwargs)

        setattr(dist, name, counted)
    torch.manual_seed(0)
    model = DistributedDataParallel(TinyLM()) if layout == "ddp" else build(layout)[0]
    batch = rank // 2 if layout == "dptp" else rank  # TP partners share a batch
    opt = _SkewedAdamW(model.parameters(), lr=1e-2)
    opt.register_step_post_hook(lambda *_: inside.__setitem__(0, True))
    due: list[list[str]] = []
    hooked: list[list[str]] = []
    with enable_torch(model, opt, _config(**cfg)) as session:
        opt.register_step_post_hook(lambda *_: inside.__setitem__(0, False))
        session.on_boundary(lambda b: due.append([r.kind for r in b.due]))
        assert session.replay is not None
        capturer = session.replay.capturer
        for step in range(steps):
            calls.append([])
            _SkewedAdamW.skewed = skew is not None and rank == skew[0] and step >= skew[1]
            train_step(model, opt, step, batch)
            hooked.append(list(capturer.hooked))
        verdicts = [r.to_dict() for r in session.verdicts]
    return {"calls": calls, "due": due, "hooked": hooked, "verdicts": verdicts}
