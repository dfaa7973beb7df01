"""``session.resume()``: the recovery hand-off after a job restart, without a launcher.

DDP on 4 ranks, TinyLM, replay of every recipe every step (``K = 7``: cycles close at
steps 3, 7, 11). A first job trains steps 0..12 with a durable ``checkpoint_dir`` and
is then abandoned, as a job killed by a hang verdict is: verified step 7 and candidate
step 11 are on disk. Its first call of ``session.resume()`` found nothing (``None``).
A fresh set of processes, with other weights and another RNG state, enables SCOUT the
same way and calls ``session.resume()``: it restores step 7 bitwise (model, AdamW
state, CPU RNG, caller state), the gate holds latest = verified = 7 and no candidate,
the uncertified candidate 11 is gone from disk, replay's clock is at step 8, and
training continues: the gate's next cycles close at 11 (new candidate) and 15 (11
promoted), exactly as in a job that never stopped. A session without a
``checkpoint_dir`` refuses to resume, on every rank.

With ``on_sdc = "terminate"`` the same SDC as in ``test_gate_dense.py`` (rank 1's
``layers.1`` from step 10, found at step 13) ends every rank with exit code 87 at that
boundary, after torchelastic's error file naming rank 1; a fresh job then resumes
verified step 7, never the contaminated candidate 11.

The full chain under torchrun (two agents, a real hang, a restart) is
``test_multinode_torchrun.py``; this one runs in seconds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from scout_core.testing.harness import RankFailedError, RankProcess, run_ranks

pytestmark = pytest.mark.distributed

ENV = {"OMP_NUM_THREADS": "1"}
WORLD = 4
ABANDON = 13  # the first job never runs this step


def first_job(tmp: str) -> dict[str, Any]:
    """Train steps 0..ABANDON-1 with a durable gate, keep references, then stop."""
    import torch
    import torch.distributed as dist
    from test_gate_dense import build, config, fingerprint, iteration

    import scout_core as scout

    torch.set_num_threads(1)
    rank = dist.get_rank()
    wrapped, root = build("ddp", seed=0)
    opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-2)
    session = scout.enable(wrapped, opt, config=config(tmp, checkpoint_dir=f"{tmp}/ckpt"))
    extra: dict[str, Any] = {"step": -1, "cursor": torch.zeros(2, dtype=torch.int64)}
    assert session.checkpoints is not None
    session.checkpoints.set_extra_state(lambda: extra)
    first = session.resume()
    refs: dict[int, dict[str, str]] = {}
    for step in range(ABANDON):
        iteration(wrapped, opt, extra, step, rank)
        refs[step] = fingerprint(root, opt, extra)
    Path(tmp, f"refs-{rank}.json").write_text(json.dumps(refs))
    disk = sorted(p.name for p in Path(tmp, "ckpt").iterdir())
    session.close()
    return {"first": first is None, "disk": disk}


def restarted_job(tmp: str) -> dict[str, Any]:
    """A fresh job: other weights and RNG; resume, compare, continue."""
    import torch
    import torch.distributed as dist
    from test_gate_dense import build, config, fingerprint, gate_state, iteration

    import scout_core as scout

    torch.set_num_threads(1)
    rank = dist.get_rank()
    wrapped, root = build("ddp", seed=99)
    torch.manual_seed(4321)
    opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-2)
    session = scout.enable(wrapped, opt, config=config(tmp, checkpoint_dir=f"{tmp}/ckpt"))
    extra: dict[str, Any] = {"step": -1, "cursor": torch.zeros(2, dtype=torch.int64)}
    handle = session.checkpoints
    assert handle is not None
    handle.set_extra_state(lambda: extra)
    got = session.resume()
    assert got is not None
    refs = json.loads(Path(tmp, f"refs-{rank}.json").read_text())
    now = fingerprint(root, opt, extra)
    mismatched = sorted(k for k, v in refs[str(got.step)].items() if now.get(k) != v)
    after = {
        "restored": [got.step, got.role, got.source],
        "mismatched": mismatched,
        "gate": gate_state(handle),
        "replay_step": session.step,
        "extra_step": int(extra["step"]),
        "disk": sorted(p.name for p in Path(tmp, "ckpt").iterdir()),
    }
    trace = []
    for step in range(got.step + 1, 17):
        iteration(wrapped, opt, extra, step, rank)
        trace.append({"step": step, **gate_state(handle)})
    session.close()
    return {**after, "trace": trace}


def sdc_terminate_job(tmp: str) -> None:
    """From step 10 rank 1's ``layers.1`` is faulty; replay finds it at step 13 and,
    with ``on_sdc = "terminate"``, every rank exits there (the test checks the codes)."""
    import torch
    import torch.distributed as dist
    from test_gate_dense import INJECT, build, config, fingerprint, iteration

    import scout_core as scout
    from scout_core.testing import BitFlip, Faults

    torch.set_num_threads(1)
    rank = dist.get_rank()
    wrapped, root = build("ddp", seed=0)
    opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-2)
    faults = Faults().at(rank=1, steps=range(INJECT, 100))
    faults.corrupt_output("layers.1", BitFlip(bit=0)).attach(wrapped, opt)
    cfg = config(tmp, checkpoint_dir=f"{tmp}/ckpt", on_sdc="terminate")

    def decide(record: Any) -> None:  # a launcher's hook: runs before the exit
        if record.outliers:
            seen = {"ranks": list(record.outliers), "hosts": list(record.hosts)}
            Path(tmp, f"verdict-{rank}.json").write_text(json.dumps(seen))

    session = scout.enable(wrapped, opt, config=cfg, callback=decide)
    extra: dict[str, Any] = {"step": -1, "cursor": torch.zeros(2, dtype=torch.int64)}
    assert session.checkpoints is not None
    session.checkpoints.set_extra_state(lambda: extra)
    refs: dict[int, dict[str, str]] = {}
    for step in range(20):
        iteration(wrapped, opt, extra, step, rank)
        refs[step] = fingerprint(root, opt, extra)
        Path(tmp, f"refs-{rank}.json").write_text(json.dumps(refs))
    raise AssertionError("on_sdc = 'terminate' did not end the job")


def no_checkpoint_dir(tmp: str) -> str:
    import torch
    from test_gate_dense import build, config

    import scout_core as scout
    from scout_core.errors import CheckpointError

    wrapped, _ = build("ddp", seed=0)
    opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-2)
    with scout.enable(wrapped, opt, config=config(tmp)) as session:
        try:
            session.resume()
        except CheckpointError as exc:
            return str(exc)
    return "no error"


@pytest.mark.timeout(400)
def test_resume_after_restart_is_bitwise_and_training_continues(tmp_path: Path) -> None:
    first = run_ranks(first_job, WORLD, args=(str(tmp_path),), timeout_s=180, env=ENV)
    assert all(r["first"] for r in first)  # nothing to resume on a first start
    assert first[0]["disk"] == ["step-00000007", "step-00000011"]
    again = run_ranks(restarted_job, WORLD, args=(str(tmp_path),), timeout_s=180, env=ENV)
    for r in again:
        assert r["restored"] == [7, "verified", "disk"]
        assert r["mismatched"] == []
        assert r["gate"] == {"latest": 7, "candidate": None, "verified": 7, "mem": [None] * 3}
        assert (r["replay_step"], r["extra_step"]) == (8, 7)
        assert r["disk"] == ["step-00000007"]  # the uncertified candidate 11 is gone
        by_step = {t["step"]: t for t in r["trace"]}
        assert (by_step[11]["candidate"], by_step[11]["verified"]) == (11, 7)
        assert (by_step[15]["candidate"], by_step[15]["verified"]) == (15, 11)
    assert again[0]["trace"] == again[3]["trace"]


@pytest.mark.timeout(200)
def test_resume_needs_a_checkpoint_dir(tmp_path: Path) -> None:
    errors = run_ranks(no_checkpoint_dir, 2, args=(str(tmp_path),), timeout_s=120, env=ENV)
    assert all("checkpoint_dir" in e for e in errors), errors


@pytest.mark.timeout(400)
def test_sdc_terminates_for_a_restart_on_verified_state(tmp_path: Path) -> None:
    error_file = tmp_path / "error.json"
    procs: list[RankProcess] = []
    with pytest.raises(RankFailedError):
        run_ranks(
            sdc_terminate_job,
            WORLD,
            args=(str(tmp_path),),
            timeout_s=180,
            on_start=procs.extend,
            env={**ENV, "TORCHELASTIC_ERROR_FILE": str(error_file)},
        )
    assert [p.proc.returncode for p in procs] == [87] * WORLD
    message = ProcessFailure(0, procs[0].proc.pid, 87, str(error_file)).message
    assert isinstance(message, dict)
    assert "(on_sdc=terminate, exit code 87)" in message["message"]
    assert "sdc rank 1 at step 13" in message["message"]
    for r in range(WORLD):  # every rank's verdict callback ran before it exited
        seen = json.loads((tmp_path / f"verdict-{r}.json").read_text())
        assert seen["ranks"] == [1] and len(seen["hosts"]) == 1, seen
    refs = json.loads((tmp_path / "refs-0.json").read_text())
    assert max(int(k) for k in refs) == 12  # the job ended inside step 13
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
        "step-00000007",
        "step-00000011",
    ]
    # The restart: a fresh job resumes verified step 7 (not the contaminated 11).
    again = run_ranks(restarted_job, WORLD, args=(str(tmp_path),), timeout_s=180, env=ENV)
    for r in again:
        assert r["restored"] == [7, "verified", "disk"]
        assert r["mismatched"] == []
        assert r["disk"] == ["step-00000007"]
        assert r["trace"][-1]["step"] == 16
