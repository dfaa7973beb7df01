"""In-memory gate checkpoints: capture, generations, bitwise restore, flatten round trip."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import torch

from scout_core.checkpoint.dcp_io import metadata_from_json, metadata_to_json
from scout_core.checkpoint.memory import InMemoryCheckpoints
from scout_core.checkpoint.recovery import default_rng_streams
from scout_core.checkpoint.replicas import _decode, _encode
from scout_core.checkpoint.skeleton import flatten, unflatten
from scout_core.decision.gate import Selection
from scout_core.errors import CheckpointError


def make() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return model, opt


def train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    for _ in range(steps):
        x = torch.randn(3, 4)  # draws from the CPU RNG, so RNG state matters
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def fingerprint(model: torch.nn.Module, opt: torch.optim.Optimizer) -> list[bytes]:
    out = [t.detach().numpy().tobytes() for t in model.state_dict().values()]
    for state in opt.state.values():
        out.extend(v.numpy().tobytes() for v in state.values() if isinstance(v, torch.Tensor))
    out.append(torch.get_rng_state().numpy().tobytes())
    return out


def delay_background_copy(monkeypatch: pytest.MonkeyPatch, first: Callable[[], object]) -> None:
    """Make the gate's background copy thread call ``first`` before it copies."""
    from scout_core.checkpoint import memory

    run = memory._CpuCopy._run

    def delayed(self: memory._CpuCopy) -> None:
        first()
        run(self)

    monkeypatch.setattr(memory._CpuCopy, "_run", delayed)


def test_capture_restore_is_bitwise_and_does_not_alias() -> None:
    model, opt = make()
    train(model, opt, 3)
    mem = InMemoryCheckpoints(model, [opt], default_rng_streams())
    extra = {"step": 3, "cursor": torch.tensor([7, 8]), "note": "epoch-0"}
    snap = mem.capture(3, extra)
    snap.wait()  # parameters and moments are copied on a background thread
    assert snap.ready and snap.blocking_s >= 0 and snap.nbytes() > 0
    before = fingerprint(model, opt)
    train(model, opt, 2)  # diverge: params, AdamW moments, step count, RNG
    extra["cursor"] += 100
    extra["step"] = 5
    assert fingerprint(model, opt) != before
    cursor = extra["cursor"]
    restored = mem.restore(snap, extra)
    assert fingerprint(model, opt) == before
    assert extra["step"] == 3 and extra["cursor"] is cursor and cursor.tolist() == [7, 8]
    assert restored["note"] == "epoch-0"
    # Training from the restore must not write into the snapshot: restore twice.
    train(model, opt, 2)
    mem.restore(snap)
    assert fingerprint(model, opt) == before
    mem.close()


def test_generations_rotate_like_the_gate() -> None:
    model, opt = make()
    mem = InMemoryCheckpoints(model, [opt], default_rng_streams())
    with pytest.raises(CheckpointError):
        mem.rotate()
    s1 = mem.capture(1)
    mem.rotate()
    assert (mem.latest, mem.candidate, mem.verified) == (s1, s1, None)
    s2 = mem.capture(2)
    assert (mem.latest, mem.candidate) == (s2, s1)
    mem.rotate()
    assert (mem.candidate, mem.verified) == (s2, s1)
    assert mem.get(Selection.VERIFIED) is s1 and mem.get(Selection.LATEST) is s2
    assert mem.drop_candidate() is s2 and mem.candidate is None
    mem.close()


def test_restore_refuses_a_different_model() -> None:
    model, opt = make()
    mem = InMemoryCheckpoints(model, [opt], default_rng_streams())
    snap = mem.capture(1)
    other = torch.nn.Linear(4, 2)
    bad = InMemoryCheckpoints(other, [torch.optim.AdamW(other.parameters())], default_rng_streams())
    with pytest.raises(CheckpointError, match="model state does not match"):
        bad.restore(snap)


