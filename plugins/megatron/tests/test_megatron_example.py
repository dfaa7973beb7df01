"""examples/megatron/train.py runs under torchrun on 6 CPU ranks (DP3 x TP2) and prints a
localized verdict for each kind of injected fault."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from scout_core.testing import check_documented_launch

pytestmark = pytest.mark.distributed

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "megatron" / "train.py"


def _run(tmp_path: Path, inject: str, steps: int) -> list[str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    env.pop("SCOUT_CONFIG", None)
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
    proc = subprocess.run(
        cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=420, check=False
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.rstrip().endswith("done"), proc.stdout[-2000:]
    # evidence files: written by the ranks of the group that reached a verdict (not always 0)
    assert sorted((tmp_path / "report").glob("*/rank-*.jsonl")), "no evidence written"
    return [line for line in proc.stdout.splitlines() if line.startswith("SCOUT verdict:")]


# Slow: fresh ranks import Megatron-Core under torchrun, about 45 s on 2 cores. The
# slow shards run it, with this example's documented launches (the five-launch tests);
# DeepSpeed's example SDC runs in every CI.
@pytest.mark.slow
@pytest.mark.timeout(480)
def test_example_localizes_an_injected_sdc(tmp_path: Path) -> None:
    # A rank and step the docs do not use (they show rank 4 at step 3): TP position 1.
    verdicts = _run(tmp_path, "sdc:rank=1,step=4", steps=7)
    assert verdicts, "no verdict printed"
    assert verdicts[0].startswith("SCOUT verdict: step 4 sdc on rank 1 (rank, surface layer/")
    assert all(" sdc on rank 1 (rank, " in line for line in verdicts), verdicts
    assert all(line.endswith("peers [1, 3, 5])") for line in verdicts), verdicts


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_example_localizes_a_straggler(tmp_path: Path) -> None:
    verdicts = _run(tmp_path, "straggler:rank=4,step=3", steps=9)  # the docs: rank 3, step 4
    assert verdicts, "no verdict printed"
    assert all(" straggler on rank 4 (rank, " in line for line in verdicts), verdicts


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_example_localizes_a_hang(tmp_path: Path) -> None:
    verdicts = _run(tmp_path, "hang:rank=0,step=3", steps=6)  # the docs: rank 3, step 4
    assert len(verdicts) == 1, verdicts
    # the frozen rank is idle; its TP partner (1) waits for it in their all-reduce
    assert verdicts[0].startswith("SCOUT verdict: step 3 hang on rank ")
    assert verdicts[0].endswith("rank 0 idle)") and "rank 0" in verdicts[0], verdicts


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
