"""Restore is atomic across ranks, even from a tampered generation (issue 16, finding 5).

The finding: a shard tampered with *and its checksums rewritten to match* let rank 0
restore step 11 while rank 1 failed to allocate, and metadata paths could point
outside the checkpoint directory (one read ``/etc/hostname``). Each variant below
tampers with rank 1's shard of the verified generation, or with the manifest every
rank reads, rewrites every sha256 so the checksums match again, and restores on 3
ranks: every rank must refuse with a CheckpointError, within the timeout (no rank is
left in a collective), and no rank may have changed anything (every rank's model,
optimizer, RNG and caller state are bitwise what they were before the attempt).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from test_checkpoint_durable import save_run
from test_checkpoint_gate import fingerprint, tiny_model

from scout_core.testing.harness import run_ranks

pytestmark = pytest.mark.distributed

GEN = "step-00000002"  # the verified generation save_run leaves behind


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _reseal(gen: Path) -> None:
    """Rewrite every checksum of the generation so that it matches the files again."""
    manifest = json.loads((gen / "manifest.json").read_text())
    for shard in sorted(gen.glob("rank-*")):
        desc = json.loads((shard / "shard.json").read_text())
        desc["files"] = {name: _sha(shard / name) for name in desc["files"]}
        (shard / "shard.json").write_text(json.dumps(desc))
        manifest["shards"][str(int(shard.name.split("-")[1]))] = _sha(shard / "shard.json")
    (gen / "manifest.json").write_text(json.dumps(manifest))


def _edit(path: Path, change: Any) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _square_weight(skeleton: Any) -> dict[str, Any]:
    """The skeleton node of the first 4x4 tensor (a layer weight)."""
    stack = [skeleton]
    while stack:
        node = stack.pop()
        if "T" in node and node["shape"] == [4, 4]:
            return node  # type: ignore[no-any-return]  # JSON
        if "d" in node:
            stack.extend(v for _, v in node["d"])
        for key in ("l", "t"):
            stack.extend(node.get(key, []))
    raise AssertionError("no 4x4 tensor in the skeleton")


def tamper(gen: Path, variant: str) -> None:
    shard = gen / "rank-00001"
    data = next(shard.glob("*.distcp"))
    if variant == "huge-shape":
        # A forged shape with every size field and checksum made consistent: the
        # allocation that failed on one rank in the finding.
        huge = [1 << 20, 1 << 20]
        desc = json.loads((shard / "shard.json").read_text())
        node = _square_weight(desc["skeleton"])
        node["shape"] = huge
        desc["nbytes"] += 4 * ((1 << 40) - 16)
        (shard / "shard.json").write_text(json.dumps(desc))
        key = node["T"]

        def grow(md: dict[str, Any]) -> None:
            md["tensors"][key]["size"] = huge
            md["tensors"][key]["chunks"] = [{"offsets": [0, 0], "sizes": huge}]

        _edit(shard / ".metadata.json", grow)
        _edit(gen / "manifest.json", lambda m: m["nbytes"].__setitem__("1", desc["nbytes"]))
    elif variant == "path-outside":

        def escape(md: dict[str, Any]) -> None:
            md["storage"][0]["path"] = "../" * 20 + "etc/hostname"

        _edit(shard / ".metadata.json", escape)
    elif variant == "listed-outside":
        outside = "../" * 20 + "etc/hostname"
        _edit(shard / "shard.json", lambda d: d["files"].__setitem__(outside, ""))
        _edit(shard / ".metadata.json", lambda md: md["storage"][0].__setitem__("path", "x"))
    elif variant == "symlink-outside":
        data.unlink()
        data.symlink_to("/etc/hostname")
    elif variant == "garbage-data":
        # Passes every check on rank 1 and fails only when rank 1 reads it: rank 0 and
        # rank 2 read theirs fine, and must still apply nothing.
        data.write_bytes(os.urandom(data.stat().st_size))
    elif variant == "other-model":
        # A consistent shard of another model on rank 1 only: reads fine, cannot apply.
        desc_path = shard / "shard.json"
        desc_path.write_text(desc_path.read_text().replace('"layers.1.bias"', '"layers.9.bias"'))
    elif variant == "manifest-infinity":
        text = (gen / "manifest.json").read_text()
        (gen / "manifest.json").write_text(text.replace('"step": 2', '"step": Infinity'))
    elif variant == "manifest-types":
        _edit(gen / "manifest.json", lambda m: m.update(step="2", world_size=True))
    elif variant == "manifest-deep":
        (gen / "manifest.json").write_text('{"format": ' + "[" * 100_000 + "]" * 100_000 + "}")
    elif variant == "skeleton-deep":
        deep: dict[str, Any] = {"v": 1}
        for _ in range(200):
            deep = {"l": [deep]}
        _edit(shard / "shard.json", lambda d: d.update(skeleton=deep))
    else:
        raise AssertionError(variant)
    if not variant.startswith("manifest-"):
        _reseal(gen)


def restore_variants(root: str, variants: list[str]) -> dict[str, Any]:
    import torch

    from scout_core.checkpoint import restore_from_disk
    from scout_core.errors import CheckpointError

    torch.set_num_threads(1)
    out: dict[str, Any] = {}
    for variant in variants:
        torch.manual_seed(99)
        model = tiny_model(3)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        before = fingerprint(model, opt)
        try:
            got = restore_from_disk(Path(root, variant), model, opt, role="verified")
            outcome = f"ok step {got.step}"
        except CheckpointError as exc:
            outcome = f"CheckpointError: {exc}"
        out[variant] = {"outcome": outcome, "untouched": fingerprint(model, opt) == before}
    return out


VARIANTS = {
    "huge-shape": "tensor bytes",
    "path-outside": "not a plain file name",
    "listed-outside": "not a plain file name",
    "symlink-outside": "points outside",
    "garbage-data": "reading generation step 2",
    "other-model": "does not fit the live training state",
    "manifest-infinity": "Infinity is not a value",
    "manifest-types": "step must be an integer",
    "manifest-deep": "nested too deeply",
    "skeleton-deep": "nested deeper than 64",
}


@pytest.mark.timeout(400)
def test_tampered_generations_are_refused_on_every_rank_and_nothing_is_applied(
    tmp_path: Path,
) -> None:
    ckpt, refs = tmp_path / "ckpt", tmp_path / "refs"
    refs.mkdir()
    run_ranks(save_run, 3, args=("replicated", str(ckpt), str(refs), -1, -1), timeout_s=150)
    variants = tmp_path / "variants"
    shutil.copytree(ckpt, variants / "intact")
    for name in VARIANTS:
        shutil.copytree(ckpt, variants / name)
        shutil.rmtree(variants / name / "step-00000003")  # only the verified one is left
        tamper(variants / name / GEN, name)
    names = ["intact", *VARIANTS]
    results = run_ranks(restore_variants, 3, args=(str(variants), names), timeout_s=300)
    for rank, r in enumerate(results):
        assert r["intact"] == {"outcome": "ok step 2", "untouched": False}
        for name, needle in VARIANTS.items():
            got = r[name]
            assert got["outcome"].startswith("CheckpointError"), (rank, name, got)
            assert got["untouched"], (rank, name, "a rank applied part of a refused restore")
            local = not name.startswith("manifest-")
            if rank == 1 or not local or name in {"garbage-data", "other-model"}:
                assert needle in got["outcome"], (rank, name, got["outcome"])