def test_flatten_round_trip_keeps_types_and_is_json() -> None:
    model, opt = make()
    train(model, opt, 1)
    mem = InMemoryCheckpoints(model, [opt], default_rng_streams())
    snap = mem.capture(1, {"k": (1, 2.5, None), "t": torch.arange(3)})
    snap.wait()  # a reader waits for the background copy, as persist and replication do
    skeleton, tensors = flatten(snap.tree)
    text = json.dumps(skeleton)
    back = unflatten(json.loads(text), tensors)
    assert set(back["optim"][0]["state"]) == set(snap.tree["optim"][0]["state"])  # int keys
    assert back["extra"]["k"] == (1, 2.5, None)
    assert back["optim"][0]["param_groups"][0]["betas"] == opt.param_groups[0]["betas"]
    with pytest.raises(CheckpointError, match="cannot store"):
        flatten({"x": object()})
    # The peer-replication wire format round-trips too, bit for bit.
    header, payload = _encode(1, 5, snap.tree)
    replica = _decode(header, payload)
    assert replica.owner == 5 and replica.step == 1
    _, again = flatten(replica.tree)
    assert all(torch.equal(again[k], tensors[k]) for k in tensors)


def test_dcp_metadata_json_round_trip() -> None:
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        Metadata,
        MetadataIndex,
        TensorProperties,
        TensorStorageMetadata,
    )

    md = Metadata(
        state_dict_metadata={
            "w": TensorStorageMetadata(
                TensorProperties(dtype=torch.bfloat16),
                torch.Size([4, 2]),
                [ChunkStorageMetadata(torch.Size([0, 0]), torch.Size([4, 2]))],
            )
        },
        storage_data={
            MetadataIndex("w", torch.Size([0, 0]), 0): _StorageInfo("__0_0.distcp", 0, 99)
        },
    )
    back = metadata_from_json(json.loads(json.dumps(metadata_to_json(md))), None)  # type: ignore[arg-type]
    assert back.state_dict_metadata == md.state_dict_metadata
    assert back.storage_data == md.storage_data
    with pytest.raises(CheckpointError, match="malformed"):
        metadata_from_json({"tensors": {"w": {}}}, None)  # type: ignore[arg-type]


def _ptrs(snap: object) -> set[int]:
    _, tensors = flatten(snap.tree)  # type: ignore[attr-defined]
    return {t.data_ptr() for t in tensors.values() if t.numel()}


def test_a_released_generation_lends_its_buffers_to_the_next_capture() -> None:
    model, opt = make()
    train(model, opt, 2)
    mem = InMemoryCheckpoints(model, [opt], default_rng_streams())
    first = mem.capture(1)
    params = _ptrs(first)
    train(model, opt, 1)
    second = mem.capture(2)  # the first latest is released: its buffers are reused
    reused = _ptrs(second) & params
    weights = {t.data_ptr() for t in flatten(second.tree)[1].values() if t.numel() > 8}
    assert weights <= reused  # every parameter and moment copied into an old buffer
    after = fingerprint(model, opt)
    train(model, opt, 2)
    mem.restore(second)
    assert fingerprint(model, opt) == after  # the reused buffers hold the new state
    mem.close()


def test_the_gate_never_holds_more_than_three_generations() -> None:
    model, opt = make()
    train(model, opt, 1)
    mem = InMemoryCheckpoints(model, [opt], default_rng_streams())
    state = mem.state_bytes()
    assert state > 0
    peak = 0
    # A gate-like sequence: captures, cycle closes (rotate), a dropped candidate.
    for step in range(12):
        train(model, opt, 1)
        rotating = step % 3 == 2
        mem.capture(step, rotating=rotating)
        if rotating:
            mem.rotate()
        if step == 7:
            mem.drop_candidate()
        peak = max(peak, mem.held_bytes())
    # RNG states ride along (a few KiB): three generations of model + optimizer, no more.
    assert peak <= 3 * state + 3 * 8192
    assert peak >= 2 * state  # candidate and verified are both held after two cycles
    mem.close()


def test_without_reuse_every_capture_copies_into_fresh_buffers() -> None:
    # The baseline benchmarks/checkpoint_capture.py measures: the same generations, new
    # host buffers at every capture (the released ones are freed first).
    model, opt = make()
    train(model, opt, 2)
    mem = InMemoryCheckpoints(model, [opt], default_rng_streams())
    mem.reuse = False
    first = mem.capture(1)
    params = _ptrs(first)
    kept = list(flatten(first.tree)[1].values())  # keep the old buffers alive: no address reuse
    train(model, opt, 1)
    second = mem.capture(2)
    assert not _ptrs(second) & params
    after = fingerprint(model, opt)
    train(model, opt, 2)
    mem.restore(second)
    assert fingerprint(model, opt) == after
    assert kept and mem.peak_bytes >= mem.held_bytes() > 0
    mem.close()


