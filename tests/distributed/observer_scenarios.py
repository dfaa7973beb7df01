"""Rank bodies and test-side helpers shared by the ``test_observer_*`` tests.

Every body starts the real observer (a separate process per rank, its own store
and Gloo group), attaches the collective patch, trains a few tiny all-reduce
steps on a *training* group of its own (so a Gloo timeout bounds every test),
then injects one fault. Times are ``time.monotonic()``: CLOCK_MONOTONIC is
system-wide on Linux, so a rank's timestamp and the test's are comparable.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

HANG_S = 2.0
STALL_S = HANG_S + 3.5  # how long an injected fault lasts: well past the verdict
TRAIN_TIMEOUT_S = 30.0  # the training group's own timeout: longer than any fault


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _config(port: int, report_dir: str, **overrides: Any) -> Any:
    from scout_core.config import Config

    fields: dict[str, Any] = {
        "report_dir": report_dir,
        "run_id": "observer-test",
        "hang_timeout_s": HANG_S,
        "observer_addr": "127.0.0.1",
        "observer_port": port,
        "observer_join_timeout_s": 20.0,
    }
    fields.update(overrides)
    return Config(**fields)


def _scratch() -> Path:
    return Path(os.environ["SCOUT_TEST_RANK_DIR"])


def _mark(name: str, value: Any = None) -> None:
    path = _scratch() / name
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value))
    tmp.rename(path)


def _hold_gil(seconds: float) -> None:
    """Spin in C for ``seconds`` without releasing the GIL: ``sum`` over a range never
    reaches the interpreter's eval loop, so no other thread of this process runs."""
    n = 2_000_000
    t = time.perf_counter()
    sum(range(n))
    per = (time.perf_counter() - t) / n
    sum(range(int(seconds / per)))


class _Rank:
    """One rank of a scenario: its groups, its observer handle, one training step."""

    def __init__(self, handle: Any, culprit: int) -> None:
        import torch
        import torch.distributed as dist

        self.rank = dist.get_rank()
        self.culprit = self.rank == culprit
        self.handle = handle
        self.train = dist.new_group(backend="gloo", timeout=timedelta(seconds=TRAIN_TIMEOUT_S))
        # Two more groups over the same ranks, with short timeouts, for the mismatches:
        # the same members give the same group identity, so only type or shape differ.
        short = timedelta(seconds=HANG_S + 4)
        self.short_a = dist.new_group(backend="gloo", timeout=short)
        self.short_b = dist.new_group(backend="gloo", timeout=short)
        self.x = torch.ones(4)

    def step(self) -> None:
        import torch.distributed as dist

        dist.all_reduce(self.x, group=self.train)
        if self.handle is not None:
            self.handle.publisher.advance_step()


def _sigstop(r: _Rank) -> None:
    if r.culprit:
        _mark("freeze-ready")
        time.sleep(1.0)  # the test stops this process here, before the collective
    r.step()


def _gil(r: _Rank) -> None:
    if r.culprit:
        _mark("freeze-at", time.monotonic())
        threading.Thread(target=_hold_gil, args=(STALL_S + 1.0,), daemon=True).start()
        time.sleep(0.05)  # hand the GIL to the spinning thread: main is frozen here
    r.step()


BUSY_S = 3 * HANG_S
"""How long the peers keep progressing after the silent rank's last publish (`late`)."""


def _late(r: _Rank) -> None:
    """The culprit goes silent while its peers keep progressing for ``BUSY_S``, then
    wait for it in the next collective: its silence at the verdict is far longer than
    ``hang_timeout_s``, and the record must state the silence measured."""
    from scout_core.observer.progress import Stage

    if r.culprit:
        _mark("silent-from", time.monotonic())  # after its last publish
        time.sleep(BUSY_S + 4 * HANG_S)  # well past the verdict
    else:
        for _ in range(int(BUSY_S / 0.05)):  # the same count on every peer: equal op ids
            r.handle.publisher.publish(Stage.LAYER)  # compute that publishes progress
            time.sleep(0.05)
        _mark(f"blocked-{r.rank}", time.monotonic())  # before its collective's publish
    r.step()


