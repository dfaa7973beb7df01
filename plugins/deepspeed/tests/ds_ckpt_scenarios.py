"""Rank body for the DeepSpeed checkpoint-gate test: save, certify, refuse, restore.

ZeRO-2, 4 ranks, ``TinyLM`` with replay of one hidden layer per step (``recipes:
["hidden"]``, so the gate's catalog is the 4 hidden layers: ``K = 4``, a cycle closes
at steps 3, 7, 11, ...). The timeline:

* step 3: a cycle closes clean; tag ``t3`` is saved right there → ``candidate``;
* step 7: the next cycle closes clean → ``t3`` ``verified``; ``t7`` saved → ``candidate``;
  ``recover(engine, "straggler")`` → ``latest`` = ``t7`` (state unchanged);
* from step 8 rank 2's ``layers.1`` flips the lowest mantissa bit of its output on every
  call; step 8 replays ``layers.0`` (clean) and ``t8`` is saved → ``latest``;
* step 9 replays ``layers.1`` → SDC naming rank 2; ``t9`` is refused (nothing written);
* ``load_checkpoint(dir)`` (no tag; DeepSpeed's ``latest`` file says ``t8``) restores
  ``t3``; an explicit ``tag="t7"`` is honoured; ``recover(engine, "sdc")`` restores
  ``t3`` again. Every restore is compared with the signatures taken at that save.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch
import torch.distributed as dist
from ds_scenarios import ds_config, scout_section, train_step


def signatures(engine: Any) -> dict[str, str]:
    """Signature of every module parameter, fp32 master partition and optimizer slot."""
    from scout_deepspeed.adapter import inner_optimizer

    from scout_core.testing import signature

    out = {
        f"param/{n}": f"{signature(p.detach()):016x}" for n, p in engine.module.named_parameters()
    }
    masters = getattr(engine.optimizer, "single_partition_of_fp32_groups", [])
    for i, m in enumerate(masters):
        out[f"master/{i}"] = f"{signature(m.detach()):016x}"
    opt = inner_optimizer(engine)
    for i, state in enumerate(opt.state.values()):
        for k, v in sorted(state.items()):
            if isinstance(v, torch.Tensor):
                out[f"optim/{i}/{k}"] = f"{signature(v):016x}"
    return out


class _Run:
    """One rank's engine, session and results, with the steps the timeline uses."""

    def __init__(self, engine: Any, session: Any, ckpt_dir: str) -> None:
        self.engine = engine
        self.session = session
        self.dir = ckpt_dir
        self.out: dict[str, Any] = {"rank": dist.get_rank(), "saved": {}, "refs": {}}

    def train(self, upto: int) -> None:
        while self.session.step <= upto:
            train_step(self.engine, self.session.step, dist.get_rank())

    def save(self, tag: str) -> None:
        self.out["saved"][tag] = self.engine.save_checkpoint(self.dir, tag=tag)
        self.out["refs"][tag] = signatures(self.engine)

    def roles(self) -> dict[str, str]:
        dist.barrier()  # the sidecar is written by rank 0
        with open(os.path.join(self.dir, "scout-certification.json"), encoding="utf-8") as fh:
            return {t["tag"]: t["role"] for t in json.load(fh)["tags"]}

    def equal(self, tag: str) -> bool:
        return bool(signatures(self.engine) == self.out["refs"][tag])


def _certify_and_refuse(run: _Run) -> None:
    import scout_deepspeed

    out = run.out
    run.train(3)
    run.save("t3")
    out["roles_at_3"] = run.roles()
    run.train(7)
    run.save("t7")
    out["roles_at_7"] = run.roles()
    out["straggler"] = list(scout_deepspeed.recover(run.engine, "straggler"))
    out["after_straggler_equal_t7"] = run.equal("t7")
    run.train(8)
    run.save("t8")
    run.train(9)
    out["verdicts"] = [
        [v.step, v.surface, v.failure.value if v.failure else None, list(v.outliers)]
        for v in run.session.verdicts
    ]
    run.save("t9")
    out["t9_exists"] = os.path.exists(os.path.join(run.dir, "t9"))
    out["roles_at_9"] = run.roles()
    with open(os.path.join(run.dir, "latest"), encoding="utf-8") as fh:
        out["deepspeed_latest"] = fh.read().strip()


