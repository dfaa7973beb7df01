"""The DeepSpeed example runs under torchrun on 4 local CPU ranks and prints a localized verdict."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from scout_core.testing import check_documented_launch

pytestmark = pytest.mark.distributed

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "deepspeed" / "train.py"


def _run(tmp_path: Path, inject: str, steps: int) -> str:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "4",
        str(EXAMPLE),
        "--inject",
        inject,
        "--steps",
        str(steps),
        "--report-dir",
        str(tmp_path / "report"),
    ]
    proc = subprocess.run(
        cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240, check=False
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.timeout(300)
def test_example_localizes_an_injected_sdc(tmp_path: Path) -> None:
    out = _run(tmp_path, "sdc:rank=2,step=5", steps=8)
    verdicts = [line for line in out.splitlines() if line.startswith("SCOUT verdict:")]
    assert verdicts, out
    assert verdicts[0].startswith("SCOUT verdict: step 5 sdc on rank 2 (rank, ")
    assert all(" sdc on rank 2 (rank, " in line for line in verdicts), verdicts
    assert list((tmp_path / "report").glob("*/rank-0.jsonl"))  # <report_dir>/<run>/


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_example_localizes_a_straggler(tmp_path: Path) -> None:
    out = _run(tmp_path, "straggler:rank=1,step=4", steps=10)
    verdicts = [line for line in out.splitlines() if line.startswith("SCOUT verdict:")]
    assert verdicts, out
    assert all(" straggler on rank 1 (rank, " in line for line in verdicts), verdicts


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_example_localizes_a_hang(tmp_path: Path) -> None:
    out = _run(tmp_path, "hang:rank=1,step=4", steps=7)
    hangs = [
        line for line in out.splitlines() if line.startswith("SCOUT verdict:") and " hang " in line
    ]
    # one hang verdict: the frozen rank, idle, named by the hang observer at the step it
    # never started (its peers wait for it in the step's all-reduce)
    expected = "step 4 hang on rank 1 (rank, surface progress, peers [0, 1, 2, 3]; rank 1 idle)"
    assert hangs == [f"SCOUT verdict: {expected}"], out


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("run", [1, 2, 3, 4, 5], ids=lambda run: f"run{run}of5")
@pytest.mark.parametrize("launch", [0, 1], ids=["torchrun", "deepspeed-launcher"])
def test_each_documented_launch_localizes_its_fault_five_times_of_five(
    tmp_path: Path, launch: int, run: int
) -> None:
    # The header's commands as a user types them (the DeepSpeed launcher gets a free
    # port instead of its fixed 29500): the injected fault is named on the documented
    # rank, and nothing else, in each of five runs on this machine.
    # Each run is its own test (run1of5 .. run5of5), so the slow shards deal them apart.
    check_documented_launch(EXAMPLE, launch, runs=1, cwd=tmp_path, timeout_s=500)
