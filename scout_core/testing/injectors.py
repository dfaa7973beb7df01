"""Deterministic fault injectors keyed by (rank, step), for tests, the demo and users.

A test says *what* goes wrong, *where* and *when*, and the injector does exactly
that and nothing else::

    faults = (
        Faults()
        .at(rank=1, step=5).corrupt_output("layers.3", BitFlip(bit=0))
        .at(rank=2, steps=range(4, 12)).delay_compute("layers.1", 0.2)
    )
    faults.attach(model, optimizer)

Injectors attach through the same public seams SCOUT uses (module forward hooks,
``Optimizer.register_step_pre_hook`` / ``register_step_post_hook``), so they never
reach into SCOUT's internals, except two that simulate what a hook cannot: a slow
link seen by SCOUT's own timed communication (:meth:`Trigger.delay_collective`,
:meth:`Trigger.delay_all_to_all`)
and a rank that misses a capture (:meth:`Trigger.skip_capture`). Those register
with :mod:`scout_core.replay.taps`, the one seam replay offers for fault
simulation.

[What "step" means]
The step is the 0-based training iteration: the number of optimizer steps that had
completed when the iteration's first forward ran. It advances lazily, at the first
forward after an optimizer step, so everything that belongs to iteration ``s`` (its
forward, backward, optimizer step and the replay boundary right after it) sees the
same ``s`` whatever order hooks were registered in.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from scout_core.replay import taps
from scout_core.topology.shards import local_shard

__all__ = [
    "AddNoise",
    "BitFlip",
    "Corruption",
    "Faults",
    "Scale",
    "Trigger",
    "comm_delay",
    "flip_bit",
]


def flip_bit(t: torch.Tensor, *, index: int = 0, bit: int = 0) -> torch.Tensor:
    """Flip bit ``bit`` of element ``index`` (flat) of ``t`` in place; return ``t``.

    Bit 0 is the lowest mantissa bit of a float: the smallest change there is, which
    no tolerance-based check sees and only a bitwise signature does.
    """
    if t.numel() == 0:
        raise ValueError("cannot flip a bit of an empty tensor")
    flat = t.detach().view(-1)
    i = index % flat.numel()
    width = t.element_size() * 8
    if not 0 <= bit < width:
        raise ValueError(f"bit must be in 0..{width - 1} for {t.dtype}, got {bit}")
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    with torch.no_grad():
        raw = flat[i : i + 1].view(ints)
        mask = 1 << bit
        if bit == width - 1:  # the sign bit: flip it without overflowing a Python int
            mask = -(1 << (width - 1))
        raw.bitwise_xor_(torch.tensor(mask, dtype=ints))
    return t


class Corruption:
    """A numerical corruption: applied in place to a tensor (a copy for outputs)."""

    def apply_(self, t: torch.Tensor) -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class BitFlip(Corruption):
    """Flip one bit of one element; ``bit=0`` is the near-invisible lowest mantissa bit."""

    bit: int = 0
    index: int = 0

    def apply_(self, t: torch.Tensor) -> None:
        flip_bit(t, index=self.index, bit=self.bit)


@dataclass(frozen=True)
class Scale(Corruption):
    """Multiply every element by ``factor``."""

    factor: float = 2.0

    def apply_(self, t: torch.Tensor) -> None:
        with torch.no_grad():
            t.mul_(self.factor)


@dataclass(frozen=True)
class AddNoise(Corruption):
    """Add seeded Gaussian noise of standard deviation ``std`` (same noise every time)."""

    std: float = 1e-3
    seed: int = 0

    def apply_(self, t: torch.Tensor) -> None:
        gen = torch.Generator().manual_seed(self.seed)
        noise = torch.randn(t.shape, generator=gen, dtype=torch.float64)
        with torch.no_grad():
            t.add_(noise.to(dtype=t.dtype, device=t.device) * self.std)


@dataclass(frozen=True)
class _When:
    rank: int | None
    steps: frozenset[int] | None  # None = every step (persistent)

    def active(self, rank: int, step: int) -> bool:
        return (self.rank is None or self.rank == rank) and (
            self.steps is None or step in self.steps
        )


@dataclass
class _Fault:
    when: _When
    kind: str
    target: str | None
    payload: Any
    fired: list[int] = field(default_factory=list)


class Trigger:
    """The faults scheduled at one (rank, steps); each method returns the :class:`Faults`."""

    def __init__(self, faults: Faults, when: _When) -> None:
        self._faults = faults
        self._when = when

    def _add(self, kind: str, target: str | None, payload: Any) -> Faults:
        self._faults.faults.append(_Fault(self._when, kind, target, payload))
        return self._faults

    def corrupt_output(self, module: str, how: Corruption) -> Faults:
        """Corrupt the first floating tensor a module returns (training and replay calls).

        A DTensor output (tensor or sequence parallelism) is corrupted in this rank's
        local shard, as a faulty unit would: no collective, peers untouched."""
        return self._add("output", module, how)

    def corrupt_param(self, param: str, how: Corruption) -> Faults:
        """Corrupt a parameter after backward, before the optimizer step."""
        return self._add("param", param, how)

    def corrupt_param_after_step(self, param: str, how: Corruption) -> Faults:
        """Corrupt a parameter's local values right after each optimizer step of the
        scheduled steps: a memory cell that does not keep what the step wrote (with
        :class:`BitFlip`, the bit turns over after every write from the first step on,
        for a persistent schedule). It runs in a step post-hook, so it must be attached
        after ``scout.enable``: torch runs an optimizer's post-hooks in registration
        order, and SCOUT's parameter custody signs in its own post-hook what the step
        wrote (:mod:`scout_core.replay.custody`). ``param`` may name the tensor the
        optimizer steps (``"#<group>.<position>"``, e.g. ``"#0.0"``: ZeRO's flat fp32
        partition, which no module names)."""
        return self._add("param_after", param, how)

    def corrupt_optimizer_state_after_step(
        self, param: str, how: Corruption, *, key: str = ""
    ) -> Faults:
        """Corrupt an optimizer slot of ``param`` (``key``; default its first element-wise
        floating slot, ``exp_avg`` for Adam) right after each scheduled optimizer step:
        :meth:`corrupt_param_after_step` for optimizer state (a stuck cell in a ZeRO or
        FSDP optimizer partition), attached after ``scout.enable`` for the same reason.
        ``param`` names a parameter or ``"#<group>.<position>"``."""
        return self._add("optim_after", param, (how, key))

    def corrupt_grad(self, param: str, how: Corruption) -> Faults:
        """Corrupt a parameter's (already reduced) gradient before the optimizer step, in a
        step pre-hook (attached after ``scout.enable``, the step computes from the corrupted
        gradient while SCOUT's snapshot holds the clean one: a miscomputed update).
        ``param`` may be ``"#<group>.<position>"``, as for :meth:`corrupt_param_after_step`."""
        return self._add("grad", param, how)

    def corrupt_optimizer_state(
        self, param: str | None, how: Corruption, *, key: str = ""
    ) -> Faults:
        """Corrupt an optimizer slot of ``param`` (``key`` e.g. ``exp_avg``; default the first
        floating slot) before the step. ``param=None``: the first parameter, in the
        optimizer's group order, that has state (a framework's flat partition, say)."""
        return self._add("optim", param, (how, key))

    def delay_compute(self, module: str, seconds: float) -> Faults:
        """Sleep ``seconds`` inside a module's forward (training and replay calls)."""
        return self._add("delay", module, float(seconds))

    def slow_compute(self, module: str, factor: float) -> Faults:
        """Make each forward of a module take ``factor`` times as long as it did (training
        and replay calls): a forward pre-hook notes the time, and a forward hook sleeps
        ``factor - 1`` times what passed since. What passed is the module's forward and
        the forward hooks registered on it before this one, so a :meth:`delay_compute`
        on the same module scheduled earlier in the chain is slowed too."""
        if factor < 1:
            raise ValueError(f"a slowdown factor is at least 1, got {factor}")
        return self._add("slow", module, float(factor))

    def delay_collective(self, seconds: float, *, group: str = "any") -> Faults:
        """Delay this rank inside SCOUT's timed communication on ``group``: a slow link
        at this rank as replay measures it.

        This rank sleeps ``seconds`` inside each timed collective of that kind, before
        entering it: ``"replica"`` (or ``"shard"`` under pure FSDP) is the peer group's
        replay-input broadcast and the optimizer-slice broadcast (``t_bcast``; the optimizer
        round broadcasts only where the peers' slices differ), ``"shard"`` also each
        FSDP parameter gather, ``"tp"`` each TP parameter gather (``t_gather``),
        ``"ep"`` / ``"ep_link"`` each replayed MoE all-to-all, before / inside the call
        (:meth:`delay_all_to_all`), ``"any"`` all of them. Training's own collectives are
        never delayed."""
        return self._add("collective", group, float(seconds))

    def delay_all_to_all(self, seconds: float, *, link: bool = False) -> Faults:
        """Make this rank's part of each MoE all-to-all that replay runs on SCOUT's EP
        group slow, in the dispatch and again in the combine.

        By default the rank is *late*: it sleeps ``seconds`` right before entering the
        call while its EP partners wait for it inside, as a rank that reaches its
        all-to-all late (a stalled host, a slow kernel before it) does; the
        ``all_to_all`` recipe names this rank a rank-scoped ``comm_straggler``. With
        ``link=True`` the *exchange* is slow: the sleep is inside the timed call, as a
        slow link or NIC at this rank stalls every end of the exchange alike; that
        names the EP group, not the rank (``docs/moe.md``). Training's own all-to-all
        is not delayed."""
        return self.delay_collective(seconds, group="ep_link" if link else "ep")

    def hang(self, seconds: float) -> Faults:
        """Freeze this rank's training thread for ``seconds`` when the step's first forward
        starts (once per step): a trainer that stops making progress while its peers wait
        for it in the step's collectives, as the hang observer sees a frozen process."""
        return self._add("hang", None, float(seconds))

    def skip_capture(self, module: str | None = None) -> Faults:
        """Make this rank miss the replay capture of ``module`` (default: every module)."""
        return self._add("skip", module, None)


