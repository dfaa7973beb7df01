"""The checkpoint gate end to end on Gloo: real models, real AdamW, real C3, real DCP.

The rank bodies also serve :mod:`test_checkpoint_durable` (helpers at module level).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from scout_core.testing.harness import run_ranks

pytestmark = pytest.mark.distributed


# -- helpers shared with test_checkpoint_durable ----------------------------------------


def tiny_model(seed: int = 0) -> Any:
    """Two 'hidden layers' plus a head: small enough for 8 CPU ranks."""
    import torch

    class TinyNet(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList([torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)])
            self.head = torch.nn.Linear(4, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                x = layer(x).tanh()
            return self.head(x)

    torch.manual_seed(seed)
    return TinyNet()


def train_step(model: Any, opt: Any, step: int) -> None:
    """One replicated step: every rank draws the same batch from its (equal) CPU RNG."""
    import torch

    x = torch.randn(5, 4)
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()


def digest(t: Any) -> str:
    import torch
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        t = t.to_local()
    t = t.detach().contiguous().cpu()
    h = hashlib.sha256(str((t.dtype, tuple(t.shape))).encode())
    h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def fingerprint(model: Any, opt: Any, extra: dict[str, Any] | None = None) -> dict[str, str]:
    """sha256 of every tensor a bitwise restore must reproduce, by name."""
    import torch

    out = {f"model/{k}": digest(v) for k, v in model.state_dict().items()}
    for pid, state in opt.state_dict()["state"].items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                out[f"optim/{pid}/{key}"] = digest(value)
    out["rng/cpu"] = digest(torch.get_rng_state())
    if torch.cuda.is_available():
        out["rng/cuda"] = digest(torch.cuda.get_rng_state())
    for key, value in (extra or {}).items():
        out[f"extra/{key}"] = digest(value) if isinstance(value, torch.Tensor) else repr(value)
    return out


def job_group() -> tuple[Any, list[int]]:
    import torch.distributed as dist

    from scout_core.topology.groups import diagnostic_group

    ranks = list(range(dist.get_world_size()))
    return diagnostic_group(ranks), ranks


def layer_outcome(model: Any, index: int, group: Any, ranks: list[int]) -> tuple[Any, list[int]]:
    """Exact C3 on the signature of one hidden layer's parameters (the 'recipe')."""
    from scout_core.decision.c3 import Surface, exchange
    from scout_core.decision.gate import Outcome
    from scout_core.decision.signature import signature_many
    from scout_core.vocabulary import Mode, Status

    sig = signature_many(p.detach() for p in model.layers[index].parameters())
    result = exchange(
        [Surface(f"layer/layers.{index}/params", Mode.EXACT, sig)], group=group, ranks=ranks
    )[f"layer/layers.{index}/params"]
    outcome = {
        Status.AGREE: Outcome.CLEAN,
        Status.ATTRIBUTED: Outcome.SDC,
        Status.INCONCLUSIVE: Outcome.INCONCLUSIVE,
    }[result.status]
    return outcome, list(result.outliers)


def coordinator(model: Any, opt: Any, k: int, **kw: Any) -> Any:
    from scout_core.checkpoint import CheckpointCoordinator, default_rng_streams
    from scout_core.records.evidence import EvidenceWriter

    group, ranks = job_group()
    import torch.distributed as dist

    writer = None
    if kw.get("report_dir"):
        writer = EvidenceWriter(kw.pop("report_dir"), dist.get_rank(), run_id="gate-test")
    kw.pop("report_dir", None)
    return CheckpointCoordinator(
        model,
        [opt],
        rng_streams=default_rng_streams(),
        catalog_size=k,
        group=group,
        ranks=ranks,
        run_id="gate-test",
        writer=writer,
        **kw,
    )


# -- the paper's two-recipe scenario ---------------------------------------------------------


def two_recipe_rank(report_dir: str, ckpt_dir: str) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from scout_core.decision.gate import Action
    from scout_core.vocabulary import Failure

    torch.set_num_threads(1)
    model = tiny_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    coord = coordinator(model, opt, 2, report_dir=report_dir, checkpoint_dir=ckpt_dir)
    extra = {"step": 0, "cursor": torch.tensor([0])}
    refs: dict[int, dict[str, str]] = {}
    trace = []
    for step in range(1, 6):
        train_step(model, opt, step)
        extra["step"] = step
        extra["cursor"] += 1
        if step == 5 and dist.get_rank() == 3:
            with torch.no_grad():  # persistent SDC in layer 0 on rank 3
                model.layers[0].weight[0, 0] += 0.5
        recipe = (step - 1) % 2  # two recipes, checked alternately
        outcome, outliers = layer_outcome(model, recipe, coord.group, coord.ranks)
        result = coord.on_boundary(step, outcome, recipe, extra=extra)
        refs[step] = fingerprint(model, opt, extra)
        trace.append(
            {
                "step": step,
                "outcome": outcome.value,
                "outliers": outliers,
                "action": result.decision.action.value,
                "latest": coord.gate.latest,
                "candidate": coord.gate.candidate,
                "verified": coord.gate.verified,
                "selected": None if result.retrieval is None else result.retrieval.step,
            }
        )
        if result.decision.action is Action.RETRIEVE:
            break
    on_disk_before = sorted(p.name for p in Path(ckpt_dir).iterdir())
    restored = coord.recover(Failure.SDC, step=5, extra=extra)
    on_disk_after = sorted(p.name for p in Path(ckpt_dir).iterdir())
    coord.writer.close()
    return {
        "trace": trace,
        "restored": [restored.step, restored.role, restored.source],
        "bitwise_step2": fingerprint(model, opt, extra) == refs[2],
        "extra_step": extra["step"],
        "disk_before": on_disk_before,
        "disk_after": on_disk_after,
    }


