"""The multi-rank harness: results, failures, timeouts, and no stray processes."""

from __future__ import annotations

import os
import time

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
