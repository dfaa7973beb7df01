"""One campaign trial's fault, armed inside any training loop: :class:`TrialFault`; and
the :class:`Setup` a trial trains under.

``scout campaign`` (:mod:`scout_core.campaign`) draws trials: a setup, a fault kind, a
victim rank and an injection step. Every setup's rank body (the core's torch setups
and each plugin's) trains the same way and hands the fault to one
:class:`TrialFault`, so a fault kind means the same thing in every setup::

    fault = TrialFault(spec)                     # spec: {"kind", "rank", "step", ...}
    fault.prepare()                              # collective: every rank calls it
    fault.attach(model, optimizer, layers=[...], param="layers.0.fc1.weight")
    for step in fault.batches(session, steps):   # the watched "DataLoader"
        fault.before_step(step)
        train_step(...)
        fault.after_step(step, session)
    result = fault.result()                      # JSON: when it struck, what fired

The numerical faults and the compute straggler go through :class:`Faults` (module
and optimizer hooks); the communication straggler through
:meth:`Trigger.delay_collective`. The rest happen in the loop itself, where a real
one would: a dataloader fetch that stalls (``input_stall``), a checkpoint write that
stalls (``checkpoint_stall``), a collective of another type on one rank where the
others run the loop's usual one (``protocol_mismatch``: every rank all-reduces a
metric on a side group at every step, as training loops log a loss, and at the fault
step the victim broadcasts instead), a thread that holds the GIL (``hang_gil``), and
a rank that waits, marked, for the campaign runner to ``SIGSTOP`` it (``hang_sigstop``:
a process cannot resume itself, so the runner stops it and continues it once the
verdict is in).

Two kinds are for tests, never drawn by a campaign (:data:`TEST_KINDS`).
``job_slowdown`` slows every rank at once: for ``window`` steps, each forward of every
block on every rank takes ``factor`` (default 3) times as long as it did, training and
replay calls alike (:meth:`Trigger.slow_compute`: a whole job on slower clocks, a
throttled node type, a shared service every rank waits on ...): a slow job, not a slow
rank. TinyLM's blocks run in well under a millisecond on a CPU, where three times as
long is still far below any straggler threshold, so a slowdown there would test
nothing; the blocks are first given real work time: on every rank and at every step,
each block's forward sleeps ``delay_s`` / the number of blocks (as a compute
straggler's delay is spread), and the slowdown multiplies that too.
``collective_stall`` holds a collective open with every member inside it (a link or
switch fault): the spec's ``ranks`` all-reduce on a group of their own at the fault
step, and the transport under SCOUT's collective patch stalls there. That transport is
a wrapper of ``torch.distributed.all_reduce`` installed when the :class:`TrialFault` is
constructed, so it must be constructed before SCOUT attaches (SCOUT's patch then wraps
it); :meth:`TrialFault.detach` removes it.

[Timing]
Stalls last ``stall_s`` (the spec's, by default the hang timeout + 3 s), long enough
for the observer's verdict, short enough that training then goes on. A straggler is
slow for ``window`` steps so that ``straggler_rounds`` consecutive replay rounds see it.
"""

from __future__ import annotations

import ctypes
import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from scout_core.testing.injectors import BitFlip, Faults, flip_bit

__all__ = [
    "FAULT_KINDS",
    "RESUMED_MARKER",
    "STOP_MARKER",
    "TEST_KINDS",
    "Setup",
    "TrialFault",
    "hold_gil",
]


@dataclass(frozen=True)
class Setup:
    """A parallel setup a campaign trial trains under: the core's own, or one a plugin
    registers under the ``scout.campaign_setups`` entry point (``docs/plugins.md``)."""

    name: str
    world: int
    """Ranks the trial spawns."""
    target: str
    """The rank body, ``"module:function"`` (a plugin's, for a framework setup)."""
    requires: tuple[str, ...] = ()
    """Top-level modules that must be importable, else the setup is skipped."""
    options: dict[str, Any] = field(default_factory=dict)
    """Passed to the rank body (the layout, the ZeRO stage ...)."""
    startup_s: float = 30.0
    """Rough start-up cost on a loaded CPU box, for the trial's hard timeout."""
    init_process_group: bool = True
    """Whether the harness initialises ``torch.distributed`` (TorchTitan does it itself)."""


