"""Rank bodies of the referee-replay tests (imported by the spawned ranks).

The core's own layouts with two copies (``ddp`` x 2, ``hsdp`` 2 x 2, ``dptp`` 2 x 2, built
as the campaign builds them), a hidden-layer round every step. On the victim, from step
``start`` on, one bit of a block's output flips in every call, training and replay
alike (:meth:`~scout_core.testing.Trigger.corrupt_output`, a forward hook). Each rank
counts the point-to-point calls SCOUT issues at each boundary (the referee's traffic)
and returns the verdicts it saw, the rounds it ran and what fired.

``spec["referee"]`` may ask a rank, the first time it acts as a referee, to misbehave:
``"stall"`` sleeps ``spec["stall_s"]`` seconds (past the referee timeout) before its
part (a referee that does not answer in time), ``"die"`` ends its process there (a
killed referee; it leaves a ``died-<rank>`` file, and each pair member writes the
verdict it reached to ``survivor-<rank>.json``, through the session callback, and
stops, since training needs the dead rank). Each rank also returns, for every refereed
record it emitted, the seconds from the start of that step to the record (the time
the pair spent waiting on its referee, plus the step's own work).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from scout_core.testing import BUSY_HOST
from scout_core.testing.injectors import BitFlip, Faults

_P2P = ("isend", "irecv")


def _config(spec: dict[str, Any]) -> dict[str, Any]:
    report = os.path.join(os.environ["SCOUT_TEST_RANK_DIR"], f"report-{dist.get_rank()}")
    cfg: dict[str, Any] = {
        "report_dir": report,
        "run_id": "referee",
        "observer": False,
        "gate": bool(spec.get("gate", False)),
        "recipes": ["hidden"],
        "replay_interval": 1,
        "referee_timeout_s": float(spec.get("timeout_s", 20.0)),
        **BUSY_HOST,
    }
    cfg.update(spec.get("scout", {}))
    return cfg


def _count_p2p(inside: list[bool], calls: list[list[Any]]) -> None:
    for name in _P2P:
        fn = getattr(dist, name)

        def counted(*args: Any, _fn: Any = fn, _name: str = name, **kwargs: Any) -> Any:
            if inside[0] and calls:
                t = args[0] if args else kwargs["tensor"]
                calls[-1].append([_name, t.numel() * t.element_size()])
            return _fn(*args, **kwargs)

        setattr(dist, name, counted)


def _misbehave(how: str, rank: int, stall_s: float, acted: list[float]) -> None:
    """Make this rank, as a referee, stall or die in its first referee exchange
    (``acted`` gets the time it did)."""
    from scout_core.replay import taps

    def delay(kind: str) -> float:
        if kind != "referee" or acted:
            return 0.0
        acted.append(time.monotonic())
        if how == "die":
            Path(os.environ["SCOUT_TEST_RANK_DIR"], f"died-{rank}").write_text("referee")
            os._exit(17)
        return stall_s

    taps.add_comm_delay(delay)


def torch_body(layout: str, spec: dict[str, Any]) -> dict[str, Any]:
    """DDP / HSDP / DP x TP on TinyLM (the campaign's builder), a compute fault."""
    from scout_core.campaign.torch_setups import build
    from scout_core.config import Config
    from scout_core.plugin.torch_plugin import enable_torch
    from scout_core.testing.models import train_step

    rank = dist.get_rank()
    inside = [False]
    calls: list[list[Any]] = []
    _count_p2p(inside, calls)
    wrapped, _ = build(layout)
    opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-2)
    opt.register_step_post_hook(lambda *_: inside.__setitem__(0, True))
    data_rank = rank // 2 if layout == "dptp" else rank
    faults: Faults | None = None
    started = [time.monotonic()]

    refereed_s: list[list[Any]] = []
    acted: list[float] = []

    def survivor(record: Any) -> None:
        if "referee" not in record.detail:
            return
        step_s = time.monotonic() - started[0]
        refereed_s.append([record.step, record.surface, step_s])
        if spec.get("referee") != "die":
            return
        # A killed referee: report the pair's verdict the moment it exists, then stop
        # (the boundary's job-wide vote would wait for the dead rank).
        out = {"rank": rank, "verdict": record.to_dict(), "step_s": step_s}
        Path(os.environ["SCOUT_TEST_RANK_DIR"], f"survivor-{rank}.json").write_text(json.dumps(out))
        os._exit(0)

    with enable_torch(wrapped, opt, Config(**_config(spec)), callback=survivor) as session:
        opt.register_step_post_hook(lambda *_: inside.__setitem__(0, False))
        assert session.replay is not None
        if spec.get("victim") is not None:
            faults = Faults()
            faults.at(
                rank=int(spec["victim"]), steps=range(int(spec["start"]), 100_000)
            ).corrupt_output(str(spec["layer"]), BitFlip(bit=int(spec["bit"])))
            faults.attach(wrapped, opt)
        if spec.get("referee"):  # on every rank: whichever referees first misbehaves
            _misbehave(str(spec["referee"]), rank, float(spec.get("stall_s", 8.0)), acted)
        trained = 0
        for step in range(int(spec["steps"])):
            calls.append([])
            started[0] = time.monotonic()
            train_step(wrapped, opt, step, data_rank)
            trained += 1
        rounds = [[o.step, o.recipe.path] for o in session.replay.history]
        gate = getattr(session, "checkpoints", None)
        pending = getattr(gate, "pending", None)
        actions = [[r.decision.step, r.decision.action.value] for r in getattr(gate, "history", ())]
        out = {
            "rank": rank,
            "verdicts": [r.to_dict() for r in session.verdicts],
            "fired": faults.fired() if faults is not None else [],
            "rounds": rounds,
            "p2p": calls,
            "trained": trained,
            "refereed_s": refereed_s,
            "misbehaved": len(acted),
            "pending": None if pending is None else str(getattr(pending, "reason", pending)),
            "gate": actions,
        }
    if faults is not None:
        faults.detach()
    return out