def _restore(run: _Run) -> None:
    import scout_deepspeed

    out = run.out
    out["before_load_equal_t3"] = run.equal("t3")
    path, _ = run.engine.load_checkpoint(run.dir)
    out["load_default"] = os.path.basename(os.path.dirname(str(path)))
    out["load_default_equal_t3"] = run.equal("t3")
    out["step_after_load"] = run.session.step
    path, _ = run.engine.load_checkpoint(run.dir, tag="t7")
    out["load_explicit"] = os.path.basename(os.path.dirname(str(path)))
    out["load_explicit_equal_t7"] = run.equal("t7")
    out["recover_sdc"] = list(scout_deepspeed.recover(run.engine, "sdc"))
    out["recover_equal_t3"] = run.equal("t3")
    now = signatures(run.engine)
    out["mismatched"] = sorted(k for k, v in now.items() if out["refs"]["t3"].get(k) != v)


def gated_checkpoints(ckpt_dir: str) -> dict[str, Any]:
    import scout_deepspeed
    from scout_deepspeed.adapter import inner_optimizer

    from scout_core.testing import BitFlip, Faults, TinyLM

    torch.manual_seed(0)
    model = TinyLM()
    cfg = ds_config(2, scout_section(recipes=["hidden"]), world=dist.get_world_size())
    engine, *_ = scout_deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=cfg
    )
    session = scout_deepspeed.session_of(engine)
    assert session is not None and session.adapter is not None
    faults = Faults()
    faults.at(rank=2, steps=range(8, 1000)).corrupt_output("layers.1", BitFlip(bit=0))
    inj = faults.attach(engine.module, inner_optimizer(engine))
    run = _Run(engine, session, ckpt_dir)
    _certify_and_refuse(run)
    _restore(run)
    out = run.out
    out["fired"] = len(inj.fired())
    out["report"] = str(session.config.report_dir)
    out["patched"] = "save_checkpoint" in engine.__dict__
    session.close()
    out["patched_after_close"] = "save_checkpoint" in engine.__dict__
    return out


def io_conformance(ckpt_dir: str) -> dict[str, Any]:
    """The core's shared CheckpointIO conformance body against DeepSpeedCheckpointIO (ZeRO-2)."""
    from contextlib import contextmanager

    import scout_deepspeed
    from scout_deepspeed import DeepSpeedCheckpointIO

    from scout_core.testing import TinyLM, check_checkpoint_io

    torch.manual_seed(0)
    model = TinyLM()
    cfg = ds_config(2, None, world=dist.get_world_size())  # SCOUT off: the IO alone
    engine, *_ = scout_deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=cfg
    )
    io = DeepSpeedCheckpointIO(engine, ckpt_dir)
    steps = [0]

    def advance() -> None:
        train_step(engine, steps[0], dist.get_rank())
        steps[0] += 1

    @contextmanager
    def failing_saves() -> Any:
        """Every rank's checkpoint writes raise (a full disk): DeepSpeed writes nothing."""
        writer = engine.checkpoint_engine

        def broken(*args: Any, **kwargs: Any) -> None:
            raise OSError("disk full (injected)")

        writer.save = broken
        try:
            yield
        finally:
            del writer.save

    def state() -> list[torch.Tensor]:
        masters = list(getattr(engine.optimizer, "single_partition_of_fp32_groups", []))
        return [p.detach() for p in engine.module.parameters()] + masters

    advance()
    check_checkpoint_io(io, state=state, advance=advance, break_save=failing_saves)
    return {"tags": list(io.list_tags()), "writes": io.writes_metadata()}