def test_cpu_copy_overlaps_the_next_iteration_and_the_step_waits_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Parameters and moments are copied on a background thread (slowed down here, so
    # training reaches the next step while it runs); the step's pre-hook joins it
    # before writing them, so the generation holds the boundary's state bitwise.
    # Buffers and extra state are copied before capture returns.
    import time

    delay_background_copy(monkeypatch, lambda: time.sleep(0.3))
    model, opt = make()
    model.register_buffer("seen", torch.zeros(3))
    train(model, opt, 2)
    mem = InMemoryCheckpoints(model, [opt], default_rng_streams())
    assert mem.overlap
    extra = {"cursor": torch.tensor([1, 2])}
    snap = mem.capture(2, extra)
    assert not snap.ready  # still copying: capture did not wait for it
    before = fingerprint(model, opt)
    model.seen += 1  # a forward-time buffer write right after the boundary
    extra["cursor"] += 5
    train(model, opt, 3)  # the first step's pre-hook joins the copy first
    assert snap.ready
    restored = mem.restore(snap)
    assert fingerprint(model, opt) == before
    assert restored["cursor"].tolist() == [1, 2]
    mem.close()


def test_one_worker_thread_runs_every_background_copy_and_close_ends_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A capture hands its copy to a waiting thread instead of starting one (starting a
    # thread blocked the capture until it ran); the gate's close ends that thread.
    import gc
    import threading

    runners: list[threading.Thread] = []
    delay_background_copy(monkeypatch, lambda: runners.append(threading.current_thread()))
    model, opt = make()
    mem = InMemoryCheckpoints(model, [opt], default_rng_streams())
    for step in range(3):
        train(model, opt, 1)
        mem.capture(step).wait()
    assert len(runners) == 3 and all(t is runners[0] for t in runners)
    assert runners[0] is not threading.current_thread() and runners[0].name == "scout-gate-copy"
    mem.close()
    assert not runners[0].is_alive()
    # A gate dropped without close (with its optimizer: its step hook holds the gate)
    # does not leave its thread waiting forever.
    model, opt = make()
    train(model, opt, 1)
    mem = InMemoryCheckpoints(model, [opt], default_rng_streams())
    mem.capture(3).wait()
    dropped = runners[-1]
    assert dropped is not runners[0] and dropped.is_alive()
    del mem, opt
    gc.collect()
    dropped.join(timeout=10)
    assert not dropped.is_alive()


def test_what_the_forward_or_a_scheduler_writes_is_copied_before_capture_returns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Only the parameters and the optimizer's per-parameter state wait for the
    # background copy. A parameter whose storage a buffer shares (the forward may write
    # it) and a tensor learning rate (a scheduler writes it in place after the step)
    # are in the generation the moment capture returns, while the thread still sleeps.
    import threading

    release = threading.Event()
    delay_background_copy(monkeypatch, lambda: release.wait(10))
    model, _ = make()
    opt = torch.optim.AdamW(model.parameters(), lr=torch.tensor(1e-2))
    model.register_buffer("alias", model[2].bias.data)  # shares the parameter's storage
    train(model, opt, 2)
    mem = InMemoryCheckpoints(model, [opt], default_rng_streams())
    snap = mem.capture(2)
    try:
        assert not snap.ready
        tree = snap.tree
        assert torch.equal(tree["model"]["2.bias"], model[2].bias.detach())
        assert torch.equal(tree["model"]["alias"], model[2].bias.detach())
        assert torch.equal(tree["optim"][0]["param_groups"][0]["lr"], torch.tensor(1e-2))
    finally:
        release.set()
    snap.wait()
    weight = tree["model"]["0.weight"]  # a plain parameter: copied by the thread
    assert torch.equal(weight, model[0].weight.detach())
    mem.close()
