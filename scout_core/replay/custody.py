"""Parameter custody: a rank vouches for its own parameters between two writes.

Replay compares copies across peers; a weight that changed in memory on one rank
cannot be refereed that way when fewer than three copies exist (two copies that
differ do not say which one is right; a pure FSDP shard or a ZeRO partition has no
second copy at all). Custody needs no peer: only the optimizer step may write a
parameter, so a parameter that changed between two steps changed without a writer.

[The mechanism]
Each optimizer step is bracketed by two hooks of the optimizer the adapter lists
(the same tensors :mod:`scout_core.replay.optimizer` walks: the model's parameters
under DDP, this rank's DTensor shard under FSDP2 / HSDP / TP, the flat fp32 partition
that DeepSpeed's ZeRO 1-3 and Megatron's distributed optimizer step on):

* right after the step (a step post-hook), the rank folds the part of the current
  *custody slice* that the step just wrote and keeps the fold words (at most 4 KiB
  per tensor piece) as its custody signature;
* right before the next step that writes the same tensor (a step pre-hook), it
  folds the same elements again. Words that differ mean the parameter changed while
  nothing should have written it: a ``scout.verdict/1`` record, failure ``sdc``,
  surface ``params/custody``, scope ``rank``, naming this rank (:meth:`Custody.collect`,
  called by the replay driver at each boundary; the record goes through the same
  delivery as every verdict).

The hooks see the optimizer's ``param_groups`` *as they are during the step*: ZeRO
narrows them to the one group it steps (ZeRO 1/2) or swaps its flat sub-group in
(ZeRO-3), so each group is signed after its own step and checked before its own next
step, whenever DeepSpeed runs them. Tensors not listed when custody starts (ZeRO-3's
swapped-in sub-groups) join the rotation the first time a step writes them.

[The rotation]
The local elements of every tensor custody has seen are laid end to end in a fixed
order (the order they were first seen) and cut into ``windows = slices // every``
equal ranges (``every`` is at most ``slices``). Custody works at every ``every``-th
iteration only: at iteration ``t`` with ``t mod every == 0`` the step signs range
``(t // every) mod windows`` of each tensor it writes, and the next step checks it.
Every element is therefore signed, and checked at the next step, once in every
``windows * every <= slices`` iterations: a fault that keeps coming back after the
writes (a cell that does not hold what the optimizer writes) is named within one
rotation. A one-time change is seen when it falls between the step that signed its
element and the next one: once in a rotation, whatever ``every`` is. ``every`` only
spreads the cost: a working iteration costs two folds of ``1 / windows`` of the local
parameters (one read each) plus a fixed part (tens of microseconds per tensor piece
the range touches, and the hooks' own Python), and the other ``every - 1`` iterations
cost an empty check in each hook, so the fixed part is paid once in ``every`` steps.

[The check point, and why not the forward]
The check runs before the next *write*, which every framework exposes the same way
(the step pre-hook of the optimizer it lists). A check before the next *read* (the
forward pre-hook, or before an FSDP all-gather) would not see the tensors custody
holds under mixed precision: the forward reads a bf16 model copy that the step
rewrites from the fp32 master every iteration, and FSDP2 gathers in its own root
pre-forward hook before any module hook of ours could run. So a change between the
step and the next forward is read by one forward and backward before the check
names it, in the same iteration; the checkpoint gate treats the verdict as a
localized SDC and restores verified state, so what that iteration computed from it
is never certified.

[Limits]
* A change to elements outside the slice signed at that step has no custody
  signature: a one-time flip there is not seen by custody. Under two copies the
  replicas then differ with no evidence of which one is right (group scope); with one
  copy it is silent. ``slices = 1`` signs every element every step, at twice the
  memory traffic of reading all local parameters once per step.
* A fault in the write itself (the optimizer computes or stores a wrong value) is
  signed as written: that is the optimizer replay's surface, not custody's.
* Anything else that writes parameters between steps reads as a custody violation.
  Checkpoint loads do not: SCOUT's own restores call :meth:`Custody.forget`, and so does
  the ``load_state_dict`` of every optimizer custody holds (a load-state-dict post-hook),
  which the three frameworks' checkpoint loads run whenever they load optimizer state
  (DCP's ``set_state_dict``, TorchTitan's optimizer container, DeepSpeed's and
  Megatron's ``load_checkpoint``). A write with no optimizer load (a model-only load in
  the middle of a run, an EMA swap, weight clamping outside the optimizer) must call
  ``session.replay.custody.forget()``, or run with ``custody_slices = 0``.
* The fault injector that tests use (:meth:`scout_core.testing.Trigger.flip_param_after_step`)
  must register its step post-hook after SCOUT's, i.e. attach after ``scout.enable``:
  torch runs an optimizer's post-hooks in registration order.
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
from scout_core.records.evidence import VERDICT_SCHEMA, Record
from scout_core.topology.shards import local_shard
from scout_core.vocabulary import Failure, Mode, Scope, Status

__all__ = ["SURFACE", "Custody"]

log = logging.getLogger(__name__)

SURFACE = "params/custody"
"""The surface of a custody verdict."""
_MAX_VIEWS = 256
"""Cached parameter views per custody (ZeRO-3 shows one per sub-group)."""


@dataclass(frozen=True, slots=True)
class _Held:
    """A tensor custody has seen: where its elements sit in the rotation."""

    tensor: torch.Tensor
    """The optimizer's parameter (kept so its ``id`` cannot be reused meanwhile)."""
    index: int
    """Order of first sight (0-based)."""
    offset: int
    """Its first element's position in the rotation."""
    numel: int
    """Its local elements."""
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
    """One tensor piece whose elements changed between the step that signed them and the
    step about to write them again."""

    held: _Held
    seal: _Seal
    step: int
    signed: int
    found: int
    dtype: torch.dtype

    def detail(self, slices: int, every: int) -> dict[str, Any]:
        oi, gi, pos = self.held.where
        return {
            "recipe": "custody",
            "evidence": [f"{self.signed:016x}", f"{self.found:016x}"],
            "reason": "parameters changed between two optimizer steps, with no writer",
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
            "dtype": str(self.dtype).removeprefix("torch."),
        }


