"""Custody: a rank vouches for its own parameters and optimizer slots between two steps.

Contract: with ``slices > 0`` (0 is off: no hook at all), step hooks on the optimizers the
adapter lists (the parameters :mod:`.optimizer` walks and their element-wise slots) fold one
rotating range of the local elements right after every ``every``-th step, and again right
before the next step that writes the same tensor. :meth:`Custody.collect`, called at each
replay boundary, returns the pieces whose fold words differ (one device read, none inside a
step), and :meth:`Custody.records` makes each a rank-scoped ``sdc`` on ``params/custody`` (a
parameter) or ``optimizer/custody`` (a slot) naming this rank: no peer, no collective. An
optimizer's ``load_state_dict`` and :meth:`Custody.forget` drop every signature; any other
write between two steps reads as a violation. docs/replay.md, "Parameter custody".
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from scout_core.decision.signature import finalize, fold
from scout_core.records.record import VERDICT_SCHEMA, Record
from scout_core.topology.shards import local_shard
from scout_core.vocabulary import Failure, Mode, Scope, Status

__all__ = ["SLOT_SURFACE", "SURFACE", "Custody"]

log = logging.getLogger(__name__)

SURFACE = "params/custody"
SLOT_SURFACE = "optimizer/custody"
_MAX_VIEWS = 256
"""Cached parameter views per custody (ZeRO-3 shows one per sub-group)."""


@dataclass(frozen=True, slots=True)
class _Held:
    """A tensor custody has seen: where its elements sit in the rotation."""

    tensor: torch.Tensor
    """The optimizer's parameter (kept so its ``id`` cannot be reused meanwhile)."""
    key: str
    """The optimizer slot (``state[tensor][key]``), or ``""`` for the parameter itself."""
    dtype: torch.dtype
    index: int
    """Order of first sight (0-based)."""
    offset: int
    """Its first element's position in the rotation."""
    numel: int
    where: tuple[int, int, int]
    """(optimizer, param group, position in the group) when first seen."""


@dataclass(frozen=True, slots=True)
class _Seal:
    """A custody signature: the fold words of ``[lo, hi)`` of a tensor's local elements."""

    lo: int
    hi: int
    words: torch.Tensor
    step: int
    slice: int


@dataclass(frozen=True, slots=True)
class _View:
    """The tensors one optimizer holds at a step, by rotation offset."""

    ids: frozenset[int]
    starts: list[int]
    helds: list[_Held]


@dataclass(frozen=True, slots=True)
class _Check:
    held: _Held
    seal: _Seal
    now: torch.Tensor
    step: int
    differs: torch.Tensor
    """A 0-d bool on the tensor's device: read at :meth:`Custody.collect`, so a check on
    an accelerator never synchronises inside the step."""


@dataclass(frozen=True, slots=True)
class Violation:
    """A tensor piece that changed between the step that signed it and the next one writing it."""

    held: _Held
    seal: _Seal
    step: int
    signed: int
    found: int

    @property
    def surface(self) -> str:
        return SLOT_SURFACE if self.held.key else SURFACE

    def detail(self, slices: int, every: int) -> dict[str, Any]:
        oi, gi, pos = self.held.where
        what = f"optimizer state ({self.held.key})" if self.held.key else "parameters"
        slot = {"slot": self.held.key} if self.held.key else {}
        return {
            "recipe": "custody",
            "evidence": [f"{self.signed:016x}", f"{self.found:016x}"],
            "reason": f"{what} changed between two optimizer steps, with no writer",
            "signed_step": self.seal.step,
            "checked_step": self.step,
            "slice": self.seal.slice,
            "slices": slices,
            "every": every,
            "optimizer": oi,
            "param_group": gi,
            "param": pos,
            "elements": [self.seal.lo, self.seal.hi],
            "numel": self.held.numel,
            "dtype": str(self.held.dtype).removeprefix("torch."),
            **slot,
        }


