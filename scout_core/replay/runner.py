"""The replay boundary for one layer recipe (paper Algorithm 2), on copied state.

At the boundary after a due optimizer step every peer of a comparison group runs
the same sequence, so the collectives always match:

1. **Readiness C3** (exact): a digest of recipe, capture step, tensor metadata,
   requires-grad masks and software stack, plus the thread count. A peer that
   missed the capture contributes nothing, which makes the round *inconclusive*
   on every peer, and everyone returns before any recipe collective: a missing
   capture can never strand peers inside a broadcast. When the parameter gather
   runs on groups that cross replica groups (HSDP's shard group, the TP group),
   each replica group's readiness is AND-ed over those groups too, so a group
   that is not ready can never strand a shard or TP partner inside a gather.
2. The source peer (rotating with the step) **broadcasts** its captured inputs,
   the incoming output gradients and its pre-forward RNG states as one byte buffer
   (timed: ``t_bcast``, the peer group's own communication).
3. Under FSDP or TP the parameters are **gathered** on the diagnostic shard or TP
   group (timed: ``t_gather``); each replica peer first signs its local shards.
4. For each input variant (``0.1x, x, 10x``) the module runs on copies
   (parameters, buffers, inputs) under scoped deterministic mode with the agreed
   thread count and the source's RNG (timed: ``t_M``), and ``autograd.grad`` from
   the broadcast output gradient yields input and parameter gradients without
   touching any live ``.grad``.
5. **One exchange** carries exact signatures of what was received, the
   materialised parameters, outputs, input gradients and parameter gradients, and
   the statistical timings; each keeps its own bitmap.
6. Each peer restores its own RNG streams, thread count and deterministic flag.

A replay that raises on some peer (an unsupported op, an OOM) contributes no
evidence rather than failing the job; the exchange then reads inconclusive.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from scout_core.decision.agreement import all_ok as all_ready
from scout_core.decision.c3 import C3Result, Surface, exchange
from scout_core.integration.adapter import ModuleRef, RngStream
from scout_core.replay import taps
from scout_core.replay.capture import Capture, Capturer, unflatten
from scout_core.replay.packing import pack, sign, unpack
from scout_core.replay.schedule import Recipe
from scout_core.topology.groups import PeerGroup
from scout_core.vocabulary import Mode, Status

__all__ = [
    "LayerRunner",
    "RoundOutcome",
    "deterministic_scope",
    "pack",
    "timed_broadcast",
    "unpack",
]

log = logging.getLogger("scout.replay")

SURFACES = ("received", "params", "forward", "input_grad", "param_grad")
"""Exact surfaces of a layer recipe, in exchange order."""


@dataclass
class RoundOutcome:
    """What one recipe round decided, identical on every peer of the group."""

    recipe: Recipe
    step: int
    group: tuple[int, ...]
    ready: bool
    results: dict[str, C3Result] = field(default_factory=dict)
    reason: str | None = None
    """Why the round is inconclusive before any comparison (readiness), if it is."""
    source: int | None = None
    """The global rank that broadcast the replay inputs."""


@contextmanager
def deterministic_scope(enabled: bool, threads: int) -> Iterator[None]:
    """Deterministic algorithms and a pinned intra-op thread count, restored on exit."""
    prev_det = torch.are_deterministic_algorithms_enabled()
    prev_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    prev_threads = torch.get_num_threads()
    try:
        if enabled and not prev_det:
            torch.use_deterministic_algorithms(True)
        if threads != prev_threads:
            torch.set_num_threads(threads)
        yield
    finally:
        if enabled and not prev_det:
            torch.use_deterministic_algorithms(prev_det, warn_only=prev_warn)
        if torch.get_num_threads() != prev_threads:
            torch.set_num_threads(prev_threads)


@contextmanager
def _rng_scope(streams: Sequence[RngStream]) -> Iterator[None]:
    saved = [(s, s.get()) for s in streams]
    try:
        yield
    finally:
        for s, state in saved:
            s.set(state)


def _leaf_meta(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return ["T", str(x.dtype), list(x.shape)]
    if x is None or isinstance(x, bool | int | float | str):
        return ["V", repr(x)]
    return ["O", type(x).__qualname__]


def _digest(obj: Any) -> int:
    text = json.dumps(obj, separators=(",", ":"), sort_keys=True)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


Materialize = Callable[[ModuleRef], AbstractContextManager[Mapping[str, torch.Tensor]]]
ModuleCall = Callable[[nn.Module, dict[str, torch.Tensor], tuple[Any, ...], dict[str, Any]], Any]


def functional_call(
    module: nn.Module, state: dict[str, torch.Tensor], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """Run ``module`` with ``state`` bound in place of its parameters and buffers."""
    return torch.func.functional_call(module, state, args, kwargs)


class LayerRunner:
    """Runs layer recipes for one comparison group."""

    def __init__(
        self,
        *,
        peers: PeerGroup,
        modules: Mapping[str, ModuleRef],
        capturer: Capturer,
        rng_streams: Sequence[RngStream],
        materialize: Materialize,
        variants: Sequence[float],
        kappa: float,
        deterministic: bool = True,
        threads: int | None = None,
        gathered: bool = False,
        call: ModuleCall = functional_call,
        local_shards: Callable[[ModuleRef], Sequence[torch.Tensor]] | None = None,
        closure: Sequence[PeerGroup] = (),
    ) -> None:
        self.peers = peers
        self.modules = dict(modules)
        self.capturer = capturer
        self.rng = list(rng_streams)
        self.materialize = materialize
        self.variants = tuple(variants)
        self.kappa = kappa
        self.deterministic = deterministic
        self.threads = threads
        self.gathered = gathered
        self.call = call
        self.local_shards = local_shards
        self.closure = tuple(closure)
        """Gather groups that cross replica groups: readiness is AND-ed over them."""
        self._stack = json.dumps([torch.__version__, str(torch.backends.cpu.get_cpu_capability())])

    # -- the round ------------------------------------------------------------------------

    def run(
        self, recipe: Recipe, step: int, *, capture: Capture | bool | None = True
    ) -> RoundOutcome:
        """One round of ``recipe`` at ``step``. Collective over the peer group.

        ``capture`` is this iteration's capture (``True``: take it from the capturer),
        or an explicit one (a kept capture for the full-catalog sweep; None: none).
        """
        assert recipe.path is not None
        ref = self.modules[recipe.path]
        if capture is True:
            cap = self.capturer.take(recipe.path)
        else:
            cap = capture if isinstance(capture, Capture) else None
        group = self.peers.ranks
        ready = self._readiness(recipe, step, ref, cap)
        meta = ready[f"{recipe.name}/ready"]
        ok = meta.status is Status.AGREE and cap is not None
        # Every rank takes part in the AND, ready or not, before anyone returns.
        all_ok = all_ready(ok, [g.pg for g in self.closure]) if self.closure else ok
        if ok and not all_ok:
            reason = "a gather partner's replica group is not ready"
            return RoundOutcome(recipe, step, group, False, dict(ready), reason)
        if not ok or cap is None:
            reason = "capture missing on some peer" if None in meta.evidence else "peers differ"
            return RoundOutcome(recipe, step, group, False, dict(ready), reason)
        threads = self.threads or int(
            min(int(e) for e in ready[f"{recipe.name}/threads"].evidence if isinstance(e, int))
        )
        src = group[step % len(group)]
        t0 = time.monotonic()
        received = self._broadcast(cap, src)
        t_bcast = time.monotonic() - t0
        values = self._replay(ref, cap, received, threads)
        names = SURFACES if self.local_shards is None else ("shard", *SURFACES)
        surfaces = [
            Surface(f"{recipe.name}/{name}", Mode.EXACT, values.get(name)) for name in names
        ]
        surfaces.append(Surface(f"{recipe.name}/t_M", Mode.STATISTICAL, values.get("t_M")))
        surfaces.append(Surface(f"{recipe.name}/t_bcast", Mode.STATISTICAL, t_bcast))
        if self.gathered:
            surfaces.append(
                Surface(f"{recipe.name}/t_gather", Mode.STATISTICAL, values.get("t_gather"))
            )
        results = exchange(surfaces, group=self.peers.pg, ranks=group, kappa=self.kappa)
        return RoundOutcome(recipe, step, group, True, {**ready, **results}, source=src)

    def _readiness(
        self, recipe: Recipe, step: int, ref: ModuleRef, cap: Capture | None
    ) -> dict[str, C3Result]:
        digest: int | None = None
        if cap is not None:
            params = [[n, str(p.dtype), list(p.shape)] for n, p in ref.module.named_parameters()]
            digest = _digest(
                {
                    "recipe": recipe.name,
                    "step": step,
                    "capture": cap.step,
                    "leaves": [_leaf_meta(x) for x in cap.leaves],
                    "rg": list(cap.requires_grad),
                    "out_rg": list(cap.out_requires_grad),
                    "grads": [_leaf_meta(g) for g in cap.grads],
                    "rng": sorted([k, list(v.shape)] for k, v in cap.rng.items()),
                    "params": params,
                    "variants": [float(v).hex() for v in self.variants],
                    "stack": self._stack,
                }
            )
        surfaces = [
            Surface(f"{recipe.name}/ready", Mode.EXACT, digest),
            Surface(f"{recipe.name}/threads", Mode.EXACT, self.threads or torch.get_num_threads()),
        ]
        return exchange(surfaces, group=self.peers.pg, ranks=self.peers.ranks, kappa=self.kappa)

    def _broadcast(
        self, cap: Capture, src: int
    ) -> tuple[list[Any], list[torch.Tensor | None], dict[str, torch.Tensor]]:
        tensors = [x for x in cap.leaves if isinstance(x, torch.Tensor)]
        grads = [g for g in cap.grads if g is not None]
        rng_names = sorted(cap.rng)
        like = tensors + grads + [cap.rng[k] for k in rng_names]
        buf = pack(like) if dist.get_rank() == src else None
        if buf is None:
            buf = torch.empty(sum(t.numel() * t.element_size() for t in like), dtype=torch.uint8)
        timed_broadcast(buf, src, self.peers)
        got = unpack(buf, like)
        it = iter(got[: len(tensors)])
        leaves = [next(it) if isinstance(x, torch.Tensor) else x for x in cap.leaves]
        git = iter(got[len(tensors) : len(tensors) + len(grads)])
        grads_out: list[torch.Tensor | None] = [
            next(git) if g is not None else None for g in cap.grads
        ]
        rng = dict(zip(rng_names, got[len(tensors) + len(grads) :], strict=True))
        return leaves, grads_out, rng

    def _replay(
        self,
        ref: ModuleRef,
        cap: Capture,
        received: tuple[list[Any], list[torch.Tensor | None], dict[str, torch.Tensor]],
        threads: int,
    ) -> dict[str, Any]:
        leaves, grads, rng = received
        values: dict[str, Any] = {}
        values["received"] = sign(
            [x for x in leaves if isinstance(x, torch.Tensor)]
            + list(grads)
            + [rng[k] for k in sorted(rng)]
        )
        if self.local_shards is not None:
            values["shard"] = sign(self.local_shards(ref))
        try:
            t0 = time.monotonic()
            with self.materialize(ref) as full:
                params = dict(full)
            if self.gathered:
                values["t_gather"] = time.monotonic() - t0
            values["params"] = sign(params[k] for k in sorted(params))
            computed = self._compute(
                ref, cap, leaves=leaves, grads=grads, rng=rng, params=params, threads=threads
            )
        except Exception as exc:  # evidence goes missing; peers read inconclusive
            log.warning("scout: replay of %s failed on this rank: %s", ref.path, exc)
            return values
        values.update(computed)
        return values

    def _compute(
        self,
        ref: ModuleRef,
        cap: Capture,
        *,
        leaves: list[Any],
        grads: list[torch.Tensor | None],
        rng: dict[str, torch.Tensor],
        params: dict[str, torch.Tensor],
        threads: int,
    ) -> dict[str, Any]:
        module = ref.module
        named = dict(module.named_parameters())
        # TP attributes (DDP's TP transform) are not registered: their copy carries the flag.
        weights = {
            k: v.detach().requires_grad_(named[k].requires_grad if k in named else v.requires_grad)
            for k, v in params.items()
        }
        streams = [s for s in self.rng if s.name in rng]
        floating = any(isinstance(x, torch.Tensor) and x.is_floating_point() for x in leaves)
        variants = self.variants if floating else self.variants[:1]
        outs: list[torch.Tensor] = []
        in_grads: list[torch.Tensor | None] = []
        p_grads: list[torch.Tensor | None] = []
        elapsed = 0.0
        self.capturer.replaying = True
        try:
            with _rng_scope(self.rng), deterministic_scope(self.deterministic, threads):
                for v in variants:
                    for s in streams:
                        s.set(rng[s.name])
                    xs = [
                        _variant(x, v, rg) for x, rg in zip(leaves, cap.requires_grad, strict=True)
                    ]
                    args, kwargs = unflatten(xs, cap.spec)
                    state: dict[str, torch.Tensor] = dict(weights)
                    state.update({k: b.clone() for k, b in module.named_buffers()})
                    t0 = time.monotonic()
                    out = self.call(module, state, tuple(args), dict(kwargs))
                    out_leaves = [t for t in _tensors(out)]
                    outs.extend(out_leaves)
                    pairs = [
                        (o, g)
                        for o, g in zip(out_leaves, grads, strict=False)
                        if g is not None and o.requires_grad
                    ]
                    wrt = [x for x in xs if isinstance(x, torch.Tensor) and x.requires_grad]
                    n_in = len(wrt)
                    wrt += [w for w in weights.values() if w.requires_grad]
                    if pairs and wrt:
                        got = torch.autograd.grad(
                            [o for o, _ in pairs],
                            wrt,
                            grad_outputs=[g for _, g in pairs],
                            allow_unused=True,
                        )
                        in_grads.extend(got[:n_in])
                        p_grads.extend(got[n_in:])
                    elapsed += time.monotonic() - t0
        finally:
            self.capturer.replaying = False
        return {
            "forward": sign(o.detach() for o in outs),
            "input_grad": sign(in_grads),
            "param_grad": sign(p_grads),
            "t_M": elapsed,
        }


def timed_broadcast(buf: torch.Tensor, src: int, peers: PeerGroup) -> None:
    """Broadcast ``buf`` from ``src`` on the peer group: the interval ``t_bcast`` times.

    An injected slow link (:func:`scout_core.replay.taps.add_comm_delay`, kind of the
    peer group) stalls this rank inside the interval before it enters the broadcast,
    as a slow NIC on this rank would.
    """
    taps.sleep_injected(peers.kind)
    dist.broadcast(buf, src=src, group=peers.payload_pg or peers.pg)


def _variant(x: Any, scale: float, requires_grad: bool) -> Any:
    if not isinstance(x, torch.Tensor):
        return x
    y = x * scale if (scale != 1.0 and x.is_floating_point()) else x.clone()
    return y.detach().requires_grad_(requires_grad and y.is_floating_point())


def _tensors(out: Any) -> list[torch.Tensor]:
    from scout_core.replay.capture import flatten

    return [t for t in flatten(out)[0] if isinstance(t, torch.Tensor)]