class Custody:
    """Signs a rotating range of the local parameters after every ``every``-th optimizer
    step and checks it before the next step (module doc). ``slices = 0`` is off: no hook
    at all.

    ``step`` returns the current iteration (the replay driver's step clock)."""

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
        """Custody signs at every this many iterations (``every``, at most ``slices``)."""
        self.windows = max(1, slices // self.every)
        """Ranges the rotation is cut into: one is signed at each working iteration."""
        self._step = step
        self._held: dict[int, _Held] = {}
        self._total = 0
        self._seals: dict[int, _Seal] = {}
        self._checks: list[_Check] = []
        self._views: dict[tuple[int, ...], _View] = {}
        self.checked = 0
        """Tensor pieces compared so far (a test reads it: custody ran at all)."""
        self._handles: list[RemovableHandle] = []
        if slices == 0:
            return
        for oi, gi, pos, p in self._visible(self.optimizers):
            self._see(p, oi, gi, pos)
        for oi, opt in enumerate(self.optimizers):
            self._handles.append(opt.register_step_pre_hook(self._pre(oi)))
            self._handles.append(opt.register_step_post_hook(self._post(oi)))
            # A checkpoint load writes the parameters outside a step (module doc, Limits).
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
        """The local range ``[lo, hi)`` of range ``index`` inside a tensor whose elements
        start at ``held_offset`` of the rotation; None when the slice misses it."""
        w = self.width()
        a, b = index * w, (index + 1) * w
        lo, hi = max(a, held_offset), min(b, held_offset + numel)
        if lo >= hi:
            return None
        return lo - held_offset, hi - held_offset

    # -- the hooks ------------------------------------------------------------------------

    @staticmethod
    def _visible(
        optimizers: Sequence[torch.optim.Optimizer],
    ) -> Iterator[tuple[int, int, int, torch.Tensor]]:
        for oi, opt in enumerate(optimizers):
            for gi, group in enumerate(opt.param_groups):
                for pos, p in enumerate(group["params"]):
                    yield oi, gi, pos, p

    def _see(self, p: torch.Tensor, oi: int, gi: int, pos: int) -> _Held:
        held = self._held.get(id(p))
        if held is None:
            n = local_shard(p).numel()
            held = _Held(p, len(self._held), self._total, n, (oi, gi, pos))
            self._held[id(p)] = held
            self._total += n
            self._views.clear()  # the rotation grew: slice ranges moved
        return held

    def _view(self, oi: int, opt: torch.optim.Optimizer) -> _View:
        """The tensors ``opt`` holds right now (ZeRO narrows or swaps its groups for a
        step), ordered by rotation offset; cached by their identities, so a healthy step
        costs one pass of ``id`` over the parameter lists in C."""
        groups = opt.param_groups
        ids = tuple(map(id, chain.from_iterable([g["params"] for g in groups])))
        view = self._views.get(ids)
        if view is None:
            helds = [
                self._see(p, oi, gi, pos)
                for gi, g in enumerate(groups)
                for pos, p in enumerate(g["params"])
            ]
            helds.sort(key=lambda h: h.offset)
            if len(self._views) >= _MAX_VIEWS:
                self._views.clear()
            view = _View(frozenset(ids), [h.offset for h in helds], helds)
            self._views[ids] = view
        return view

    def _pre(self, oi: int) -> Callable[[torch.optim.Optimizer, Any, Any], None]:
        def hook(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            if not self._seals:
                return
            mine = self._view(oi, opt).ids
            due = [pid for pid in self._seals if pid in mine]
            if not due:
                return
            step = self._step()
            with torch.no_grad():
                for pid in due:
                    seal = self._seals.pop(pid)
                    held = self._held[pid]
                    now = fold(_flat(held.tensor)[seal.lo : seal.hi])
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
                    if got is None:
                        continue
                    lo, hi = got
                    words = fold(_flat(held.tensor)[lo:hi])
                    self._seals[id(held.tensor)] = _Seal(lo, hi, words, step, index)

        return hook

    def _loaded(self, opt: torch.optim.Optimizer) -> None:
        self.forget()

    # -- results --------------------------------------------------------------------------

    def collect(self) -> list[Violation]:
        """Compare the checks made since the last call; the pieces that changed. One
        device read per call on an accelerator, none on a healthy CPU step without
        checks."""
        checks, self._checks = self._checks, []
        if not checks:
            return []
        self.checked += len(checks)
        flags = torch.stack([c.differs.to("cpu") for c in checks]).tolist()
        out = []
        for check, bad in zip(checks, flags, strict=True):
            if not bad:
                continue
            p = check.held.tensor
            dtype, shape = local_shard(p).dtype, (check.seal.hi - check.seal.lo,)
            out.append(
                Violation(
                    check.held,
                    check.seal,
                    check.step,
                    finalize(check.seal.words, dtype, shape),
                    finalize(check.now, dtype, shape),
                    dtype,
                )
            )
        return out

    def records(
        self, found: Sequence[Violation], *, run_id: str, rank: int, hosts: Mapping[int, str]
    ) -> list[Record]:
        """One rank-scoped ``sdc`` record per violating piece (module doc)."""
        return [
            Record(
                schema=VERDICT_SCHEMA,
                run_id=run_id,
                step=v.step,
                surface=SURFACE,
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


def _flat(p: torch.Tensor) -> torch.Tensor:
    return local_shard(p).detach().reshape(-1)