FAULT_KINDS: tuple[str, ...] = (
    "param_sdc",
    "compute_sdc",
    "optimizer_sdc",
    "compute_straggler",
    "comm_straggler",
    "hang_sigstop",
    "hang_gil",
    "protocol_mismatch",
    "input_stall",
    "checkpoint_stall",
    "clean",
)
"""Every fault kind a trial can carry; ``clean`` injects nothing (a control)."""

TEST_KINDS: tuple[str, ...] = ("collective_stall", "job_slowdown")
"""Kinds for tests only (module doc): a campaign never draws them."""

_HOOKED = frozenset(
    {"compute_sdc", "optimizer_sdc", "compute_straggler", "comm_straggler", "job_slowdown"}
)
"""Kinds armed through :class:`Faults` hooks by :meth:`TrialFault.attach`."""

STOP_MARKER = "campaign-stop-ready"
"""File the ``hang_sigstop`` victim writes in ``SCOUT_TEST_RANK_DIR`` (JSON: its pid),
then waits: the runner stops it there, before the step's collectives."""
RESUMED_MARKER = "campaign-stop-done"
"""File the runner writes once it has continued the stopped victim (or given up)."""


def hold_gil(seconds: float) -> None:
    """Hold the GIL for ``seconds``, as a stuck C extension does: no other thread of the
    process runs meanwhile (the training thread is frozen).

    ``nanosleep`` is called through :class:`ctypes.PyDLL`, which keeps the GIL during
    the call (``ctypes.CDLL`` would release it), so the hold is exact. Where libc's
    ``nanosleep`` cannot be found, a ``sum`` over a range spins in C for about
    ``seconds`` instead (it never returns to the eval loop, so it keeps the GIL too)."""
    try:
        nanosleep = ctypes.PyDLL(None).nanosleep
    except (OSError, AttributeError):
        n = 1_000_000
        t = time.perf_counter()
        sum(range(n))
        per = max((time.perf_counter() - t) / n, 1e-9)
        sum(range(int(seconds / per)))
        return
    whole = int(seconds)
    ask = _Timespec(whole, int((seconds - whole) * 1e9))
    left = _Timespec()
    while nanosleep(ctypes.byref(ask), ctypes.byref(left)) != 0:  # a signal: sleep the rest
        ask = _Timespec(left.tv_sec, left.tv_nsec)


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class TrialFault:
    """The fault of one trial on this rank (module doc); a no-op for ``clean``."""

    def __init__(self, spec: Mapping[str, Any], *, rank: int | None = None) -> None:
        kind = str(spec["kind"])
        if kind not in FAULT_KINDS + TEST_KINDS:
            known = ", ".join(FAULT_KINDS + TEST_KINDS)
            raise ValueError(f"unknown fault kind {kind!r}; known: {known}")
        self.kind = kind
        self.victim = int(spec["rank"])
        self.step = int(spec["step"])
        self.stall_s = float(spec.get("stall_s", 5.0))
        self.delay_s = float(spec.get("delay_s", 0.2))
        self.window = int(spec.get("window", 4))
        self.factor = float(spec.get("factor", 3.0))
        self.rank = _rank() if rank is None else rank
        self.injected_at: float | None = None
        self._faults: Faults | None = None
        self._side: Any = None
        self._param: tuple[Any, str, Callable[[Any], Any]] | None = None
        self._fired: list[list[Any]] = []
        self._members = tuple(int(r) for r in spec.get("ranks", ()))
        self._unwrap: Callable[[], None] | None = None
        if kind == "collective_stall":
            if not self._members:
                raise ValueError("a collective_stall spec needs 'ranks': the stalled group")
            self._unwrap = self._stalling_transport()

    @property
    def mine(self) -> bool:
        """Whether this rank is the victim (never, for a clean control)."""
        return self.kind != "clean" and self.rank == self.victim

    def prepare(self) -> None:
        """Collective, on every rank: the side group a protocol mismatch runs on (its
        own short timeout, so the mismatched collective ends and training goes on), or
        the group a collective stall holds open."""
        import torch.distributed as dist

        timeout = timedelta(seconds=self.stall_s + 2.0)
        if self.kind == "protocol_mismatch":
            self._side = dist.new_group(backend="gloo", timeout=timeout)
        elif self.kind == "collective_stall":
            self._side = dist.new_group(list(self._members), backend="gloo", timeout=timeout)

    def attach(
        self,
        model: Any,
        optimizer: Any,
        *,
        layers: Sequence[str],
        param: str,
        storage: Callable[[Any], Any] | None = None,
    ) -> TrialFault:
        """Arm the hook-based faults. ``layers``: the repeated blocks' module paths as
        ``model`` names them; ``param``: a trained parameter's name; ``storage``: where
        that parameter's values really live on this rank (default its local tensor; a
        framework that keeps them elsewhere, ZeRO-3's partition, says so). ``optimizer``
        is the one that holds the state (a framework's inner optimizer)."""
        from scout_core.topology.shards import local_shard

        self._param = (model, param, storage or local_shard)
        faults = Faults()
        window = range(self.step, self.step + self.window)
        if self.kind == "compute_sdc":
            # a faulty unit stays faulty: the lowest mantissa bit of every block's output
            when = faults.at(rank=self.victim, steps=range(self.step, self.step + 1000))
            for name in layers:
                when.corrupt_output(name, BitFlip(bit=0))
        elif self.kind == "optimizer_sdc":
            # a high mantissa bit of a moment estimate of the first parameter with state
            faults.at(rank=self.victim, step=self.step).corrupt_optimizer_state(
                None, BitFlip(bit=20)
            )
        elif self.kind == "compute_straggler":
            when = faults.at(rank=self.victim, steps=window)
            for name in layers:
                when.delay_compute(name, self.delay_s / max(1, len(layers)))
        elif self.kind == "job_slowdown":  # every rank: no victim (module doc)
            work = faults.at(rank=self.rank, persistent=True)
            for name in layers:
                work.delay_compute(name, self.delay_s / max(1, len(layers)))
            slow = faults.at(rank=self.rank, steps=window)
            for name in layers:  # after the work's hooks, so the slowdown times them too
                slow.slow_compute(name, self.factor)
        elif self.kind == "comm_straggler":
            faults.at(rank=self.victim, steps=window).delay_collective(self.delay_s)
        else:
            return self
        self._faults = faults.attach(model, optimizer, rank=self.rank)
        return self

    def batches(self, session: Any, steps: int) -> Iterator[int]:
        """The step numbers ``0..steps-1`` as a watched DataLoader (``session`` may be
        None); the victim's fetch of its injection step stalls for an input stall."""
        loader = _Loader(steps, self.step if self.mine and self.kind == "input_stall" else -1)
        loader.stall_s = self.stall_s
        loader.on_stall = self.mark_injected
        watched = loader if session is None else session.watch_dataloader(loader)
        yield from watched

    def before_step(self, step: int) -> None:
        """At the start of ``step``: the loop-level faults that strike before training."""
        if self.kind == "protocol_mismatch" and step <= self.step:
            self._metric(mismatch=step == self.step)
        if step != self.step:
            return
        if self.kind == "collective_stall":
            self._stall_collective()
        if self.kind == "job_slowdown":
            self.mark_injected()
        if not self.mine:
            return
        if self.kind in _HOOKED:
            self.mark_injected()  # the hooks strike inside this step
        elif self.kind == "param_sdc":
            self._corrupt_param()
        elif self.kind == "hang_sigstop":
            self.mark_injected()
            _write_marker(STOP_MARKER, {"pid": os.getpid(), "rank": self.rank})
            # stopped in here by the runner, which writes RESUMED once it has continued
            # this process: the stop lands here however late a loaded machine runs it
            resumed = _scratch() / RESUMED_MARKER
            deadline = time.monotonic() + 60.0
            while not resumed.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
        elif self.kind == "hang_gil":
            self.mark_injected()
            threading.Thread(target=hold_gil, args=(self.stall_s,), daemon=True).start()
            time.sleep(0.05)  # hand the GIL to the spinning thread

    def after_step(self, step: int, session: Any) -> None:
        """After ``step``: every rank writes a (tiny) checkpoint at the injection step,
        inside the session's checkpoint stage; the victim's write stalls."""
        if step != self.step or self.kind != "checkpoint_stall":
            return
        stage = session.checkpoint_stage("write") if session is not None else nullcontext()
        with stage:
            _write_marker(f"ckpt-{self.rank}.json", {"step": step})
            if self.mine:
                self.mark_injected()
                time.sleep(self.stall_s)

    def result(self) -> dict[str, Any]:
        """JSON for the runner: the victim's injection time (Unix seconds) and what fired."""
        fired = [list(f) for f in self._faults.fired()] if self._faults is not None else []
        fired += self._fired
        if self.mine and self.kind in _HOOKED and not fired:
            self.injected_at = None  # the hooks found nothing to act on: no fault
        return {
            "rank": self.rank,
            "kind": self.kind,
            "victim": self.mine,
            "injected_at": self.injected_at,
            "fired": fired,
        }

    def detach(self) -> None:
        """Remove the hooks :meth:`attach` installed, and a stalling transport."""
        if self._faults is not None:
            self._faults.detach()
        if self._unwrap is not None:
            self._unwrap()
            self._unwrap = None

    # -- internals ----------------------------------------------------------------------

    def _corrupt_param(self) -> None:
        """A high mantissa bit of the parameter's first local element, as the step starts:
        the weight stays plausible, and this rank's replica has silently diverged."""
        if self._param is None:
            raise RuntimeError("param_sdc needs attach() first")
        model, name, storage = self._param
        from scout_core.integration.discovery import unwrap

        flip_bit(storage(unwrap(model).get_parameter(name)), bit=20)
        self.mark_injected()
        self._fired.append(["param", name, self.step])

    def mark_injected(self) -> None:
        """Stamp the moment the fault struck (the first call counts), for a rank body that
        strikes it itself (a framework's own dataloader stalling, say)."""
        if self.injected_at is None:
            self.injected_at = time.time()

    def _metric(self, *, mismatch: bool) -> None:
        """The loop's metric all-reduce on the side group; at the fault step the victim
        broadcasts instead (module doc)."""
        import torch
        import torch.distributed as dist

        x = torch.ones(4)
        try:
            if mismatch and self.mine:
                self.mark_injected()
                dist.broadcast(x, src=0, group=self._side)
            else:
                dist.all_reduce(x, group=self._side)
        except RuntimeError:
            if not mismatch:
                raise
            # the side group's timeout ends the mismatched collective

    def _stall_collective(self) -> None:
        """The stalled group's members all-reduce on it; the transport holds it open."""
        import torch
        import torch.distributed as dist

        if self.rank not in self._members:
            return
        self._fired.append(["collective_stall", list(self._members), self.step])
        self.mark_injected()
        dist.all_reduce(torch.ones(4), group=self._side)

    def _stalling_transport(self) -> Callable[[], None]:
        """Wrap ``torch.distributed.all_reduce`` so that the stalled group's collective
        at the fault step waits ``stall_s`` before it runs (module doc); returns the undo."""
        import functools

        import torch.distributed as dist

        orig = dist.all_reduce
        stall_s = self.stall_s

        @functools.wraps(orig)
        def all_reduce(*args: Any, **kwargs: Any) -> Any:
            group = kwargs.get("group", args[2] if len(args) > 2 else None)
            if group is not None and group is self._side:
                time.sleep(stall_s)
            return orig(*args, **kwargs)

        modules = (dist, dist.distributed_c10d)
        for module in modules:
            module.all_reduce = all_reduce  # type: ignore[attr-defined]

        def undo() -> None:
            for module in modules:
                if module.all_reduce is all_reduce:
                    module.all_reduce = orig  # type: ignore[attr-defined]

        return undo


class _Loader:
    """``range(steps)`` as an iterable whose fetch of ``slow`` takes ``stall_s``."""

    def __init__(self, steps: int, slow: int) -> None:
        self.steps, self.slow = steps, slow
        self.stall_s = 0.0
        self.on_stall: Any = None

    def __iter__(self) -> Iterator[int]:
        for i in range(self.steps):
            if i == self.slow:
                self.on_stall()
                time.sleep(self.stall_s)
            yield i

    def __len__(self) -> int:
        return self.steps


def _scratch() -> Path:
    return Path(os.environ.get("SCOUT_TEST_RANK_DIR", "."))


def _write_marker(name: str, value: Any) -> None:
    path = _scratch() / name
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value))
    tmp.rename(path)


def _rank() -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))
