"""Capture one module call during training so it can be replayed at the step boundary.

Contract: :meth:`Capturer.arm` hooks only the modules due this iteration (and unhooks the rest),
so an iteration with nothing due runs no SCOUT code in any forward. The first grad-enabled call
of an armed module keeps its args/kwargs (tensors cloned, the rest by reference), requires-grad
mask and pre-call RNG states, then the gradient flowing into each output; later calls and
replay's own are ignored, and :meth:`Capturer.take` returns only a complete capture of this
iteration. A ref's ``capture_copy`` may be collective over its shard group, so it runs on every
member, a vetoed one too; a copy that raises drops the capture (the round reads inconclusive),
never the training step. The steps in full: docs/replay.md, "One round, step by step".
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from scout_core.integration.adapter import ModuleRef, RngStream
from scout_core.replay import taps

__all__ = ["Capture", "Capturer", "flatten", "unflatten"]

log = logging.getLogger(__name__)

Copy = Callable[[torch.Tensor], torch.Tensor]


def _default_copy(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone()


def flatten(tree: Any) -> tuple[list[Any], Any]:
    """Leaves of a tuple/list/dict pytree and a spec to rebuild it with :func:`unflatten`."""
    if isinstance(tree, tuple | list):
        leaves: list[Any] = []
        specs: list[Any] = []
        for item in tree:
            sub, spec = flatten(item)
            leaves.extend(sub)
            specs.append((len(sub), spec))
        return leaves, (type(tree), specs)
    if isinstance(tree, dict):
        leaves = []
        specs = []  # (key, leaf count, sub-spec) per entry
        for key in tree:
            sub, spec = flatten(tree[key])
            leaves.extend(sub)
            specs.append((key, len(sub), spec))
        return leaves, (dict, specs)
    return [tree], None


def unflatten(leaves: Sequence[Any], spec: Any) -> Any:
    """Inverse of :func:`flatten`."""
    if spec is None:
        return leaves[0]
    kind, specs = spec
    at = 0
    if kind is dict:
        out: dict[Any, Any] = {}
        for key, n, sub in specs:
            out[key] = unflatten(leaves[at : at + n], sub)
            at += n
        return out
    items = []
    for n, sub in specs:
        items.append(unflatten(leaves[at : at + n], sub))
        at += n
    if kind is tuple or kind is list:
        return kind(items)
    return kind(*items)  # a namedtuple


@dataclass
class Capture:
    """One recorded module call."""

    path: str
    step: int
    leaves: list[Any]
    """Flattened ``(args, kwargs)``; tensors are detached clones."""
    spec: Any
    requires_grad: tuple[bool, ...]
    """Per leaf: whether it was a tensor that required grad."""
    rng: dict[str, torch.Tensor]
    """Pre-call state of every RNG stream the adapter names."""
    out_requires_grad: tuple[bool, ...] = ()
    """Per output tensor leaf: whether it required grad (and so may receive a gradient)."""
    grads: list[torch.Tensor | None] = field(default_factory=list)
    """Gradient that flowed into each output tensor leaf; None until it arrives."""
    grads_seen: list[bool] = field(default_factory=list)
    """Per output tensor leaf: whether backward reached it (its gradient hook fired)."""
    outputs_seen: bool = False

    @property
    def tensors(self) -> list[torch.Tensor]:
        return [x for x in self.leaves if isinstance(x, torch.Tensor)]

    def complete(self) -> bool:
        """Inputs recorded and every output that backward reached has its gradient copied.

        Read at the boundary, after backward: an output that required grad but was never
        reached (unused, e.g. an MoE gate's auxiliary loss left out of the loss) is replayed
        without a gradient on every peer alike. A gradient that arrived but could not be
        copied leaves the capture incomplete."""
        return self.outputs_seen and all(
            g is not None or not seen for g, seen in zip(self.grads, self.grads_seen, strict=True)
        )


class Capturer:
    """Hooks on the candidate modules; arms the ones due and keeps their captures."""

    def __init__(self, refs: Iterable[ModuleRef], rng_streams: Sequence[RngStream]) -> None:
        self._rng = list(rng_streams)
        self._refs = {ref.path: ref for ref in refs}
        self._armed: set[str] = set()
        self._step = 0
        self._captures: dict[str, Capture] = {}
        self._keep = False
        self._last: dict[str, Capture] = {}
        self.replaying = False
        self._handles: dict[str, tuple[RemovableHandle, RemovableHandle]] = {}

    def arm(self, step: int, paths: Iterable[str]) -> None:
        """Capture ``paths`` during iteration ``step`` (re-hooking as needed); drops older ones."""
        self._step = step
        self._armed = set(paths)
        self._captures = {}
        for path in [p for p in self._handles if p not in self._armed]:
            for handle in self._handles.pop(path):
                handle.remove()
        for path in self._armed - self._handles.keys():
            ref = self._refs[path]
            copy = ref.capture_copy or _default_copy
            # ``hooked``: where a wrapper (activation checkpointing, compile) lets the
            # hooks fire once per training forward.
            self._handles[path] = (
                ref.hooked.register_forward_pre_hook(self._pre(path, copy), with_kwargs=True),
                ref.hooked.register_forward_hook(self._post(path, copy)),
            )

    @property
    def hooked(self) -> tuple[str, ...]:
        """The module paths that carry capture hooks right now."""
        return tuple(sorted(self._handles))

    @property
    def armed(self) -> bool:
        """Whether any module is armed or a capture is held (else disarming is a no-op)."""
        return bool(self._armed or self._captures)

    def take(self, path: str) -> Capture | None:
        """This iteration's capture of ``path`` if it is complete, else None."""
        cap = self._captures.pop(path, None)
        if cap is None or cap.step != self._step or not cap.complete():
            return None
        if self._keep:
            self._last[path] = cap
        return cap

    def keep_last(self, enabled: bool = True) -> None:
        """Keep (or stop keeping) the last complete capture of each module taken."""
        self._keep = enabled
        if not enabled:
            self._last.clear()

    def last(self, path: str) -> Capture | None:
        """The last complete capture of ``path`` taken while keeping was on, or None."""
        return self._last.get(path)

    def close(self) -> None:
        for handles in self._handles.values():
            for h in handles:
                h.remove()
        self._handles.clear()
        self._captures = {}
        self._last = {}
        self._armed = set()

    def _pre(self, path: str, copy: Copy) -> Any:
        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if self.replaying or path in self._captures or not torch.is_grad_enabled():
                return
            leaves, spec = flatten((args, kwargs))
            try:
                kept = [copy(x) if isinstance(x, torch.Tensor) else x for x in leaves]
            except Exception as exc:  # the round reads inconclusive; training goes on
                log.warning("could not capture the inputs of %s: %s", path, exc)
                return
            if taps.capture_vetoed(path):
                return
            mask = tuple(isinstance(x, torch.Tensor) and x.requires_grad for x in leaves)
            rng = {s.name: s.get() for s in self._rng}
            self._captures[path] = Capture(path, self._step, kept, spec, mask, rng)

        return hook

    def _post(self, path: str, copy: Copy) -> Any:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            cap = self._captures.get(path)
            if cap is None or self.replaying or cap.outputs_seen:
                return
            cap.outputs_seen = True
            outs = [x for x in flatten(output)[0] if isinstance(x, torch.Tensor)]
            cap.out_requires_grad = tuple(t.requires_grad for t in outs)
            cap.grads = [None] * len(outs)
            cap.grads_seen = [False] * len(outs)
            for i, t in enumerate(outs):
                if t.requires_grad:
                    t.register_hook(self._grad_hook(cap, i, copy))  # type: ignore[no-untyped-call]  # torch stub lacks annotations

        return hook

    @staticmethod
    def _grad_hook(cap: Capture, i: int, copy: Copy) -> Any:
        def hook(grad: torch.Tensor) -> None:
            cap.grads_seen[i] = True
            if cap.grads[i] is None:
                try:
                    cap.grads[i] = copy(grad)
                except Exception as exc:  # incomplete capture: the round reads inconclusive
                    log.warning("could not capture a gradient of %s: %s", cap.path, exc)

        return hook