@pytest.mark.timeout(240)
def test_two_recipe_scenario_on_8_ranks(tmp_path: Path) -> None:
    from scout_core.records.evidence import load_report

    report, ckpt = tmp_path / "report", tmp_path / "ckpt"
    results = run_ranks(two_recipe_rank, 8, args=(str(report), str(ckpt)), timeout_s=200)
    for r in results:
        trace = r["trace"]
        assert [t["action"] for t in trace] == [
            "capture",
            "rotate",
            "capture",
            "rotate",
            "retrieve",
        ]
        # step 2 becomes the candidate; promoted after the clean check at step 4
        assert (trace[1]["candidate"], trace[1]["verified"]) == (2, None)
        assert (trace[3]["candidate"], trace[3]["verified"]) == (4, 2)
        assert trace[4]["outcome"] == "sdc" and trace[4]["outliers"] == [3]
        assert trace[4]["selected"] == 2
        assert r["restored"] == [2, "verified", "memory"]
        assert r["bitwise_step2"] and r["extra_step"] == 2
        assert r["disk_before"] == ["step-00000002", "step-00000004"]
        assert r["disk_after"] == ["step-00000002"]  # the contaminated candidate is gone
    # The SDC is only in rank 3's group verdict; the job-wide combine made all ranks retrieve.
    assert results[3]["trace"][4]["outcome"] == "sdc"
    records = load_report(report).checkpoints()
    actions = [(rec.action, rec.checkpoint_step) for rec in records]
    # Records follow the gate's state changes; a routine capture (latest only) writes none.
    assert actions == [
        ("candidate", 2),
        ("promote", 2),
        ("candidate", 4),
        ("retrieve", 2),
        ("retrieve", 2),
    ]
    assert all(rec.selected == "verified" for rec in records if rec.action == "retrieve")
    manifest = json.loads((ckpt / "step-00000002" / "manifest.json").read_text())
    assert (manifest["role"], manifest["step"], manifest["run_id"]) == ("verified", 2, "gate-test")


# -- straggler, hang, peer replication ---------------------------------------------------


def retrieval_rank(sweep_sdc_rank: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from scout_core.decision.gate import Outcome
    from scout_core.vocabulary import Failure

    torch.set_num_threads(1)
    model = tiny_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sweep_calls = []

    def sweep() -> Outcome:
        sweep_calls.append(1)
        bad = dist.get_rank() == sweep_sdc_rank
        return Outcome.SDC if bad else Outcome.CLEAN

    coord = coordinator(model, opt, 1, sweep=sweep, peer_replication=True)
    refs = {}
    for step in range(1, 4):  # K = 1: verified 2, candidate/latest 3
        train_step(model, opt, step)
        coord.on_boundary(step, Outcome.CLEAN, 0)
        refs[step] = fingerprint(model, opt)
    out: dict[str, Any] = {}
    train_step(model, opt, 4)  # not a boundary: state moves past latest
    got = coord.recover(Failure.STRAGGLER)
    out["straggler"] = [got.step, got.role, got.source, fingerprint(model, opt) == refs[3]]
    train_step(model, opt, 4)
    got = coord.recover(Failure.HANG)
    out["hang"] = [got.step, got.role, got.source, len(sweep_calls)]
    out["hang_bitwise"] = fingerprint(model, opt) == refs[got.step]
    # A rank that lost its in-memory copy gets its verified shard back from its peer.
    if dist.get_rank() == 1:
        coord.memory.verified = None
        coord.memory.latest = None
    got = coord.recover(Failure.SDC)
    out["peer"] = [got.step, got.role, got.source, fingerprint(model, opt) == refs[2]]
    return out


@pytest.mark.timeout(180)
def test_straggler_selects_latest_and_hang_follows_the_sweep() -> None:
    clean = run_ranks(retrieval_rank, 3, args=(-1,), timeout_s=150)
    for r in clean:
        assert r["straggler"] == [3, "latest", "memory", True]
        assert r["hang"][:3] == [3, "latest", "memory"] and r["hang"][3] == 1
        assert r["hang_bitwise"]
    assert [r["peer"][2] for r in clean] == ["memory", "peer", "memory"]
    assert all(r["peer"][0] == 2 and r["peer"][1] == "verified" and r["peer"][3] for r in clean)
    # One rank's sweep shows SDC: every rank restores verified, not latest.
    dirty = run_ranks(retrieval_rank, 3, args=(2,), timeout_s=150)
    for r in dirty:
        assert r["hang"][:3] == [2, "verified", "memory"]
        assert r["hang_bitwise"]


def disagree_rank() -> str:
    import torch

    from scout_core.decision.gate import Outcome
    from scout_core.errors import ProtocolError

    model = tiny_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    coord = coordinator(model, opt, 2)
    rank = int(os.environ["RANK"])
    try:
        # Rank 0 thinks it is at another step of the cycle: never guessed, always raised.
        coord.on_boundary(1, Outcome.CLEAN, 0 if rank else 1)
    except ProtocolError as exc:
        return str(exc)
    return "no error"


@pytest.mark.timeout(120)
def test_disagreeing_ranks_raise_on_every_rank() -> None:
    results = run_ranks(disagree_rank, 3, timeout_s=100)
    assert all("different recipes" in r for r in results), results
