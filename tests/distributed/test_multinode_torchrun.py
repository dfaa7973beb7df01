"""Two torchrun agents on loopback, as two nodes: hang, exit, restart, restore, continue.

Both agents run ``multinode_job.py`` (``--nnodes 2 --nproc-per-node 3 --rdzv-backend
c10d --max-restarts 1``): TinyLM under DDP with replay, the checkpoint gate (durable
``checkpoint_dir``) and the observer (``on_hang = "terminate"``). In the first attempt
rank ``STOP_RANK`` (on the second node) stops itself with ``SIGSTOP`` before step
``STOP_STEP``. The chain the test checks:

1. the observers' hang verdict names the stopped rank, and every record carries a host;
2. every trainer exits with the SCOUT hang exit code (the frozen one is killed by its
   observer) after writing torchelastic's error file, which names the culprit as
   torchrun would print it in its "Root Cause";
3. torchrun restarts the job; the restarted job calls ``session.resume()`` and restores
   the gate's verified generation from ``checkpoint_dir``, bitwise equal to the state
   the first attempt had right after that step (every rank's whole training state);
4. training continues to the last step and both agents exit 0.

No process outlives the test: the agents run in their own sessions and their process
groups are killed in ``finally``; the workers (torchrun starts each in a session of its
own) write their pids, and any still alive are killed too.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from scout_core.records.reading import load_report
from scout_core.testing.harness import retry_on_port_clash

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

JOB = Path(__file__).with_name("multinode_job.py")
ROOT = Path(__file__).resolve().parents[2]
NODES, PER_NODE = 2, 3
WORLD = NODES * PER_NODE
STEPS = 16
STOP_RANK = 4  # on the second node
STOP_STEP = 13  # verified step 7 and candidate step 11 are on disk by then
HANG_EXIT_CODE = 86
DEADLINE_S = 540.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child_env(**extra: str) -> dict[str, str]:
    """This environment, with this checkout first on the import path."""
    path = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {**os.environ, "PYTHONPATH": path, **extra}


def agent(node: int, port: int, tmp: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """Start one torchrun agent (one "node") in a session of its own."""
    env = {
        **child_env(),
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        # torchrun's agent store outlives a restart, and the restarted workers then read
        # the previous attempt's Gloo addresses from it (pytorch/pytorch#135712): each
        # attempt gets a store of its own (docs/operations.md).
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
    }
    env.pop("TORCHELASTIC_RUN_ID", None)
    cmd = [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", str(NODES),
        "--nproc-per-node", str(PER_NODE),
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{port}",
        "--max-restarts", "1",
        "--monitor-interval", "0.5",
        "--local-addr", "127.0.0.1",
        "--log-dir", str(tmp / f"logs-{node}"),
        str(JOB),
        str(tmp / "report"), str(tmp / "ckpt"), str(tmp / "out"),
        str(STEPS), str(STOP_RANK), str(STOP_STEP),
    ]  # fmt: skip
    log = tmp / f"agent-{node}.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            cmd, cwd=tmp, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
    return proc, log


def kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def is_worker(pid: int) -> bool:
    """Whether ``pid`` is still one of this test's trainers (guards against pid reuse)."""
    try:
        return JOB.name.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def node_of(path: Path) -> int:
    """The node of the rank a ``<what>-<attempt>-<rank>.json`` file is from."""
    return int(path.stem.rsplit("-", 1)[1]) // PER_NODE


def read(path: Path) -> Any:
    return json.loads(path.read_text())


def run_job(tmp_path: Path) -> dict[int, str]:
    """Run both agents to the end (bounded); kill whatever is left; their logs. A run
    whose rendezvous port was taken meanwhile starts over on a fresh one."""
    return retry_on_port_clash(lambda: _run_job_once(tmp_path))


def _run_job_once(tmp_path: Path) -> dict[int, str]:
    for name in ("out", "report", "ckpt", *(f"logs-{n}" for n in range(NODES))):
        shutil.rmtree(tmp_path / name, ignore_errors=True)
    out = tmp_path / "out"
    out.mkdir()
    port = free_port()
    agents: list[tuple[subprocess.Popen[bytes], Path]] = []
    try:
        agents = [agent(n, port, tmp_path) for n in range(NODES)]
        deadline = time.monotonic() + DEADLINE_S
        for proc, _ in agents:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        logs = {n: log.read_text(errors="replace") for n, (_, log) in enumerate(agents)}
        assert [p.returncode for p, _ in agents] == [0, 0], logs
    finally:
        for proc, _ in agents:
            kill_group(proc.pid)
        for f in out.glob("pid-*.json"):
            pid = int(read(f)["pid"])
            if is_worker(pid):
                kill_group(pid)  # torchrun starts each worker as a session leader
        for proc, _ in agents:
            proc.wait(timeout=10)
    return logs


