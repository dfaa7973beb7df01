"""The checkpoint gate wired to real replay by ``scout.enable``: the dense scenario.

TinyLM has 4 hidden layers, an embedding, an LM head and the optimizer recipe.
Replay runs every step (the hidden recipe rotates, so layer ``k`` is checked at
steps ``k, k+4, ...``; embedding, LM head and optimizer at every step), so the
catalog is ``K = 7`` (``K = 6`` under pure FSDP, where the optimizer recipe cannot
run) and every cycle closes when layer 3 is checked: steps 3, 7, 11.

Scenario: two clean cycles (candidate 3, then verified 3 / candidate 7). From step
10 one rank's ``layers.1`` computes wrong outputs (a persistent SDC: the lowest
mantissa bit of its first output element flips on every forward, training and
replay alike). Step 10 checks layer 2 and step 11 layer 3, so the gate still
accepts them and step 11, captured *after* the injection, becomes the candidate
while 7 is promoted. Step 12 is clean too; step 13 checks layer 1 and replay
attributes the fault: retrieval selects verified = 7. The contaminated candidate
11 is never promoted, is dropped from memory and disk on every rank, and a fresh
set of processes restores step 7 from disk, bitwise.

Why an output fault and not a parameter one: under pure FSDP every shard peer
gathers the same (corrupted) shard, so a parameter fault reads clean there, and
under DDP a corrupted parameter is also seen by the optimizer recipe at the very
step of the injection (its slice covers the whole tiny model), so no candidate
would be captured after it. A persistent compute fault is attributed (exact
``forward`` surface, SDC) on DDP (4 replica peers), FSDP2 (4 shard peers) and HSDP
3x2 (replica groups of 3). HSDP 2x2 cannot serve: a replica group of 2 only reads
inconclusive, which the gate treats as "not clean" (skip), never as SDC.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from scout_core.testing.harness import run_ranks

pytestmark = pytest.mark.distributed

ENV = {"OMP_NUM_THREADS": "1"}
INJECT = 10  # first step of the persistent fault
WORLD = {"ddp": 4, "fsdp": 4, "hsdp": 6}
VICTIM = {"ddp": 1, "fsdp": 1, "hsdp": 2}  # HSDP 3x2: rank 2 is (d=1, s=0), group {0,2,4}


# -- helpers shared by the rank bodies -------------------------------------------------


def build(setup: str, seed: int) -> tuple[Any, Any]:
    """(model the loop calls, unwrapped TinyLM) for ``ddp``, ``fsdp`` or ``hsdp``."""
    import torch
    import torch.distributed as dist

    from scout_core.testing.models import TinyLM

    torch.manual_seed(seed)
    root = TinyLM()
    if setup == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(root), root
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    world = dist.get_world_size()
    if setup == "fsdp":
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp_shard",))
    else:
        mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp_replicate", "dp_shard"))
    for block in root.layers:
        fully_shard(block, mesh=mesh)
    fully_shard(root, mesh=mesh)
    return root, root


def fingerprint(root: Any, opt: Any, extra: dict[str, Any]) -> dict[str, str]:
    """Signatures of everything a bitwise restore must reproduce (JSON, no pickle)."""
    import torch

    from scout_core.decision.signature import signature

    def sig(t: Any) -> str:
        t = t.to_local() if hasattr(t, "to_local") else t
        return f"{signature(t.detach()):016x}"

    out = {f"model/{k}": sig(v) for k, v in root.state_dict().items()}
    state = opt.state_dict()
    for pid, slots in state["state"].items():
        for key, value in slots.items():
            if isinstance(value, torch.Tensor):
                out[f"optim/{pid}/{key}"] = sig(value)
    hyper = [{k: v for k, v in g.items() if k != "params"} for g in state["param_groups"]]
    out["optim/hyper"] = json.dumps(hyper, sort_keys=True, default=repr)
    out["rng/cpu"] = sig(torch.get_rng_state())
    if torch.cuda.is_available():
        out["rng/cuda"] = sig(torch.cuda.get_rng_state())
    out["extra/step"] = repr(extra["step"])
    out["extra/cursor"] = sig(extra["cursor"])
    return out


def config(tmp: str, **kw: Any) -> Any:
    from scout_core.config import Config

    return Config(
        report_dir=os.path.join(tmp, "report"),
        run_id="dense",
        replay_interval=1,
        embedding_interval=1,
        lm_head_interval=1,
        optimizer_interval=1,
        variants=(1.0,),
        observer=False,
        **kw,
    )


def iteration(wrapped: Any, opt: Any, extra: dict[str, Any], step: int, data: int) -> None:
    """One training iteration of the user's loop, with caller state and an RNG draw."""
    import torch

    from scout_core.testing.models import train_step

    extra["step"] = step
    extra["cursor"] += step + 1
    torch.rand(3)  # e.g. a sampler's shuffle: the CPU RNG moves every iteration
    train_step(wrapped, opt, step, data)