class Faults:
    """A chainable, deterministic schedule of faults; :meth:`attach` arms it on one rank."""

    def __init__(self) -> None:
        self.faults: list[_Fault] = []
        self.step = 0
        self._advance = False
        self._rank = 0
        self._handles: list[RemovableHandle] = []
        self._taps: list[Callable[[], None]] = []
        self._params: dict[str, torch.Tensor] = {}
        self._groups: list[dict[str, Any]] = []

    def at(
        self,
        *,
        rank: int | None = None,
        step: int | None = None,
        steps: Iterable[int] | None = None,
        persistent: bool = False,
    ) -> Trigger:
        """Schedule at ``rank`` (None: every rank) and ``step``, ``steps`` or ``persistent``."""
        if sum(x is not None and x is not False for x in (step, steps, persistent or None)) != 1:
            raise ValueError("give exactly one of step=, steps= or persistent=True")
        chosen: frozenset[int] | None
        if persistent:
            chosen = None
        elif step is not None:
            chosen = frozenset({int(step)})
        else:
            assert steps is not None
            chosen = frozenset(int(s) for s in steps)
        return Trigger(self, _When(rank, chosen))

    def fired(self) -> list[tuple[str, str | None, int]]:
        """(kind, target, step) of every injection that happened on this rank."""
        return sorted((f.kind, f.target, s) for f in self.faults for s in f.fired)

    # -- attaching ----------------------------------------------------------------------

    def attach(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, *, rank: int | None = None
    ) -> Faults:
        """Arm the faults for this process's rank (``RANK`` env or ``dist.get_rank()``)."""
        from scout_core.integration.discovery import unwrap

        self._rank = _this_rank() if rank is None else rank
        root = unwrap(model)
        # Parameters by name as the optimizer holds them, taken now: DDP's TP transform
        # unregisters TP parameters at the first forward (they live on as attributes).
        self._params = dict(root.named_parameters())
        self._groups = list(optimizer.param_groups)  # before a framework narrows them
        self._handles.append(model.register_forward_pre_hook(self._on_forward))
        self._handles.append(optimizer.register_step_pre_hook(self._pre_step(root, optimizer)))
        self._handles.append(optimizer.register_step_post_hook(self._post_step))
        mine = [f for f in self.faults if f.when.rank in (None, self._rank)]
        for f in mine:
            if f.kind in {"output", "delay"}:
                assert f.target is not None
                module = root.get_submodule(f.target)
                self._handles.append(module.register_forward_hook(self._module_hook(f)))
            elif f.kind == "slow":
                assert f.target is not None
                module = root.get_submodule(f.target)
                pre, post = self._slow_hooks(f)
                self._handles.append(module.register_forward_pre_hook(pre))
                self._handles.append(module.register_forward_hook(post))
            elif f.kind == "collective":
                self._taps.append(taps.add_comm_delay(self._comm_delay(f)))
            elif f.kind == "skip":
                self._taps.append(taps.add_capture_veto(self._veto(f)))
        return self

    def detach(self) -> None:
        """Remove every hook and tap this schedule installed."""
        for h in self._handles:
            h.remove()
        for remove in self._taps:
            remove()
        self._handles.clear()
        self._taps.clear()

    def _active(self, f: _Fault) -> bool:
        return f.when.active(self._rank, self.step)

    def _fire(self, f: _Fault) -> None:
        if not f.fired or f.fired[-1] != self.step:
            f.fired.append(self.step)

    def _on_forward(self, module: nn.Module, args: Any) -> None:
        if self._advance:
            self.step += 1
            self._advance = False
        for f in self.faults:
            if f.kind == "hang" and self._active(f) and self.step not in f.fired:
                self._fire(f)
                time.sleep(f.payload)

    def _post_step(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._advance = True
        for f in self.faults:
            if f.kind not in {"param_after", "optim_after"} or not self._active(f):
                continue
            assert f.target is not None
            param = self._stepped(opt, f.target)
            if param is None:
                continue  # not held by this step (ZeRO steps one group at a time)
            if f.kind == "param_after":
                f.payload.apply_(local_shard(param))
            else:
                how, key = f.payload
                slot = _slot(opt, param, key)
                if slot is None:
                    continue  # no state yet
                how.apply_(local_shard(slot))
            self._fire(f)

    def _stepped(self, opt: torch.optim.Optimizer, target: str) -> torch.Tensor | None:
        """The tensor ``target`` names if the step that just ran held it, else None."""
        held = [q for g in opt.param_groups for q in g["params"]]
        if target.startswith("#"):
            gi, pos = (int(x) for x in target[1:].split("."))
            whole = self._groups[gi]["params"] if gi < len(self._groups) else []
            found = whole[pos] if pos < len(whole) else None
        else:
            found = self._params.get(target)
        return found if found is not None and any(q is found for q in held) else None

    def _module_hook(self, f: _Fault) -> Callable[[nn.Module, Any, Any], Any]:
        def hook(module: nn.Module, args: Any, output: Any) -> Any:
            if not self._active(f):
                return None
            self._fire(f)
            if f.kind == "delay":
                time.sleep(f.payload)
                return None
            return _corrupt_first(output, f.payload)

        return hook

    def _slow_hooks(
        self, f: _Fault
    ) -> tuple[Callable[[nn.Module, Any], None], Callable[[nn.Module, Any, Any], None]]:
        """The pre-hook and hook of :meth:`Trigger.slow_compute` (a stack of start times:
        a module that calls itself is timed per call)."""
        started: list[float] = []

        def pre(module: nn.Module, args: Any) -> None:
            started.append(time.perf_counter())

        def post(module: nn.Module, args: Any, output: Any) -> None:
            if not started:
                return  # attached during this call
            took = time.perf_counter() - started.pop()
            if self._active(f):
                self._fire(f)
                time.sleep((f.payload - 1.0) * took)

        return pre, post

    def _pre_step(
        self, root: nn.Module, optimizer: torch.optim.Optimizer
    ) -> Callable[[torch.optim.Optimizer, Any, Any], None]:
        def hook(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            for f in self.faults:
                if f.kind not in {"param", "grad", "optim"} or not self._active(f):
                    continue
                if f.target is None:  # optimizer state, of the first parameter holding some
                    held = [q for g in optimizer.param_groups for q in g["params"]]
                    found = next((q for q in held if optimizer.state.get(q)), None)
                    if found is None:
                        continue  # no state yet (first step): nothing to corrupt
                    param = found
                elif f.target.startswith("#"):  # the tensor a framework's optimizer steps
                    param = self._stepped(opt, f.target)
                    if param is None:
                        continue  # not held by this step (ZeRO steps one group at a time)
                else:
                    param = self._params.get(f.target)
                    if param is None:
                        param = root.get_parameter(f.target)
                p = local_shard(param)
                if f.kind == "param":
                    f.payload.apply_(p)
                elif f.kind == "grad":
                    if param.grad is None:  # a DTensor's gradient is on the DTensor
                        continue
                    f.payload.apply_(local_shard(param.grad))
                else:
                    how, key = f.payload
                    slot = _slot(optimizer, param, key)
                    if slot is None:
                        continue  # no state yet (first step): nothing to corrupt
                    how.apply_(local_shard(slot))
                self._fire(f)

        return hook

    def _comm_delay(self, f: _Fault) -> Callable[[str], float]:
        def delay(kind: str) -> float:
            if self._active(f) and f.target in ("any", kind):
                self._fire(f)
                return float(f.payload)
            return 0.0

        return delay

    def _veto(self, f: _Fault) -> Callable[[str], bool]:
        def veto(path: str) -> bool:
            if self._active(f) and f.target in (None, path):
                self._fire(f)
                return True
            return False

        return veto


def _slot(opt: torch.optim.Optimizer, param: torch.Tensor, key: str) -> torch.Tensor | None:
    """``param``'s optimizer slot ``key`` (default: its first element-wise floating slot);
    None before the optimizer made any."""
    state = opt.state.get(param, {})
    slots = [
        k
        for k, v in state.items()
        if isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel() > 1
    ]
    if not slots:
        return None
    return state[key or slots[0]]  # type: ignore[no-any-return]


@contextmanager
def comm_delay(kind: str, seconds: float) -> Iterator[None]:
    """Inside: this rank stalls ``seconds`` in each of SCOUT's timed diagnostic collectives
    on a group of ``kind`` (``"replica"``, ``"shard"``, ``"tp"``, ``"ep"`` (before each
    replayed MoE all-to-all) or ``"any"``), and in a
    plugin's own timed collective that reads ``plugin_api.injected_delay(kind)``.

    The model-free counterpart of :meth:`Trigger.delay_collective`, for a test that
    decides itself when the link is slow (e.g. only on one rank)."""
    wanted = float(seconds)
    remove = taps.add_comm_delay(lambda got: wanted if kind in ("any", got) else 0.0)
    try:
        yield
    finally:
        remove()


def _corrupt_first(output: Any, how: Corruption) -> Any:
    if isinstance(output, torch.Tensor):
        if output.is_floating_point():
            bad = output.clone()
            how.apply_(local_shard(bad))  # a DTensor's own shard: no collective
            return bad
        return output
    if isinstance(output, tuple | list):
        items = list(output)
        for i, item in enumerate(items):
            if isinstance(item, torch.Tensor) and item.is_floating_point():
                items[i] = _corrupt_first(item, how)
                return type(output)(items)
        return output
    return output


def _this_rank() -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))
