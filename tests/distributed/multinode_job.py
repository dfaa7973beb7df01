"""The trainer ``tests/distributed/test_multinode_torchrun.py`` launches under torchrun.

Two torchrun agents on loopback (two "nodes", 3 ranks each) run this script. It trains
TinyLM under DDP with SCOUT on: replay of every recipe every step (so the gate's
catalog of K = 7 closes a cycle at steps 3, 7, 11, ...), the checkpoint gate with a
durable ``checkpoint_dir``, and the hang observer with ``on_hang = "terminate"``.

At start every attempt calls ``session.resume()``, the recovery hand-off: the first
start finds nothing and begins at step 0; a restart restores the gate's verified
generation from ``checkpoint_dir`` and continues after it. On a first start (no
resume, ``TORCHELASTIC_RESTART_COUNT == 0``) rank ``stop_rank`` stops itself with
``SIGSTOP`` before step ``stop_step``: its peers hang in DDP's all-reduce, the
observers' verdict names it and every trainer exits with the hang exit code, so
torchrun restarts the job.

Each rank writes JSON into ``out_dir`` for the test: its pid (so the test can kill it
whatever happens), what its verdict callback (a launcher's quarantine hook) saw, the
signatures of its whole training state after every step of
the first attempt, the signatures right after a resume, and how it finished.

Usage: ``multinode_job.py REPORT_DIR CKPT_DIR OUT_DIR STEPS STOP_RANK STOP_STEP``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import scout_core as scout
from scout_core.testing import TinyLM, signature, train_step

HANG_EXIT_CODE = 86
HANG_TIMEOUT_S = 3.0


def dump(path: Path, value: Any) -> None:
    """Write ``value`` as JSON atomically (the test may read it at any moment)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(value, sort_keys=True))
    os.replace(tmp, path)


def fingerprint(
    root: torch.nn.Module, opt: torch.optim.Optimizer, extra: dict[str, Any]
) -> dict[str, str]:
    """Signatures of everything a bitwise restore must reproduce."""

    def sig(t: torch.Tensor) -> str:
        return f"{signature(t.detach()):016x}"

    out = {f"model/{k}": sig(v) for k, v in root.state_dict().items()}
    state = opt.state_dict()
    for pid, slots in state["state"].items():
        for key, value in slots.items():
            if isinstance(value, torch.Tensor):
                out[f"optim/{pid}/{key}"] = sig(value)
    hyper = [{k: v for k, v in g.items() if k != "params"} for g in state["param_groups"]]
    out["optim/hyper"] = json.dumps(hyper, sort_keys=True, default=repr)
    out["rng/cpu"] = sig(torch.get_rng_state())
    out["extra/step"] = repr(extra["step"])
    out["extra/cursor"] = sig(extra["cursor"])
    return out


def main(argv: list[str]) -> None:
    report_dir, ckpt_dir, out_dir = argv[:3]
    steps, stop_rank, stop_step = (int(a) for a in argv[3:6])
    out = Path(out_dir)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    dump(out / f"pid-{attempt}-{rank}.json", {"pid": os.getpid(), "host": os.uname().nodename})
    torch.set_num_threads(1)
    torch.manual_seed(1234 + 1000 * attempt)  # a restart starts from other weights and RNG
    root = TinyLM()
    model = DistributedDataParallel(root)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    config = scout.Config(
        report_dir=report_dir,
        checkpoint_dir=ckpt_dir,
        replay_interval=1,
        embedding_interval=1,
        lm_head_interval=1,
        optimizer_interval=1,
        variants=(1.0,),
        hang_timeout_s=HANG_TIMEOUT_S,
        observer_join_timeout_s=120.0,
        on_hang="terminate",
        hang_exit_code=HANG_EXIT_CODE,
    )

    def quarantine(record: Any) -> None:
        """The launcher's decision hook: runs on every rank that learns of a verdict,
        before a terminate exit; here it leaves what a scheduler would act on."""
        if record.outliers:
            dump(
                out / f"verdict-{attempt}-{rank}.json",
                {"failure": record.failure.value, "ranks": list(record.outliers),
                 "hosts": list(record.hosts)},
            )  # fmt: skip

    session = scout.enable(model, opt, config=config, callback=quarantine)
    extra: dict[str, Any] = {"step": -1, "cursor": torch.zeros(2, dtype=torch.int64)}
    gate = session.checkpoints
    assert gate is not None
    gate.set_extra_state(lambda: extra)
    got = session.resume()  # the recovery hand-off: None on a first start
    start = 0
    if got is not None:
        start = got.step + 1
        dump(
            out / f"restored-{attempt}-{rank}.json",
            {
                "step": got.step,
                "role": got.role,
                "source": got.source,
                "fingerprint": fingerprint(root, opt, extra),
                "replay_step": session.step,
            },
        )
    refs: dict[int, dict[str, str]] = {}
    for step in range(start, steps):
        if got is None and attempt == 0 and rank == stop_rank and step == stop_step:
            dump(out / f"stopping-{rank}.json", {"step": step})
            os.kill(os.getpid(), signal.SIGSTOP)  # frozen: the observers must name us
        extra["step"] = step
        extra["cursor"] += step + 1
        torch.rand(3)  # e.g. a sampler's shuffle: the CPU RNG moves every iteration
        train_step(model, opt, step, rank)
        if got is None:
            refs[step] = fingerprint(root, opt, extra)
            dump(out / f"refs-{attempt}-{rank}.json", refs)
    dump(
        out / f"done-{attempt}-{rank}.json",
        {
            "start": start,
            "last": steps - 1,
            "resumed": got is not None,
            "session_step": session.step,
        },
    )
    session.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