def _wrong_collective(r: _Rank) -> None:
    import torch.distributed as dist

    if r.culprit:
        dist.broadcast(r.x, src=0, group=r.short_a)
    else:
        dist.all_reduce(r.x, group=r.short_a)


def _wrong_shape(r: _Rank) -> None:
    import torch
    import torch.distributed as dist

    if r.culprit:
        dist.all_reduce(torch.ones(5), group=r.short_b)
    else:
        dist.all_reduce(r.x, group=r.short_a)


def _group_stall(r: _Rank) -> None:
    if r.culprit:
        time.sleep(STALL_S)  # the unobserved rank, outside the observers' group
    r.step()


def _input_stall(r: _Rank) -> None:
    from scout_core.observer import watch_dataloader

    for _batch in watch_dataloader(_SlowData(r.culprit), r.handle.publisher):
        r.step()


def _checkpoint_stall(r: _Rank) -> None:
    import torch

    from scout_core.observer import checkpoint_stage

    with checkpoint_stage(r.handle.publisher, "write"):
        torch.save({"x": r.x}, _scratch() / f"ckpt-{r.rank}.pt")
        if r.culprit:
            time.sleep(STALL_S)
    r.step()


_FAULTS = {
    "slow_start": _Rank.step,
    "slow_first_step": _Rank.step,
    "sigstop": _sigstop,
    "late": _late,
    "gil": _gil,
    "wrong_collective": _wrong_collective,
    "wrong_shape": _wrong_shape,
    "group_stall": _group_stall,
    "input_stall": _input_stall,
    "checkpoint_stall": _checkpoint_stall,
}


_AWAIT_VERDICT = {"sigstop"}
"""Scenarios whose test checks that every trainer got the verdict through its callback."""
VERDICT_WAIT_S = 10.0


def _await_verdict(handle: Any, timeout_s: float) -> None:
    """Wait (bounded) for the observer's verdict to reach this trainer: the test lets the
    frozen rank go as soon as the record file exists, and the verdict travels to each
    trainer on its own, so a rank may finish its steps before its copy has arrived."""
    deadline = time.monotonic() + timeout_s
    while not handle.verdicts and time.monotonic() < deadline:
        time.sleep(0.05)


def scenario(name: str, port: int, report_dir: str, culprit: int, **cfg: Any) -> dict[str, Any]:
    """One rank of a fault scenario; returns what the test asserts on."""
    import torch.distributed as dist

    from scout_core import observer

    rank, world = dist.get_rank(), dist.get_world_size()
    observed = [r for r in range(world) if not (name == "group_stall" and r == culprit)]
    handle = None
    close_patch = None
    if rank in observed:
        handle = observer.start(
            _config(port, report_dir, **cfg), rank=rank, world_size=world, ranks=observed
        )
        close_patch = observer.install_collective_fingerprints(handle.publisher)
        _mark(f"observer-{rank}", handle.pid)
    r = _Rank(handle, culprit)
    out: dict[str, Any] = {"rank": rank}
    if name == "slow_start":
        # A framework's start-up after SCOUT attached: one published collective, then
        # every rank idle for 3x the hang timeout before its first step.
        dist.all_reduce(r.x, group=r.train)
        time.sleep(3 * HANG_S)
    if name == "slow_first_step":
        # Warm-up: one published collective, then every rank computing in its first
        # step (a layer's forward: lazy initialisation, compilation) for 3x the timeout.
        dist.all_reduce(r.x, group=r.train)
        if handle is not None:
            from scout_core.observer.progress import Stage

            handle.publisher.publish(Stage.LAYER)
        time.sleep(3 * HANG_S)
    for _ in range(3):
        r.step()
    try:
        _FAULTS[name](r)
        r.step()
    except RuntimeError as exc:  # the mismatch scenarios end by the group's timeout
        out["error"] = str(exc)[:200]
    if handle is not None and close_patch is not None:
        if name in _AWAIT_VERDICT:
            _await_verdict(handle, VERDICT_WAIT_S)
        out["verdicts"] = [v.to_dict() for v in handle.verdicts]
        out["stats"] = handle.stats().__dict__
        close_patch()
        handle.close()
    return out