def exact_outliers(round_: Any) -> list[int]:
    return sorted(
        {o for v in round_.results.values() if v.mode.value == "exact" for o in v.outliers}
    )


def gate_state(handle: Any) -> dict[str, Any]:
    gate, mem = handle.coordinator.gate, handle.coordinator.memory
    return {
        "latest": gate.latest,
        "candidate": gate.candidate,
        "verified": gate.verified,
        "mem": [None if s is None else s.step for s in (mem.latest, mem.candidate, mem.verified)],
    }


# -- rank bodies ----------------------------------------------------------------------


def dense_first_run(setup: str, tmp: str) -> dict[str, Any]:
    """Train with the gate until replay finds the fault, recover, save references."""
    import torch
    import torch.distributed as dist

    import scout_core as scout
    from scout_core.testing.injectors import BitFlip, Faults
    from scout_core.vocabulary import Failure

    torch.set_num_threads(1)
    rank = dist.get_rank()
    wrapped, root = build(setup, seed=0)
    opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-2)
    faults = Faults()
    faults.at(rank=VICTIM[setup], steps=range(INJECT, 100)).corrupt_output(
        "layers.1", BitFlip(bit=0)
    )
    faults.attach(wrapped, opt)
    session = scout.enable(wrapped, opt, config=config(tmp, checkpoint_dir=f"{tmp}/ckpt"))
    extra: dict[str, Any] = {"step": -1, "cursor": torch.zeros(2, dtype=torch.int64)}
    handle = session.gate  # scout.enable attaches the gate (Config.gate, on by default)
    assert handle is not None
    handle.set_extra_state(lambda: extra)
    refs: dict[int, dict[str, str]] = {}
    trace: list[dict[str, Any]] = []
    stopped = None
    for step in range(20):
        iteration(wrapped, opt, extra, step, rank)
        refs[step] = fingerprint(root, opt, extra)
        trace.append({"step": step, **gate_state(handle)})
        if handle.pending is not None:
            stopped = step
            break
    pending = handle.pending
    assert pending is not None
    disk_before = sorted(p.name for p in Path(tmp, "ckpt").iterdir())
    got = handle.recover(Failure.SDC)
    restored_ok = fingerprint(root, opt, extra) == refs[got.step]
    Path(tmp, f"refs-{rank}.json").write_text(json.dumps(refs[got.step]))
    after = gate_state(handle)
    resume = session.step
    session.close()
    return {
        "stopped": stopped,
        "trace": trace,
        "pending": [pending.selected.value, pending.step],
        "restored": [got.step, got.role, got.source],
        "bitwise_in_process": restored_ok,
        "after": after,
        "resume": resume,
        "disk_before": disk_before,
        "disk_after": sorted(p.name for p in Path(tmp, "ckpt").iterdir()),
        "fired": sorted({s for _, _, s in faults.fired()}),
    }


def dense_fresh_restore(setup: str, tmp: str) -> dict[str, Any]:
    """A fresh process: different weights and RNG, restore from disk alone, compare."""
    import torch
    import torch.distributed as dist

    from scout_core.checkpoint import restore_from_disk

    torch.set_num_threads(1)
    rank = dist.get_rank()
    wrapped, root = build(setup, seed=99)  # different weights
    torch.manual_seed(4321)  # a different RNG state than the saved one
    opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-2)
    extra: dict[str, Any] = {"step": -1, "cursor": torch.zeros(2, dtype=torch.int64)}
    ref = json.loads(Path(tmp, f"refs-{rank}.json").read_text())
    mine = fingerprint(root, opt, extra)
    differs = {k for k in ref if mine.get(k) != ref[k]}
    got = restore_from_disk(f"{tmp}/ckpt", root, opt, extra=extra)
    now = fingerprint(root, opt, extra)
    mismatched = sorted(k for k in ref if now.get(k) != ref[k])
    iteration(wrapped, opt, extra, int(extra["step"]) + 1, rank)  # training goes on from it
    return {
        "step": got.step,
        "role": got.role,
        "differs_before": sorted(differs),
        "mismatched": mismatched,
        "keys": len(ref),
    }


