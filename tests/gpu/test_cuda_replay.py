"""Replay on CUDA (issue 10 item 8), run by ``scripts/gpu_check.sh`` on a lent GPU.

Three ranks share one GPU over Gloo with CUDA tensors (NCCL refuses two ranks on one
device). They check what only CUDA exercises: ``t_M`` timed with CUDA events (a GPU
busy kernel is asynchronous, so host timing alone would miss it), the cuBLAS workspace
that deterministic replay needs, and signatures of device tensors.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

import pytest
import torch

from scout_core.testing.harness import run_ranks

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.distributed,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

WORLD = 3
ENV = {"OMP_NUM_THREADS": "1", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
"""As ``docs/replay.md`` asks of a CUDA launch: the cuBLAS workspace is set before CUDA
starts (the model is on the GPU before ``enable``)."""


def _run(
    fault: str, victim: int, steps: int, scout: bool = True, env: dict[str, str] = ENV
) -> list[Any]:
    from cuda_scenarios import scenario

    return run_ranks(scenario, WORLD, args=(fault, victim, steps, scout), timeout_s=240, env=env)


def _named(results: list[Any]) -> set[tuple[str, tuple[int, ...]]]:
    return {
        (v["failure"], tuple(v["outliers"]))
        for res in results
        for v in res["verdicts"]
        if v["outliers"]
    }


def test_interval_waits_for_the_device() -> None:
    # A GPU busy kernel returns to the host at once; the interval must include its time.
    from cuda_scenarios import gpu_sleep_cycles

    from scout_core.replay.scope import Interval

    cycles = gpu_sleep_cycles(0.1)
    interval = Interval(torch.device("cuda", 0))
    t0 = time.monotonic()
    with interval.timing():
        torch.cuda._sleep(cycles)  # type: ignore[no-untyped-call]  # unannotated in torch
        launched = time.monotonic() - t0
    assert launched < 0.05, "the busy kernel did not run asynchronously"
    assert 0.08 <= interval.seconds <= 0.5


@pytest.mark.timeout(300)
def test_bitflip_on_the_gpu_is_sdc_naming_the_rank() -> None:
    results = _run("bitflip", victim=2, steps=4)
    assert _named(results) == {("sdc", (2,))}
    steps = {v["step"] for res in results for v in res["verdicts"] if v["outliers"]}
    assert steps == {2}  # layers.2 is sampled at step 2 (layer k at steps k, k+4)
    assert all(res["cublas"] in (":4096:8", ":16:8") for res in results)


@pytest.mark.timeout(300)
def test_a_slow_gpu_is_a_straggler_only_device_timing_sees() -> None:
    results = _run("gpu_slow", victim=1, steps=6)
    assert _named(results) == {("straggler", (1,))}


@pytest.mark.timeout(300)
def test_clean_cuda_training_is_bitwise_identical_with_scout_on() -> None:
    on = _run("none", victim=0, steps=6)
    off = _run("none", victim=0, steps=6, scout=False)
    assert not _named(on)
    assert [r["state"] for r in on] == [r["state"] for r in off]


@pytest.mark.timeout(300)
def test_enable_after_cuda_started_without_a_cublas_workspace_refuses_on_every_rank() -> None:
    # The model is on the GPU before enable, and the launch did not set the workspace:
    # every rank refuses at enable, naming the variable, instead of replaying rounds
    # that would all end inconclusive.
    from scout_core.testing.harness import RankFailedError

    with pytest.raises(RankFailedError) as failed:
        _run("none", victim=0, steps=2, env={**ENV, "CUBLAS_WORKSPACE_CONFIG": ""})
    text = str(failed.value)
    assert text.count("ConfigError: CUBLAS_WORKSPACE_CONFIG is '' and CUDA is already") == WORLD


def test_cuda_initialised_without_a_cublas_workspace_is_refused_by_name() -> None:
    # Deterministic replay on CUDA needs CUBLAS_WORKSPACE_CONFIG; once CUDA is initialised
    # it can no longer be set, and the check says so by name instead of every round
    # ending inconclusive.
    code = (
        "import os, torch\n"
        "os.environ.pop('CUBLAS_WORKSPACE_CONFIG', None)\n"
        "from scout_core.replay.scope import check_cublas_workspace\n"
        "assert check_cublas_workspace(uses_cuda=True, deterministic=True) is None\n"
        "assert os.environ['CUBLAS_WORKSPACE_CONFIG'] == ':4096:8'\n"
        "os.environ.pop('CUBLAS_WORKSPACE_CONFIG')\n"
        "torch.ones(1, device='cuda')\n"
        "msg = check_cublas_workspace(uses_cuda=True, deterministic=True)\n"
        "assert msg and 'CUBLAS_WORKSPACE_CONFIG' in msg, msg\n"
        "print('ok')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "CUBLAS_WORKSPACE_CONFIG"}
    proc = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
