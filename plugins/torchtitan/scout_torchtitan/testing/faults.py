"""Injected faults for a TorchTitan trainer: ``--inject {sdc,straggler,hang}:rank=R,step=S``.

The CPU example and the acceptance tests simulate one faulty rank with SCOUT's own
injectors (``scout_core.testing.Faults``), attached through public hooks only:

* ``sdc``: from step ``S`` on, every transformer block on rank ``R`` flips the lowest
  mantissa bit of its output (a silent, persistent compute fault). The hooks sit on
  the blocks *inside* TorchTitan's activation-checkpoint / FSDP wrappers, so the
  faulty unit also computes wrongly when SCOUT replays the block; a DTensor output
  is corrupted in the rank's own shard (no collective);
* ``straggler``: every module SCOUT replays on rank ``R`` (the blocks, the embedding
  and the LM head) sleeps ``delay_s`` (200 ms) per call for ``straggler_steps``
  iterations from step ``S``: a slow rank is slow at everything it computes;
* ``hang``: rank ``R`` stops itself with ``SIGSTOP`` right before the forward of
  step ``S``, the way a wedged host freezes; a small child process sends ``SIGCONT``
  after ``resume_after_s`` so the job can finish and print what SCOUT found. The
  moment of the freeze (wall clock, as evidence records stamp ``time``) is written to
  ``freeze_file`` when given.

Steps are 0-based training iterations, SCOUT's numbering (TorchTitan's step ``S + 1``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

__all__ = ["FaultSpec", "InjectedFaults", "attach_fault", "block_paths", "parse_inject"]

KINDS = ("sdc", "straggler", "hang")


@dataclass(frozen=True)
class FaultSpec:
    """One ``--inject`` value."""

    kind: str
    rank: int
    step: int


def parse_inject(text: str | None) -> FaultSpec | None:
    """``kind:rank=R,step=S`` → :class:`FaultSpec`; None for no text. ``ValueError`` names
    what is wrong."""
    if not text:
        return None
    kind, _, rest = text.partition(":")
    if kind not in KINDS:
        raise ValueError(f"--inject: unknown fault {kind!r}; use one of {', '.join(KINDS)}")
    fields = dict(item.split("=", 1) for item in rest.split(",") if "=" in item)
    try:
        return FaultSpec(kind, int(fields["rank"]), int(fields["step"]))
    except (KeyError, ValueError):
        raise ValueError(f"--inject {text!r}: expected {kind}:rank=R,step=S") from None


def block_paths(model: nn.Module, blocks: list[nn.Module]) -> list[str]:
    """Where each block sits in ``model``, wrappers included
    (``layers.0._checkpoint_wrapped_module``): where an injector must hook to be
    replayed too."""
    names = {id(m): name for name, m in model.named_modules()}
    return [names[id(b)] for b in blocks]


class InjectedFaults:
    """What :func:`attach_fault` armed on this rank; :meth:`detach` removes it."""

    def __init__(self, faults: Any, hang: Any = None) -> None:
        self.faults = faults
        self._hang = hang

    def fired(self) -> list[tuple[str, str | None, int]]:
        """(kind, target, step) of every injection on this rank."""
        out = [] if self.faults is None else list(self.faults.fired())
        if self._hang is not None and self._hang.fired is not None:
            out.append(("hang", None, self._hang.fired))
        return out

    def detach(self) -> None:
        if self.faults is not None:
            self.faults.detach()
        if self._hang is not None:
            self._hang.remove()


class _Hang:
    """Freeze this process with SIGSTOP before the forward of ``step``."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: Any,
        step: int,
        resume_after_s: float,
        freeze_file: str | None,
    ) -> None:
        self.step, self.resume_after_s, self.freeze_file = step, resume_after_s, freeze_file
        self.fired: int | None = None
        self._seen = 0
        self._handles = [
            model.register_forward_pre_hook(self._before_forward),
            optimizer.register_step_post_hook(self._after_step),
        ]

    def _after_step(self, *_: Any) -> None:
        self._seen += 1

    def _before_forward(self, *_: Any) -> None:
        if self.fired is not None or self._seen != self.step:
            return
        self.fired = self.step
        pid = os.getpid()
        # The resumer must not be stopped with us: its own session, started first.
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                f"import os,time;time.sleep({self.resume_after_s});"
                f"os.kill({pid},{int(signal.SIGCONT)})",
            ],
            start_new_session=True,
        )
        if self.freeze_file:
            Path(self.freeze_file).parent.mkdir(parents=True, exist_ok=True)
            Path(self.freeze_file).write_text(repr(time.time()))
        os.kill(pid, signal.SIGSTOP)

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()


def attach_fault(
    spec: FaultSpec | None,
    trainer: Any,
    *,
    rank: int,
    steps: int,
    delay_s: float = 0.2,
    straggler_steps: int = 4,
    resume_after_s: float = 20.0,
    freeze_file: str | None = None,
) -> InjectedFaults | None:
    """Arm ``spec`` on ``trainer`` if it names this ``rank`` (every rank may call it)."""
    if spec is None:
        return None
    from scout_core.testing import BitFlip, Faults
    from scout_torchtitan.modules import titan_modules

    model = trainer.model_parts[0]
    container = trainer.optimizers
    if spec.kind == "hang":
        hang = (
            _Hang(model, container, spec.step, resume_after_s, freeze_file)
            if rank == spec.rank
            else None
        )
        return InjectedFaults(None, hang)
    found = titan_modules(trainer.model_parts)
    blocks = block_paths(model, [ref.module for ref in found.layers])
    ends = block_paths(model, [ref.module for ref in (found.embedding, found.lm_head) if ref])
    faults = Faults()
    if spec.kind == "sdc":
        when = faults.at(rank=spec.rank, steps=range(spec.step, steps))
        for path in blocks:
            when.corrupt_output(path, BitFlip(bit=0))
    else:
        when = faults.at(rank=spec.rank, steps=range(spec.step, spec.step + straggler_steps))
        for path in blocks + ends:
            when.delay_compute(path, delay_s)
    return InjectedFaults(faults.attach(model, container, rank=rank), None)
