"""Protocol mismatches and group stalls: equal progress, then the fingerprint decides.

* One rank calls a different collective (broadcast vs all_reduce on the same group):
  ``protocol_mismatch`` naming it, and ``on_hang = "terminate"`` ends every trainer
  with the hang exit code after writing torchelastic's error file, which names it.
* One rank calls the same collective with a different shape (on a second group over
  the same ranks, so Gloo blocks instead of aborting on the size mismatch):
  ``protocol_mismatch`` naming it.
* Every observed rank waits in the same collective for a rank outside the observed
  group: ``group_stall``, no culprit.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from observer_scenarios import free_port, scenario
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from scout_core.records.evidence import load_report
from scout_core.testing.harness import RankFailedError, RankProcess, retry_on_port_clash, run_ranks

CULPRIT = 3


@pytest.mark.distributed
@pytest.mark.timeout(150)
def test_different_collective_is_a_protocol_mismatch_and_terminates(tmp_path: Path) -> None:
    report = tmp_path / "report"
    procs: list[RankProcess] = []
    with pytest.raises(RankFailedError):
        retry_on_port_clash(
            lambda: run_ranks(
                scenario,
                5,
                args=("wrong_collective", free_port(), str(report), CULPRIT),
                kwargs={"on_hang": "terminate", "hang_exit_code": 86},
                timeout_s=120,
                on_start=procs.extend,
                env={"TORCHELASTIC_ERROR_FILE": str(tmp_path / "error.json")},
            )
        )
    assert [p.proc.returncode for p in procs] == [86] * 5
    # What torchrun's agent prints as the Root Cause of the failed job.
    root_cause = ProcessFailure(0, procs[0].proc.pid, 86, str(tmp_path / "error.json"))
    assert f"protocol_mismatch rank {CULPRIT} at step" in root_cause.message["message"]
    verdicts = load_report(report).verdicts()
    assert len(verdicts) == 1, [v.to_dict() for v in verdicts]
    v = verdicts[0]
    assert (v.failure.value, v.status.value, list(v.outliers)) == (
        "protocol_mismatch",
        "attributed",
        [CULPRIT],
    )
    assert v.surface == "collective"
    pending = v.detail["pending"]
    assert pending[str(CULPRIT)]["collective"] == "broadcast"
    assert pending[str(CULPRIT)]["root"] == 0
    assert {pending[str(r)]["collective"] for r in range(5) if r != CULPRIT} == {"all_reduce"}


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(150)
def test_different_shape_is_a_protocol_mismatch(tmp_path: Path) -> None:
    report = tmp_path / "report"
    results = retry_on_port_clash(
        lambda: run_ranks(
            scenario,
            4,
            args=("wrong_shape", free_port(), str(report), CULPRIT),
            timeout_s=120,
        )
    )
    verdicts = load_report(report).verdicts()
    assert len(verdicts) == 1, [v.to_dict() for v in verdicts]
    v = verdicts[0]
    assert (v.failure.value, list(v.outliers)) == ("protocol_mismatch", [CULPRIT])
    pending = v.detail["pending"]
    assert {p["collective"] for p in pending.values()} == {"all_reduce"}
    assert len({p["group_hash"] for p in pending.values()}) == 1  # same members
    shapes = {r: p["shape_hash"] for r, p in pending.items()}
    assert len(set(shapes.values())) == 2
    assert shapes[str(CULPRIT)] != shapes["0"]
    assert all("error" in r for r in results)  # the training groups timed out afterwards


@pytest.mark.distributed
@pytest.mark.timeout(150)
def test_peers_waiting_on_an_outside_rank_are_a_group_stall(tmp_path: Path) -> None:
    report = tmp_path / "report"
    results = retry_on_port_clash(
        lambda: run_ranks(
            scenario,
            4,
            args=("group_stall", free_port(), str(report), CULPRIT),
            timeout_s=120,
        )
    )
    verdicts = load_report(report).verdicts()
    assert len(verdicts) == 1, [v.to_dict() for v in verdicts]
    v = verdicts[0]
    assert (v.failure.value, v.status.value) == ("group_stall", "agree")
    assert list(v.outliers) == []
    assert list(v.group) == [0, 1, 2]
    assert v.scope.value == "group"  # three observed ranks of a four-rank job
    assert set(v.detail["stages"].values()) == {"collective"}
    assert all("error" not in r for r in results)  # the outside rank came back in time
