"""The one conformance body every :class:`~scout_core.checkpoint.io.CheckpointIO` runs.

The core's DCP store and each framework plugin's checkpoint IO (DeepSpeed's,
Megatron's, TorchTitan's) run the same checks, inside a real multi-rank job of
their framework (every rank calls :func:`check_checkpoint_io` at the same point)::

    check_checkpoint_io(
        io,
        state=lambda: [p.detach() for p in model.parameters()] + optimizer_slots(),
        advance=lambda: train_one_step(),
        break_save=make_the_next_save_fail,     # a context manager factory
    )

What it checks, in order: ``tag_for`` gives a distinct tag per step; save A,
change the state, save B, and ``list_tags`` holds both, A first; loading A restores
A's state bitwise (and ``restored_step`` moves back), loading B restores B's; an
unknown tag raises :class:`~scout_core.errors.CheckpointError`; a save that fails
(inside ``break_save()``: it raises or returns False) lists no new tag and leaves B
loadable, bitwise; at least one rank writes SCOUT's sidecar.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager

import torch
import torch.distributed as dist

from scout_core.checkpoint.io import CheckpointIO
from scout_core.decision.signature import signature_many
from scout_core.errors import CheckpointError
from scout_core.topology.groups import diagnostic_group

__all__ = ["check_checkpoint_io"]


def _fingerprint(state: Callable[[], Sequence[torch.Tensor]]) -> int:
    return signature_many([t.detach() for t in state()])


def check_checkpoint_io(
    io: CheckpointIO,
    *,
    state: Callable[[], Sequence[torch.Tensor]],
    advance: Callable[[], None],
    break_save: Callable[[], AbstractContextManager[object]],
    steps: tuple[int, int, int] = (3, 7, 11),
) -> None:
    """Run the shared checks on ``io`` (see the module doc). Collective over the job.

    ``state()`` returns the tensors a restore must bring back bitwise (parameters,
    optimizer slots, ...) on this rank; ``advance()`` changes them (trains one
    iteration); ``break_save()`` is a context inside which the IO's next save fails
    on every rank. ``steps`` are the SCOUT steps whose tags A, B and the failing save
    use. Raises ``AssertionError`` naming the broken part of the contract.
    """
    assert isinstance(io, CheckpointIO), f"{io!r} does not follow CheckpointIO"
    assert isinstance(io.directory, str) and io.directory, "directory must be a non-empty str"
    tags = [io.tag_for(s) for s in range(32)]
    assert len(set(tags)) == len(tags), f"tag_for repeats tags: {tags}"
    step_a, step_b, step_c = steps
    tag_a, tag_b, tag_c = io.tag_for(step_a), io.tag_for(step_b), io.tag_for(step_c)

    assert io.save(tag_a) is True, f"save({tag_a!r}) did not report success"
    at_a = _fingerprint(state)
    advance()
    assert _fingerprint(state) != at_a, "advance() did not change the state: nothing is checked"
    assert io.save(tag_b) is True, f"save({tag_b!r}) did not report success"
    at_b = _fingerprint(state)
    assert os.path.isdir(io.directory), f"{io.directory} does not exist after a save"
    listed = list(io.list_tags())
    assert tag_a in listed and tag_b in listed, f"list_tags() = {listed} lacks {tag_a}/{tag_b}"
    assert listed.index(tag_a) < listed.index(tag_b), f"list_tags() not oldest first: {listed}"

    advance()
    io.load(tag_a)
    assert _fingerprint(state) == at_a, f"load({tag_a!r}) did not restore its state bitwise"
    restored_a = io.restored_step()
    io.load(tag_b)
    assert _fingerprint(state) == at_b, f"load({tag_b!r}) did not restore its state bitwise"
    restored_b = io.restored_step()
    assert isinstance(restored_a, int) and restored_a < restored_b, (
        f"restored_step() after {tag_a!r} ({restored_a}) is not before {tag_b!r}'s ({restored_b})"
    )

    unknown = io.tag_for(10**6)
    try:
        io.load(unknown)
    except CheckpointError:
        pass
    else:
        raise AssertionError(f"load({unknown!r}) of a tag never saved did not raise")

    advance()
    with break_save():
        try:
            saved = io.save(tag_c)
        except Exception:  # a failing save may raise: what matters is what is left
            saved = False
    assert not saved, f"save({tag_c!r}) reported success inside break_save()"
    listed = list(io.list_tags())
    assert tag_c not in listed, f"a failed save left tag {tag_c!r} listed: {listed}"
    assert tag_a in listed and tag_b in listed, f"a failed save lost earlier tags: {listed}"
    io.load(tag_b)
    assert _fingerprint(state) == at_b, f"after a failed save, {tag_b!r} no longer restores"

    writers = torch.tensor([1 if io.writes_metadata() else 0], dtype=torch.int64)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(writers, group=diagnostic_group())
    assert int(writers.item()) >= 1, "no rank writes the sidecar (writes_metadata)"
