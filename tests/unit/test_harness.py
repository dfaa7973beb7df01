"""The multi-rank harness: results, failures, timeouts, and no stray processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scout_core.testing.harness import RankFailedError, RanksTimeoutError, run_ranks


def rank_sum(offset: int) -> int:
    import torch
    import torch.distributed as dist

    t = torch.tensor([dist.get_rank() + offset])
    dist.all_reduce(t)
    return int(t.item())


def rank_pid() -> int:
    return os.getpid()


def rank_fails_on_one() -> None:
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise RuntimeError("injected failure on rank 1")
    dist.barrier()  # peers block here until the harness kills them


def rank_sleeps_forever() -> None:
    time.sleep(3600)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); read its state
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


@pytest.mark.distributed
@pytest.mark.timeout(90)
def test_results_come_back_per_rank() -> None:
    assert run_ranks(rank_sum, 3, args=(10,), timeout_s=60) == [33, 33, 33]


@pytest.mark.distributed
@pytest.mark.timeout(90)
def test_a_failing_rank_raises_with_its_traceback_and_peers_are_killed() -> None:
    pids: list[int] = []
    with pytest.raises(RankFailedError, match="injected failure on rank 1"):
        run_ranks(
            rank_fails_on_one,
            3,
            timeout_s=60,
            on_start=lambda ranks: pids.extend(r.proc.pid for r in ranks),
        )
    assert len(pids) == 3 and not any(_alive(p) for p in pids)


@pytest.mark.distributed
@pytest.mark.timeout(90)
def test_timeout_kills_every_rank() -> None:
    pids: list[int] = []
    start = time.monotonic()
    with pytest.raises(RanksTimeoutError, match=r"ranks \[0, 1, 2\] still running"):
        run_ranks(
            rank_sleeps_forever,
            3,
            timeout_s=8,
            on_start=lambda ranks: pids.extend(r.proc.pid for r in ranks),
        )
    assert time.monotonic() - start < 30
    assert len(pids) == 3 and not any(_alive(p) for p in pids)


def test_local_functions_are_refused() -> None:
    def local() -> None:
        return None

    with pytest.raises(ValueError, match="module-level"):
        run_ranks(local, 2)


def test_a_scripts_own_function_runs_on_every_rank(tmp_path: Path) -> None:
    # `python script.py` with the body beside the call: ranks load the script by path
    # (its `if __name__ == "__main__":` block runs once, in the harness), and a module
    # next to the script imports on every rank.
    (tmp_path / "helper_mod.py").write_text("OFFSET = 1\n")
    script = tmp_path / "script.py"
    script.write_text(
        "from helper_mod import OFFSET\n"
        "from scout_core.testing import run_ranks\n\n"
        "def body(x: int) -> int:\n"
        "    import torch, torch.distributed as dist\n"
        "    t = torch.tensor([dist.get_rank() + x + OFFSET]); dist.all_reduce(t)\n"
        "    return int(t.item())\n\n"
        'if __name__ == "__main__":\n'
        "    print(run_ranks(body, 3, args=(1,), timeout_s=60))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    res = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[9, 9, 9]"  # (0+1+2) + 3 * (1 + 1)