class Custody:
    """Signs a rotating range of the local parameters and slots after every ``every``-th
    step and checks it before the next (module doc); ``step`` returns the current iteration."""

    def __init__(
        self,
        optimizers: Sequence[torch.optim.Optimizer],
        *,
        slices: int,
        step: Callable[[], int],
        every: int = 1,
    ) -> None:
        if slices < 0:
            raise ValueError(f"slices must be >= 0, got {slices}")
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.optimizers = list(optimizers)
        self.slices = slices
        self.every = min(every, max(1, slices))
        self.windows = max(1, slices // self.every)
        """Ranges the rotation is cut into: one is signed at each working iteration."""
        self._step = step
        self._held: dict[tuple[int, str], _Held] = {}
        self._total = 0
        self._seals: dict[tuple[int, str], _Seal] = {}
        self._checks: list[_Check] = []
        self._views: dict[tuple[tuple[int, ...], int], _View] = {}
        self.checked = 0
        """Tensor pieces compared so far (a test reads it: custody ran at all)."""
        self._handles: list[RemovableHandle] = []
        if slices == 0:
            return
        for oi, gi, pos, p in self._visible(self.optimizers):
            self._see(p, (oi, gi, pos))
        for oi, opt in enumerate(self.optimizers):
            self._handles.append(opt.register_step_pre_hook(self._pre(oi)))
            self._handles.append(opt.register_step_post_hook(self._post(oi)))
            # A checkpoint load writes the parameters outside a step (docs/replay.md, Limits).
            self._handles.append(opt.register_load_state_dict_post_hook(self._loaded))

    @property
    def enabled(self) -> bool:
        return self.slices > 0

    @property
    def total(self) -> int:
        """Local elements in the rotation (every tensor seen so far)."""
        return self._total

    def width(self) -> int:
        """Elements of one range: the rotation's length cut into ``windows`` ranges."""
        return max(1, -(-self._total // self.windows))

    def span(self, held_offset: int, numel: int, index: int) -> tuple[int, int] | None:
        """Range ``index``'s local ``[lo, hi)`` in a tensor starting at ``held_offset``, or None."""
        w = self.width()
        a, b = index * w, (index + 1) * w
        lo, hi = max(a, held_offset), min(b, held_offset + numel)
        if lo >= hi:
            return None
        return lo - held_offset, hi - held_offset

    @staticmethod
    def _visible(
        optimizers: Sequence[torch.optim.Optimizer],
    ) -> Iterator[tuple[int, int, int, torch.Tensor]]:
        for oi, opt in enumerate(optimizers):
            for gi, group in enumerate(opt.param_groups):
                for pos, p in enumerate(group["params"]):
                    yield oi, gi, pos, p

    def _see(
        self,
        p: torch.Tensor,
        where: tuple[int, int, int],
        key: str = "",
        value: torch.Tensor | None = None,
    ) -> _Held:
        """The rotation entry of parameter ``p`` (``key`` ``""``) or of its slot ``key``."""
        held = self._held.get((id(p), key))
        if held is None:
            local = local_shard(p if value is None else value)
            n = local.numel()
            held = _Held(p, key, local.dtype, len(self._held), self._total, n, where)
            self._held[(id(p), key)] = held
            self._total += n
            self._views.clear()  # the rotation grew: slice ranges moved
        return held

    def _view(self, oi: int, opt: torch.optim.Optimizer) -> _View:
        """The tensors ``opt`` holds now (ZeRO narrows or swaps its groups for a step) and their
        slots, by rotation offset; cached by their ids and the state's size, so a healthy step
        costs one C pass of ``id`` over the parameter lists. A slot joins once it exists."""
        groups = opt.param_groups
        ids = tuple(map(id, chain.from_iterable([g["params"] for g in groups])))
        view = self._views.get((ids, len(opt.state)))
        if view is None:
            helds = []
            for gi, g in enumerate(groups):
                for pos, p in enumerate(g["params"]):
                    helds.append(self._see(p, (oi, gi, pos)))
                    helds += [self._see(p, (oi, gi, pos), k, v) for k, v in _slots(opt, p)]
            helds.sort(key=lambda h: h.offset)
            if len(self._views) >= _MAX_VIEWS:
                self._views.clear()
            view = _View(frozenset(ids), [h.offset for h in helds], helds)
            self._views[(ids, len(opt.state))] = view
        return view

    def _pre(self, oi: int) -> Callable[[torch.optim.Optimizer, Any, Any], None]:
        def hook(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            if not self._seals:
                return
            mine = self._view(oi, opt).ids
            due = [key for key in self._seals if key[0] in mine]
            if not due:
                return
            step = self._step()
            with torch.no_grad():
                for key in due:
                    seal = self._seals.pop(key)
                    held = self._held[key]
                    values = _values(opt, held)
                    if values is None:  # the optimizer dropped the slot: nothing to hold
                        continue
                    now = fold(values[seal.lo : seal.hi])
                    differs = torch.ne(now, seal.words).any()
                    self._checks.append(_Check(held, seal, now, step, differs))

        return hook

    def _post(self, oi: int) -> Callable[[torch.optim.Optimizer, Any, Any], None]:
        def hook(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            step = self._step()
            if step % self.every:
                return
            view = self._view(oi, opt)
            index = (step // self.every) % self.windows
            w = self.width()
            a, b = index * w, (index + 1) * w
            # The tensors whose elements meet [a, b): from the last one starting at or
            # before a, while they start before b.
            i = max(0, bisect.bisect_right(view.starts, a) - 1)
            with torch.no_grad():
                for held in view.helds[i:]:
                    if held.offset >= b:
                        break
                    got = self.span(held.offset, held.numel, index)
                    values = None if got is None else _values(opt, held)
                    if got is None or values is None:
                        continue
                    lo, hi = got
                    words = fold(values[lo:hi])
                    self._seals[(id(held.tensor), held.key)] = _Seal(lo, hi, words, step, index)

        return hook

    def _loaded(self, opt: torch.optim.Optimizer) -> None:
        self.forget()

    def collect(self) -> list[Violation]:
        """The pieces checked since the last call that changed: one device read per call on
        an accelerator, none on a healthy CPU step without checks."""
        checks, self._checks = self._checks, []
        if not checks:
            return []
        self.checked += len(checks)
        flags = torch.stack([c.differs.to("cpu") for c in checks]).tolist()
        out = []
        for check, bad in zip(checks, flags, strict=True):
            if not bad:
                continue
            dtype, shape = check.held.dtype, (check.seal.hi - check.seal.lo,)
            out.append(
                Violation(
                    check.held,
                    check.seal,
                    check.step,
                    finalize(check.seal.words, dtype, shape),
                    finalize(check.now, dtype, shape),
                )
            )
        return out

    def records(
        self, found: Sequence[Violation], *, run_id: str, rank: int, hosts: Mapping[int, str]
    ) -> list[Record]:
        """One rank-scoped ``sdc`` record per violating piece (docs/replay.md)."""
        return [
            Record(
                schema=VERDICT_SCHEMA,
                run_id=run_id,
                step=v.step,
                surface=v.surface,
                mode=Mode.EXACT,
                status=Status.ATTRIBUTED,
                failure=Failure.SDC,
                group=(rank,),
                outliers=(rank,),
                scope=Scope.RANK,
                hosts=(hosts.get(rank, "?"),),
                detail=v.detail(self.slices, self.every),
            )
            for v in found
        ]

    def forget(self) -> None:
        """Drop every signature and pending check: the parameters were written outside an
        optimizer step (a restore), so what was signed no longer holds."""
        self._seals.clear()
        self._checks.clear()

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self.forget()


def _slots(opt: torch.optim.Optimizer, p: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """``p``'s element-wise floating slots in ``opt`` (Adam's ``exp_avg``, ``exp_avg_sq``)."""
    n = local_shard(p).numel()
    state = opt.state.get(p)
    if not state:
        return []
    return sorted(
        (k, v)
        for k, v in state.items()
        if isinstance(v, torch.Tensor)
        and v.is_floating_point()
        and v.numel() > 1
        and local_shard(v).numel() == n
    )


def _values(opt: torch.optim.Optimizer, held: _Held) -> torch.Tensor | None:
    """The flat local elements ``held`` stands for now: the parameter, or its slot (None
    when the optimizer holds no such slot any more)."""
    if not held.key:
        return local_shard(held.tensor).detach().reshape(-1)
    value = opt.state.get(held.tensor, {}).get(held.key)
    if not isinstance(value, torch.Tensor):
        return None
    return local_shard(value).detach().reshape(-1)
