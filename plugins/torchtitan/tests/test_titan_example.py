"""The TorchTitan example runs under torchrun on 6 local CPU ranks (dp_replicate 3 x TP 2)
and prints a localized verdict."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from scout_core.testing import check_documented_launch

pytestmark = pytest.mark.distributed

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "torchtitan" / "train.py"


def _run(tmp_path: Path, inject: str, steps: int, timeout_s: float = 280) -> str:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "6",
        str(EXAMPLE),
        "--inject",
        inject,
        "--steps",
        str(steps),
        "--report-dir",
        str(tmp_path / "report"),
    ]
    # start_new_session + killpg on timeout: no rank outlives the test
    proc = subprocess.Popen(
        cmd,
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, err = proc.communicate()
        pytest.fail(f"the example ran past {timeout_s} s:\n{out[-3000:]}{err[-3000:]}")
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    return out


def _verdicts(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("SCOUT verdict:")]


# Slow: 6 fresh ranks each import TorchTitan (7.5 CPU-s) under torchrun, about 75 s on
# 2 cores. The slow shards run it, with this example's documented launches (the
# five-launch tests); DeepSpeed's example SDC runs in every CI.
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_example_localizes_an_injected_sdc(tmp_path: Path) -> None:
    out = _run(tmp_path, "sdc:rank=2,step=2", steps=4)
    verdicts = _verdicts(out)
    assert verdicts, out
    assert verdicts[0].startswith("SCOUT verdict: step 2 sdc on rank 2 (rank, "), verdicts
    assert all(" sdc on rank 2 (rank, " in line for line in verdicts), verdicts
    assert list((tmp_path / "report").glob("*/rank-0.jsonl"))  # <report_dir>/<run>/


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_example_localizes_a_straggler(tmp_path: Path) -> None:
    out = _run(tmp_path, "straggler:rank=3,step=2", steps=7)
    verdicts = _verdicts(out)
    assert verdicts, out
    assert all(" straggler on rank 3 (rank, " in line for line in verdicts), verdicts


@pytest.mark.slow
@pytest.mark.timeout(800)
@pytest.mark.parametrize("run", [1, 2, 3, 4, 5], ids=lambda run: f"run{run}of5")
@pytest.mark.parametrize("launch", [0, 1], ids=["torchrun", "torch.distributed.run"])
def test_each_documented_launch_localizes_its_fault_five_times_of_five(
    tmp_path: Path, launch: int, run: int
) -> None:
    # The header's two commands as a user types them: the injected fault is named on
    # the documented rank, and nothing else, in each of five runs on this machine.
    # Each run is its own test (run1of5 .. run5of5), so the slow shards deal them apart.
    check_documented_launch(EXAMPLE, launch, runs=1, cwd=tmp_path, timeout_s=700)