def retrieval_run(tmp: str) -> dict[str, Any]:
    """DDP 4: hang → full-catalog sweep (clean → latest, SDC → verified); straggler → latest."""
    import torch
    import torch.distributed as dist

    import scout_core as scout
    from scout_core.checkpoint.attach import round_outcome
    from scout_core.testing.injectors import BitFlip, Faults
    from scout_core.vocabulary import Failure

    torch.set_num_threads(1)
    rank = dist.get_rank()
    wrapped, root = build("ddp", seed=0)
    opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-2)
    # From step 10 rank 1's layers.3 is faulty; step 10 checks layer 2 only.
    Faults().at(rank=1, steps=range(INJECT, 100)).corrupt_output("layers.3", BitFlip(bit=0)).attach(
        wrapped, opt
    )
    session = scout.enable(wrapped, opt, config=config(tmp))
    extra: dict[str, Any] = {"step": -1, "cursor": torch.zeros(2, dtype=torch.int64)}
    handle = session.gate  # scout.enable attaches the gate (Config.gate, on by default)
    assert handle is not None
    handle.set_extra_state(lambda: extra)
    refs: dict[int, dict[str, str]] = {}
    for step in range(INJECT):
        iteration(wrapped, opt, extra, step, rank)
        refs[step] = fingerprint(root, opt, extra)
    out: dict[str, Any] = {"before": gate_state(handle)}

    def outcome(failure: Failure) -> dict[str, Any]:
        got = handle.recover(failure)
        sweep = [
            [r.recipe.name, round_outcome(r).value, exact_outliers(r)] for r in handle.sweep_rounds
        ]
        handle.sweep_rounds = []
        return {
            "restored": [got.step, got.role],
            "bitwise": fingerprint(root, opt, extra) == refs.get(got.step),
            "reason": got.reason,
            "sweep": sweep,
        }

    out["hang_clean"] = outcome(Failure.HANG)
    iteration(wrapped, opt, extra, INJECT, rank)
    refs[INJECT] = fingerprint(root, opt, extra)
    out["at_10"] = gate_state(handle)
    out["straggler"] = outcome(Failure.STRAGGLER)
    out["hang_sdc"] = outcome(Failure.HANG)
    session.close()
    return out


def skip_run(tmp: str) -> dict[str, Any]:
    """DDP 4: rank 2 misses the capture of step 9 (layer 1): not clean, candidate dropped."""
    import torch
    import torch.distributed as dist

    import scout_core as scout
    from scout_core.testing.injectors import Faults

    torch.set_num_threads(1)
    rank = dist.get_rank()
    wrapped, _ = build("ddp", seed=0)
    opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-2)
    Faults().at(rank=2, step=9).skip_capture("layers.1").attach(wrapped, opt)
    session = scout.enable(wrapped, opt, config=config(tmp, checkpoint_dir=f"{tmp}/ckpt"))
    extra: dict[str, Any] = {"step": -1, "cursor": torch.zeros(2, dtype=torch.int64)}
    handle = session.gate
    assert handle is not None
    handle.set_extra_state(lambda: extra)
    trace = []
    for step in range(14):
        iteration(wrapped, opt, extra, step, rank)
        trace.append({"step": step, "action": handle.history[-1].decision.action.value})
        trace[-1].update(gate_state(handle))
        if step == 9:
            disk = sorted(p.name for p in Path(tmp, "ckpt").iterdir())
    session.close()
    return {"trace": trace, "disk_at_9": disk}


# -- tests ----------------------------------------------------------------------------


def _records(tmp: Path) -> list[dict[str, Any]]:
    out = []
    for path in sorted((tmp / "report").glob("*/rank-*.jsonl")):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("schema") == "scout.checkpoint/1":
                out.append(rec)
    return out


def _check_dense(setup: str, tmp: Path) -> None:
    world = WORLD[setup]
    first = run_ranks(dense_first_run, world, args=(setup, str(tmp)), timeout_s=240, env=ENV)
    for r in first:
        assert r["stopped"] == 13, r["trace"]
        assert r["trace"] == first[0]["trace"]  # every rank holds the same gate
        by_step = {t["step"]: t for t in r["trace"]}
        # Two clean cycles: step 3 becomes the candidate, is promoted at step 7.
        assert (by_step[3]["candidate"], by_step[3]["verified"]) == (3, None)
        assert (by_step[7]["candidate"], by_step[7]["verified"]) == (7, 3)
        # Step 11 was captured after the fault (step 10) and became the candidate...
        assert (by_step[11]["candidate"], by_step[11]["verified"]) == (11, 7)
        assert by_step[12]["latest"] == 12
        # ... replay attributes the fault at step 13; the gate selects verified 7.
        assert r["pending"] == ["verified", 7]
        assert r["restored"] == [7, "verified", "memory"]
        assert r["bitwise_in_process"]
        # The contaminated boundaries (10-12) are gone everywhere, memory and disk.
        assert r["after"] == {"latest": 7, "candidate": None, "verified": 7, "mem": [7, None, 7]}
        assert r["disk_before"] == ["step-00000007", "step-00000011"]
        assert r["disk_after"] == ["step-00000007"]
        assert r["resume"] == 8
    assert first[VICTIM[setup]]["fired"][0] == INJECT
    records = _records(tmp)
    promoted = sorted(r["checkpoint_step"] for r in records if r["action"] == "promote")
    assert promoted == [3, 7]  # 11 is never promoted
    candidates = sorted(r["checkpoint_step"] for r in records if r["action"] == "candidate")
    assert candidates == [3, 7, 11]
    retrieves = [
        (r["step"], r["selected"], r["checkpoint_step"], r["failure"])
        for r in records
        if r["action"] == "retrieve"
    ]
    assert retrieves[0] == (13, "verified", 7, "sdc")
    assert retrieves[-1][1:3] == ("verified", 7)
    # Routine captures write no record (evidence grows with state changes, not steps).
    assert not [r for r in records if r["action"] == "capture"]

    fresh = run_ranks(dense_fresh_restore, world, args=(setup, str(tmp)), timeout_s=240, env=ENV)
    for r in fresh:
        assert (r["step"], r["role"]) == (7, "verified")
        assert r["mismatched"] == [], r["mismatched"]
        # The fresh process started elsewhere: weights, Adam state, RNG, caller state.
        assert "rng/cpu" in r["differs_before"] and "extra/cursor" in r["differs_before"]
        assert any(k.startswith("model/") for k in r["differs_before"])
        assert any(k.startswith("optim/") for k in r["differs_before"])
        assert r["keys"] > 20


