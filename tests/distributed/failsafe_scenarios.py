"""Rank bodies for the observer's fail-safety: SCOUT's own parts failing never blame a rank.

Every body trains a tiny replicated MLP through ``scout.enable`` (no numerical replay:
``recipes=()``; the observer on, its store on an OS-chosen port published through the
job's store), all-reducing gradients on a training group of its own with a bounded
timeout, then injects one fault into SCOUT's parts or into the job.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

HANG_S = 2.0
TRAIN_TIMEOUT_S = 40.0


def _scratch() -> Path:
    return Path(os.environ["SCOUT_TEST_RANK_DIR"])


def mark(name: str, value: Any = None) -> None:
    path = _scratch() / name
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(value))
    tmp.rename(path)


class _Logged(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


class Job:
    """One rank: the model, its optimizer, its training group, its SCOUT session."""

    def __init__(self, report_dir: str, **cfg: Any) -> None:
        import scout_core as scout

        self.rank = dist.get_rank()
        self.train = dist.new_group(timeout=timedelta(seconds=TRAIN_TIMEOUT_S))
        torch.manual_seed(0)
        self.model = nn.Sequential(
            nn.Linear(4, 8), nn.ModuleList([nn.Linear(8, 8) for _ in range(2)]), nn.Linear(8, 1)
        )
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.seen: list[Any] = []
        self.log = _Logged()
        logging.getLogger("scout_core").addHandler(self.log)
        fields: dict[str, Any] = {
            "report_dir": report_dir,
            "run_id": "failsafe",
            "hang_timeout_s": HANG_S,
            "observer_join_timeout_s": 15.0,
            "recipes": (),
        }
        fields.update(cfg)
        self.session: Any = None
        self.config = scout.Config(**fields)

    def enable(self) -> None:
        import scout_core as scout

        self.session = scout.enable(
            self.model, self.opt, config=self.config, callback=self._on_verdict
        )

    def _on_verdict(self, record: Any) -> None:
        self.seen.append(record.to_dict())
        mark(f"callback-{self.rank}-{len(self.seen)}", record.to_dict())

    def step(self, step: int) -> None:
        x = torch.randn(4, 4, generator=torch.Generator().manual_seed(step))
        h = self.model[0](x)
        layers: Any = self.model[1]
        for layer in layers:
            h = torch.tanh(layer(h))
        self.model[2](h).square().mean().backward()
        for p in self.model.parameters():
            assert p.grad is not None
            dist.all_reduce(p.grad, group=self.train)
        self.opt.step()
        self.opt.zero_grad()

    def result(self, **extra: Any) -> dict[str, Any]:
        handle = self.session.observer
        out = {
            "rank": self.rank,
            "verdicts": [(v["failure"], v["outliers"], v["step"]) for v in self.seen],
            "restarts": handle.restarts,
            "log": self.log.lines,
            **extra,
        }
        self.session.close()
        return out


def enable_from_thread(report_dir: str, steps: int) -> dict[str, Any]:
    """``scout.enable`` from a setup thread that exits; the observers must live on."""
    job = Job(report_dir)
    setup = threading.Thread(target=job.enable, name="setup")
    setup.start()
    setup.join()
    time.sleep(1.0)  # the parent-death signal would have fired by now
    pid = job.session.observer.pid
    host = job.session.observer.host
    for step in range(steps):
        job.step(step)
    alive = job.session.observer.proc.poll() is None
    return job.result(
        observer_alive=alive,
        same_pid=job.session.observer.pid == pid,
        host_alive=None if host is None else host.alive,
    )


def killed_observer(report_dir: str, victim: int, staller: int, steps: int) -> dict[str, Any]:
    """Rank ``victim`` SIGKILLs its own observer at step 2; rank ``staller`` (if any)
    stalls for real at the first step from 6 on at which the victim's observer is back.

    The staller keeps training while it waits: a trainer that waited in place would
    itself be quiet for as long as the restart takes (seconds where importing torch is
    slow), and a round rung then would run without the victim's observer."""
    job = Job(report_dir)
    job.enable()

    def tell_when_restarted() -> None:  # off the training loop, which the stall blocks
        handle = job.session.observer
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            stats = handle.stats()  # the new incarnation's own words, not the dead one's
            if handle.restarts and stats.state.name == "JOINED" and stats.pid == handle.pid:
                mark("restarted", handle.pid)
                return
            time.sleep(0.05)

    stalled = False
    for step in range(steps):
        if step == 2 and job.rank == victim:
            old = job.session.observer.pid
            os.kill(old, signal.SIGKILL)
            mark("killed", old)
            threading.Thread(target=tell_when_restarted, daemon=True).start()
        if (
            step >= 6
            and job.rank == staller
            and not stalled
            and (_scratch() / "restarted").exists()
        ):
            stalled = True
            time.sleep(HANG_S + 3.5)  # a real CPU-side stall: nothing is published
        job.step(step)
        time.sleep(0.2)
    if job.rank == staller and not stalled:
        raise TimeoutError(f"rank {victim}'s observer was not back within {steps} steps")
    deadline = time.monotonic() + 10
    while staller >= 0 and not job.seen and time.monotonic() < deadline:
        time.sleep(0.05)
    return job.result()


def dead_peer(report_dir: str, victim: int, at_step: int) -> dict[str, Any]:
    """Rank ``victim``'s machine goes dark at ``at_step``: the test freezes its trainer
    and kills its observer (and, on rank 0, the observers' store host beside it), as a
    dead host looks to its peers, which hang in the next all-reduce until the
    observers' verdict terminates them."""
    job = Job(report_dir, on_hang="terminate", hang_exit_code=86)
    job.enable()
    for step in range(at_step + 20):
        if step == at_step and job.rank == victim:
            handle = job.session.observer
            host = None if handle.host is None else handle.host.proc.pid
            mark("dying", {"observer": handle.pid, "host": host})
            time.sleep(1.0)  # the test takes this machine down here
        job.step(step)
        time.sleep(0.05)
    return job.result()


def sigstop_then_teardown(report_dir: str, culprit: int) -> dict[str, Any]:
    """A rank is frozen (by the test) before step 3; the test then kills every rank."""
    job = Job(report_dir)
    job.enable()
    for step in range(30):
        if step == 3 and job.rank == culprit:
            mark("freeze-ready", time.monotonic())
            time.sleep(1.0)  # stopped here by the test
        job.step(step)
    return job.result()


def busy_ports(report_dir: str, steps: int, hold: int | None) -> dict[str, Any]:
    """A healthy job; rank 0 first binds ``hold`` (a port some other job's store uses)."""
    held = None
    if hold is not None and dist.get_rank() == 0:
        held = dist.TCPStore(  # type: ignore[attr-defined]  # public API, absent from the stubs
            "127.0.0.1", hold, None, True, wait_for_workers=False
        )
    job = Job(report_dir, run_id=f"ports-{os.environ['MASTER_PORT']}")
    job.enable()
    _, port = job.session.observer.store
    for step in range(steps):
        job.step(step)
    out = job.result(store_port=port, master_port=int(os.environ["MASTER_PORT"]))
    del held
    return out


def free_port_run(width: int) -> int:
    """A loopback port ``p`` with ``p + 1 .. p + width - 1`` free too."""
    for _ in range(100):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = int(a.getsockname()[1])
        ok = True
        for k in range(1, width):
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + k))
                except OSError:
                    ok = False
        if ok and port + width < 65536:
            return port
    raise OSError("no run of free ports found")
