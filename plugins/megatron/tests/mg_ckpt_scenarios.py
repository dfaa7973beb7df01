"""Rank bodies for the checkpoint test: save in one job, load in a fresh one."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

SPEC_STEPS = (3, 2)


def children() -> list[str]:
    """Command lines of this process's live child processes (Linux ``/proc``), but the
    test harness's own helper forker (scout_core/testing/_helpers.py)."""
    found: list[str] = []
    harness = os.environ.get("SCOUT_TEST_HELPER_FORKER")
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        for pid in (task / "children").read_text().split():
            if pid == harness:
                continue
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue  # it exited while we looked
            found.append(cmd.decode(errors="replace").strip())
    return found


def _job(seed: int) -> tuple[Any, Any, Any, Any]:
    from scout_megatron import testing as mgt

    mgt.install_cpu_shims(seed)
    spec = mgt.TinyGPT()
    model = mgt.build_model(spec)
    return spec, model, mgt.wrap_ddp(model), mgt.build_optimizer([model])


def save_run(directory: str) -> dict[str, Any]:
    """Train 3 steps, save; train 2 more, save; digests after each save."""
    from scout_megatron import testing as mgt
    from scout_megatron.checkpoint import MegatronCheckpointIO

    mgt.initialize(tensor_model_parallel_size=2)
    spec, model, ddp, opt = _job(1234)
    io = MegatronCheckpointIO(directory, [ddp], opt)
    out: dict[str, Any] = {"tags": {}, "saved": [], "children": []}
    step = 0
    for count in SPEC_STEPS:
        for _ in range(count):
            mgt.train_step(ddp, opt, mgt.get_batch(spec, step))
            step += 1
        tag = io.tag_for(step - 1)
        with mgt.cpu_dist_checkpointing():
            out["saved"].append(io.save(tag))
        out["children"].append(children())
        out["tags"][tag] = mgt.digest(model, opt)
    out["list"] = io.list_tags()
    out["writes_metadata"] = io.writes_metadata()
    mgt.teardown()
    return out


def load_run(directory: str) -> dict[str, Any]:
    """Fresh processes: load each tag into a differently initialised job and compare."""
    from scout_megatron import testing as mgt
    from scout_megatron.checkpoint import MegatronCheckpointIO

    from scout_core import CheckpointError

    mgt.initialize(tensor_model_parallel_size=2)
    out: dict[str, Any] = {}
    spec, model, ddp, opt = _job(99)  # other weights: a load has something to change
    io = MegatronCheckpointIO(directory, [ddp], opt)
    out["fresh"] = mgt.digest(model, opt)
    out["list"] = io.list_tags()
    out["latest"] = io.latest()
    out["iter_3"] = io.load("iter_0000003")
    out["after_load_3"] = mgt.digest(model, opt)
    for step in (3, 4):  # continue from iteration 3: must reach iteration 5's state
        mgt.train_step(ddp, opt, mgt.get_batch(spec, step))
    out["trained_to_5"] = mgt.digest(model, opt)

    spec, model, ddp, opt = _job(7)
    io = MegatronCheckpointIO(directory, [ddp], opt)
    out["iter_latest"] = io.load(None)
    out["after_load_latest"] = mgt.digest(model, opt)
    try:
        io.load("iter_0000004")
    except CheckpointError as exc:
        out["missing"] = str(exc)

    spec, model, ddp, opt = _job(1234)  # from scratch in another process: same bits
    for step in range(5):
        mgt.train_step(ddp, opt, mgt.get_batch(spec, step))
    out["scratch_5"] = mgt.digest(model, opt)
    mgt.teardown()
    return out