@pytest.mark.timeout(300)
def test_dense_scenario_ddp(tmp_path: Path) -> None:
    _check_dense("ddp", tmp_path)


@pytest.mark.timeout(300)
def test_dense_scenario_fsdp2(tmp_path: Path) -> None:
    _check_dense("fsdp", tmp_path)


@pytest.mark.slow  # DDP and FSDP2 run in CI; HSDP's gate restores run in test_checkpoint_durable
@pytest.mark.timeout(300)
def test_dense_scenario_hsdp_3x2(tmp_path: Path) -> None:
    _check_dense("hsdp", tmp_path)


@pytest.mark.timeout(300)
def test_hang_sweeps_the_catalog_and_straggler_takes_latest(tmp_path: Path) -> None:
    results = run_ranks(retrieval_run, 4, args=(str(tmp_path),), timeout_s=240, env=ENV)
    for r in results:
        assert r["before"]["latest"] == 9 and r["before"]["verified"] == 3
        # Hang, sweep clean (the fault is not active yet): latest, bitwise.
        assert r["hang_clean"]["restored"] == [9, "latest"] and r["hang_clean"]["bitwise"]
        assert all(s[1] == "clean" for s in r["hang_clean"]["sweep"])
        assert len(r["hang_clean"]["sweep"]) == 7  # the whole catalog ran
        assert r["at_10"]["latest"] == 10
        # Straggler: latest, no sweep (slowness is not corruption).
        assert r["straggler"]["restored"] == [10, "latest"] and r["straggler"]["sweep"] == []
        # Hang with the faulty layer 3: the sweep replays it, attributes rank 1: verified.
        assert r["hang_sdc"]["restored"] == [3, "verified"] and r["hang_sdc"]["bitwise"]
        bad = [s for s in r["hang_sdc"]["sweep"] if s[1] != "clean"]
        assert bad == [["layer/layers.3", "sdc", [1]]]


@pytest.mark.timeout(300)
def test_inconclusive_boundary_skips_and_drops_the_candidate(tmp_path: Path) -> None:
    results = run_ranks(skip_run, 4, args=(str(tmp_path),), timeout_s=240, env=ENV)
    for r in results:
        assert r["trace"] == results[0]["trace"]
        by_step = {t["step"]: t for t in r["trace"]}
        assert (by_step[8]["candidate"], by_step[8]["verified"]) == (7, 3)
        # Step 9: a rank without a capture makes the round inconclusive everywhere.
        assert by_step[9]["action"] == "skip"
        assert (by_step[9]["latest"], by_step[9]["candidate"], by_step[9]["verified"]) == (
            8,
            None,
            3,
        )
        assert by_step[9]["mem"] == [8, None, 3]
        assert r["disk_at_9"] == ["step-00000003"]  # the dropped candidate left the disk
        # The cycle restarts at step 10 and closes at 13 (layers 2, 3, 0 + rest, 1).
        assert [by_step[s]["action"] for s in (10, 11, 12, 13)] == [
            "capture",
            "capture",
            "capture",
            "rotate",
        ]
        assert (by_step[13]["candidate"], by_step[13]["verified"]) == (13, 3)
    drops = [
        r for r in _records(tmp_path) if r["action"] == "candidate" and r["detail"].get("dropped")
    ]
    assert [(d["step"], d["checkpoint_step"], d["detail"]["q"]) for d in drops] == [(9, 7, 0)]