def check_first_attempt(tmp_path: Path, report: Any, logs: dict[int, str]) -> None:
    """The hang verdict names the frozen rank (and its host); the trainers exited with
    the hang code after writing error files that name it."""
    out = tmp_path / "out"
    hangs = [v for v in report.verdicts() if v.failure is not None and v.failure.value == "hang"]
    assert hangs, [v.to_dict() for v in report.verdicts()]
    assert {tuple(v.outliers) for v in hangs} == {(STOP_RANK,)}, [v.to_dict() for v in hangs]
    # A record's ``hosts`` are its culprits' hosts (docs/evidence.md): every record that
    # names a rank carries them; job-scope gate records name no one.
    named = [r for r in report.records if r.outliers]
    assert named and all(r.hosts for r in named), [r.to_dict() for r in named if not r.hosts]
    stopped_host = read(out / f"pid-0-{STOP_RANK}.json")["host"]
    assert {h for v in hangs for h in v.hosts} == {stopped_host}
    # The verdict callback (a launcher's quarantine hook) ran before the exit, on both
    # nodes, and names the rank and host to quarantine.
    for n in range(NODES):
        seen = [read(f) for f in out.glob("verdict-0-*.json") if node_of(f) == n]
        assert seen, f"no verdict callback ran on node {n}"
        for v in seen:
            assert v == {"failure": "hang", "ranks": [STOP_RANK], "hosts": [stopped_host]}, v
    # Each agent's first failed worker exited with the hang code (the agent then stops
    # the rest of its workers, so later exits are SIGTERMs of its own).
    for n in range(NODES):
        assert f"failed (exitcode: {HANG_EXIT_CODE})" in logs[n], logs[n]
    # The error files torchrun reads name the culprit: what it prints as the "Root
    # Cause" of a failed attempt (ProcessFailure is how the agent reads them).
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    for n in range(NODES):
        errors = sorted(tmp_path.glob(f"logs-{n}/*/attempt_0/*/error.json"))
        assert errors, f"node {n} wrote no error file"
        for e in errors:
            failure = ProcessFailure(int(e.parent.name), 0, HANG_EXIT_CODE, str(e))
            body: Any = failure.message  # a dict once the file was read
            message = str(body["message"])
            assert f"exit code {HANG_EXIT_CODE}" in message, message
            assert f"hang rank {STOP_RANK} at step" in message, message


def check_restart(tmp_path: Path, report: Any) -> None:
    """The restarted job resumed from the verified generation, bitwise, and finished."""
    out = tmp_path / "out"
    restored = {r: read(out / f"restored-1-{r}.json") for r in range(WORLD)}
    steps = {v["step"] for v in restored.values()}
    assert len(steps) == 1, restored
    (step,) = steps
    assert 0 < step < STOP_STEP
    for r, got in restored.items():
        assert (got["role"], got["source"]) == ("verified", "disk")
        assert got["replay_step"] == step + 1
        refs = read(out / f"refs-0-{r}.json")
        assert got["fingerprint"] == refs[str(step)], f"rank {r} not bitwise equal"
    resumes = [
        r.checkpoint_step for r in report.checkpoints() if (r.detail or {}).get("phase") == "resume"
    ]
    assert resumes == [step], [r.to_dict() for r in report.checkpoints()]
    # Training went on to the last step on every rank; the first attempt never finished.
    for r in range(WORLD):
        done = read(out / f"done-1-{r}.json")
        assert done["resumed"] and done["start"] == step + 1, (r, done)
        assert (done["last"], done["session_step"]) == (STEPS - 1, STEPS), (r, done)
    assert not list(out.glob("done-0-*.json"))
    # scout report renders the chain: the hang verdict, the gate, the resume.
    shown = subprocess.run(
        [sys.executable, "-m", "scout_core", "report", str(tmp_path / "report")],
        check=False, capture_output=True, text=True, timeout=120, env=child_env(COLUMNS="200"),
    )  # fmt: skip
    assert shown.returncode == 1, shown.stderr  # something was attributed
    assert f"rank {STOP_RANK}" in shown.stdout, shown.stdout
    assert f"resumed after a restart from verified step {step}" in shown.stdout, shown.stdout


@pytest.mark.timeout(600)
def test_two_agents_hang_exit_restart_restore_continue(tmp_path: Path) -> None:
    logs = run_job(tmp_path)
    report = load_report(tmp_path / "report")
    check_first_attempt(tmp_path, report, logs)
    check_restart(tmp_path, report)