class _SlowData:
    """Three batches; the culprit's second fetch takes ``STALL_S``."""

    def __init__(self, slow: bool) -> None:
        self.slow = slow

    def __iter__(self) -> Any:
        for i in range(3):
            if self.slow and i == 1:
                time.sleep(STALL_S)
            yield i


def healthy(port: int, report_dir: str, steps: int) -> dict[str, Any]:
    """A clean run with every hook attached: layers, optimizer, DataLoader, collectives."""
    import torch
    import torch.distributed as dist
    from torch import nn

    from scout_core import observer

    rank, world = dist.get_rank(), dist.get_world_size()
    handle = observer.start(_config(port, report_dir), rank=rank, world_size=world)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    close_patch = observer.install_collective_fingerprints(handle.publisher)
    close_hooks = observer.attach_progress_hooks(handle.publisher, [model[0], model[2]], [opt])
    train = dist.new_group(backend="gloo", timeout=timedelta(seconds=TRAIN_TIMEOUT_S))
    loader = observer.watch_dataloader([torch.randn(2, 4) for _ in range(steps)], handle.publisher)
    start = time.monotonic()
    for batch in loader:
        loss = model(batch).sum()
        loss.backward()
        for p in model.parameters():
            assert p.grad is not None
            dist.all_reduce(p.grad, group=train)
        opt.step()
        opt.zero_grad()
        time.sleep(0.015)  # the run spans several hang timeouts
    elapsed = time.monotonic() - start
    stats = handle.stats().__dict__
    out = {
        "elapsed": elapsed,
        "step": handle.publisher.step,
        "op_id": handle.publisher.op_id,
        "stats": stats,
        "verdicts": len(handle.verdicts),
    }
    close_hooks()
    close_patch()
    handle.close()
    return out


def orphan(port: int, report_dir: str) -> dict[str, Any]:
    """Start the observer, say its pid, then idle-publish until told to stop."""
    import torch.distributed as dist

    from scout_core import observer

    rank, world = dist.get_rank(), dist.get_world_size()
    handle = observer.start(_config(port, report_dir), rank=rank, world_size=world)
    _mark(f"observer-{rank}", handle.pid)
    deadline = time.monotonic() + 60
    while not (_scratch() / "stop").exists() and time.monotonic() < deadline:
        handle.publisher.advance_step()
        time.sleep(0.02)
    handle.close()
    return {"rank": rank}


# -- test side ---------------------------------------------------------------------------


def wait_for(path: Path, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout_s} s")
        time.sleep(0.005)
    return json.loads(path.read_text())


def wall_of(monotonic: float) -> float:
    """The Unix time of a ``time.monotonic()`` reading taken on this machine: a record's
    ``time`` is compared with it (the record's own timestamp, not a poller's)."""
    return time.time() - (time.monotonic() - monotonic)


def first_verdict(report_dir: str, timeout_s: float) -> float | None:
    """Monotonic time at which the first verdict record appeared (None: never)."""
    from scout_core.records.evidence import load_report

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if Path(report_dir).is_dir() and load_report(report_dir).verdicts():
            return time.monotonic()
        time.sleep(0.02)
    return None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie still answers kill(0); it is dead for our purpose
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def kill_quietly(pid: int, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def broken_observer(report_dir: str, broken: int) -> dict[str, Any]:
    """``scout.enable``'s observer start where rank ``broken``'s observer dies at once."""
    import torch.distributed as dist

    from scout_core import observer
    from scout_core.observer import handle

    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == broken:  # this rank's observer is a process that exits with 3 at once

        def spawn_dying(args: Any, pass_fds: Any) -> Any:
            return handle_spawn(["-c", "import sys; sys.exit(3)"], pass_fds)

        handle_spawn = handle.spawn
        handle.spawn = spawn_dying  # type: ignore[assignment]
    start = time.monotonic()
    try:
        observer.start(_config(0, report_dir, observer_port=None), rank=rank, world_size=world)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}", "elapsed": time.monotonic() - start}
    return {"error": None, "elapsed": time.monotonic() - start}
