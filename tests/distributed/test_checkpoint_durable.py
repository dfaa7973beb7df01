"""Durable gate checkpoints: fresh-process bitwise restore, kill -9 mid-persist, corruption."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest
from test_checkpoint_gate import coordinator, fingerprint, tiny_model, train_step

from scout_core.testing.harness import RankFailedError, run_ranks

pytestmark = pytest.mark.distributed


def wrap(model: Any, kind: str) -> Any:
    """Plain replicated model, FSDP2 on a 1-D CPU mesh, or HSDP on a 2x2 CPU mesh."""
    if kind == "replicated":
        return model
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    world = dist.get_world_size()
    if kind == "fsdp2":
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("shard",))
    else:
        mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard"))
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def next_draw() -> list[float]:
    """What the CPU RNG would draw next, without advancing it."""
    import torch

    g = torch.Generator()
    g.set_state(torch.get_rng_state())
    return torch.rand(4, generator=g).tolist()


def save_run(kind: str, ckpt: str, refs: str, die_at: int, victim: int) -> None:
    """K = 1: every clean boundary closes a cycle. Verified after step 3 is step 2."""
    import torch
    import torch.distributed as dist

    from scout_core.checkpoint import durable
    from scout_core.decision.gate import Outcome

    torch.set_num_threads(1)
    rank = dist.get_rank()
    if rank == victim:
        real = durable.write_json

        def dying(path: Path, data: Any) -> None:
            if path.name == "shard.json" and data.get("step") == die_at:
                # Mid-persist: DCP data written, half of it torn, description not yet.
                data_file = next(path.parent.glob("*.distcp"))
                blob = data_file.read_bytes()
                data_file.write_bytes(blob[: len(blob) // 2])
                os.kill(os.getpid(), signal.SIGKILL)
            real(path, data)

        durable.write_json = dying
    model = wrap(tiny_model(0), kind)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    coord = coordinator(model, opt, 1, checkpoint_dir=ckpt)
    extra = {"step": 0, "cursor": torch.tensor([0, 0])}
    for step in range(1, 4):
        train_step(model, opt, step)
        extra["step"] = step
        extra["cursor"] += step
        coord.on_boundary(step, Outcome.CLEAN, 0, extra=extra)
        if step == 2:
            ref = {"fp": fingerprint(model, opt, extra), "draw": next_draw()}
            Path(refs, f"rank-{rank}.json").write_text(json.dumps(ref))


def fresh_restore(kind: str, ckpt: str, refs: str, role: str | None) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from scout_core.checkpoint import restore_from_disk

    torch.set_num_threads(1)
    torch.manual_seed(1234)  # a different RNG state than the saved one
    model = wrap(tiny_model(7), kind)  # different weights
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    extra: dict[str, Any] = {"step": -1, "cursor": torch.tensor([9, 9])}
    ref = json.loads(Path(refs, f"rank-{dist.get_rank()}.json").read_text())
    differs_before = fingerprint(model, opt, extra) != ref["fp"]
    got = restore_from_disk(ckpt, model, opt, extra=extra, role=role)
    # After the restore, one more step must run (optimizer state is usable).
    same = fingerprint(model, opt, extra) == ref["fp"]
    draw = next_draw() == ref["draw"]
    train_step(model, opt, 3)
    return {
        "step": got.step,
        "role": got.role,
        "differs_before": differs_before,
        "bitwise": same,
        "draw": draw,
        "extra_step": extra["step"],
    }


@pytest.mark.timeout(240)
@pytest.mark.parametrize("kind", ["replicated", "fsdp2", "hsdp"])
def test_fresh_processes_restore_bitwise(tmp_path: Path, kind: str) -> None:
    ckpt, refs = tmp_path / "ckpt", tmp_path / "refs"
    refs.mkdir()
    run_ranks(save_run, 4, args=(kind, str(ckpt), str(refs), -1, -1), timeout_s=150)
    assert sorted(p.name for p in ckpt.iterdir()) == ["step-00000002", "step-00000003"]
    results = run_ranks(
        fresh_restore, 4, args=(kind, str(ckpt), str(refs), "verified"), timeout_s=150
    )
    for r in results:
        assert r["differs_before"], "the test must start from a different state"
        assert (r["step"], r["role"]) == (2, "verified")
        assert r["bitwise"] and r["draw"] and r["extra_step"] == 2


@pytest.mark.timeout(240)
def test_kill_9_mid_persist_keeps_previous_verified(tmp_path: Path) -> None:
    ckpt, refs = tmp_path / "ckpt", tmp_path / "refs"
    refs.mkdir()
    with pytest.raises(RankFailedError, match="rank 2"):
        run_ranks(save_run, 4, args=("replicated", str(ckpt), str(refs), 3, 2), timeout_s=150)
    names = sorted(p.name for p in ckpt.iterdir())
    assert ".tmp-step-00000003" in names and "step-00000003" not in names
    assert (ckpt / ".tmp-step-00000003" / "rank-00002").is_dir()  # the torn shard is there
    for role in ("verified", None):  # None: newest of any role; still never the partial one
        results = run_ranks(
            fresh_restore, 4, args=("replicated", str(ckpt), str(refs), role), timeout_s=150
        )
        for r in results:
            assert (r["step"], r["role"], r["bitwise"], r["draw"]) == (2, "verified", True, True)


def load_variants(root: str) -> dict[str, str]:
    import torch

    from scout_core.checkpoint import restore_from_disk
    from scout_core.errors import CheckpointError

    out = {}
    for variant in sorted(os.listdir(root)):
        model = tiny_model(3)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        try:
            got = restore_from_disk(Path(root, variant), model, opt, role="verified")
            out[variant] = f"ok step {got.step}"
        except CheckpointError as exc:
            out[variant] = f"CheckpointError: {exc}"
    return out


def corrupt(gen: Path, variant: str) -> None:
    shard = gen / "rank-00001"
    if variant == "manifest-truncated":
        text = (gen / "manifest.json").read_text()
        (gen / "manifest.json").write_text(text[: len(text) // 2])
    elif variant == "manifest-missing":
        (gen / "manifest.json").unlink()
    elif variant == "data-bitflip":
        data = next(shard.glob("*.distcp"))
        blob = bytearray(data.read_bytes())
        blob[len(blob) // 2] ^= 0x01
        data.write_bytes(bytes(blob))
    elif variant == "data-truncated":
        data = next(shard.glob("*.distcp"))
        data.write_bytes(data.read_bytes()[:-8])
    elif variant == "shard-truncated":
        text = (shard / "shard.json").read_text()
        (shard / "shard.json").write_text(text[:-20])
    elif variant == "metadata-edited":
        meta = shard / ".metadata.json"
        meta.write_text(meta.read_text().replace('"length": ', '"length": 1'))


@pytest.mark.timeout(240)
def test_corrupt_or_truncated_generations_are_refused(tmp_path: Path) -> None:
    ckpt, refs = tmp_path / "ckpt", tmp_path / "refs"
    refs.mkdir()
    run_ranks(save_run, 3, args=("replicated", str(ckpt), str(refs), -1, -1), timeout_s=150)
    variants = tmp_path / "variants"
    names = [
        "intact",
        "manifest-truncated",
        "manifest-missing",
        "data-bitflip",
        "data-truncated",
        "shard-truncated",
        "metadata-edited",
    ]
    for name in names:
        shutil.copytree(ckpt, variants / name)
        corrupt(variants / name / "step-00000002", name)
    results = run_ranks(load_variants, 3, args=(str(variants),), timeout_s=200)
    expected = {
        "manifest-truncated": "corrupt or truncated",
        "manifest-missing": "manifest",
        "data-bitflip": "sha256 mismatch",
        "data-truncated": "sha256 mismatch",
        "shard-truncated": "does not match its manifest checksum",
        "metadata-edited": "sha256 mismatch",
    }
    for rank, r in enumerate(results):
        assert r["intact"] == "ok step 2"
        for name, needle in expected.items():
            assert r[name].startswith("CheckpointError"), (rank, name, r[name])
            shard_local = name.startswith(("data", "shard", "metadata"))
            if rank == 1 or not shard_local:
                assert needle in r[name], (rank, name, r[name])
            else:  # only rank 1's shard is damaged; its peers refuse too
                assert "no usable verified generation" in r[name], (rank, name, r[name])
