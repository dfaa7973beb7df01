"""Expert replay at catalog representatives (paper §6.2): one ``experts`` round.

Contract: the expert-DP peers that hold the same experts run them on the same synthetic input
(drawn from a seed the source broadcasts) at one representative shape of the MoE shape catalog
(:mod:`scout_core.moe`), on materialised copies, and compare ``received``, ``params``,
``forward``, ``input_grad`` and ``param_grad`` exactly and ``t_M`` and ``t_bcast``
statistically: on the peer group, readiness, then only where it agrees the seed's broadcast and
one exchange. Nothing touches the live module, its ``.grad`` or training's RNG streams.
:func:`expert_targets` gives one target per MoE layer and distinct representative row vector
(``layers.0.moe.experts@rows=7``). docs/moe.md, "Replay of routers and experts".
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from scout_core.decision.c3 import C3Result, Surface, exchange
from scout_core.integration.adapter import ModuleRef
from scout_core.moe.catalog_set import CatalogSet
from scout_core.replay.compute import Call
from scout_core.replay.gaps import Gap, evidence, first_gap
from scout_core.replay.packing import sign
from scout_core.replay.runner import Materialize, RoundOutcome, payload_device, timed_broadcast
from scout_core.replay.schedule import Recipe
from scout_core.replay.scope import Interval, deterministic_scope
from scout_core.topology.groups import PeerGroup
from scout_core.vocabulary import Mode, Status

__all__ = ["ExpertRunner", "ExpertTarget", "expert_targets", "layer_of"]

log = logging.getLogger(__name__)

SURFACES = ("received", "params", "forward", "input_grad", "param_grad")
"""Exact surfaces of an experts round, in exchange order."""


@dataclass(frozen=True)
class ExpertTarget:
    """One catalog check: an MoE layer's local experts at one representative."""

    ref: ModuleRef
    """The container of the layer's local experts."""
    rows: tuple[int, ...]
    """Rows per expert of one kernel launch; local expert ``j`` gets ``rows[j % len]``."""
    d_model: int
    """Width of an expert's input and output."""
    classes: tuple[str, ...]
    """The catalog classes this representative came from."""


def layer_of(path: str) -> str:
    """The MoE layer of an experts container: ``layers.0.moe.experts`` → ``layers.0.moe``."""
    return path[: -len(".experts")] if path.endswith(".experts") else path


def expert_targets(experts: Sequence[ModuleRef], catalogs: CatalogSet) -> dict[str, ExpertTarget]:
    """One target per MoE layer and distinct representative row vector, in rotation order (model
    order, then catalog order); a layer no class of ``catalogs`` covers has none (logged)."""
    out: dict[str, ExpertTarget] = {}
    for ref in experts:
        layer = layer_of(ref.path)
        up, down = f"{layer}.up", f"{layer}.down"
        d_model = None
        found: dict[tuple[int, ...], list[str]] = {}
        for name, catalog in catalogs.catalogs.items():
            cls = catalog.workload
            if up in cls.layers:
                d_model = cls.k
            elif down in cls.layers:
                d_model = cls.n
            else:
                continue
            for shape in catalog.representatives:
                found.setdefault(shape.rows, []).append(name)
        if d_model is None:
            log.warning(
                "the MoE catalog has no class for layer %s (projections %s, %s); its "
                "experts are not replayed",
                layer,
                up,
                down,
            )
            continue
        for rows, names in found.items():
            label = ",".join(map(str, rows))
            out[f"{ref.path}@rows={label}"] = ExpertTarget(ref, rows, d_model, tuple(names))
    return out


def _digest(obj: Any) -> int:
    text = json.dumps(obj, separators=(",", ":"), sort_keys=True)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def _children(container: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    return list(container.named_children())


class ExpertRunner:
    """Runs ``experts`` recipes for one comparison group (the expert-DP peers)."""

    def __init__(
        self,
        *,
        peers: PeerGroup,
        targets: Mapping[str, ExpertTarget],
        materialize: Materialize,
        call: Call,
        variants: Sequence[float],
        kappa: float,
        deterministic: bool = True,
        threads: int | None = None,
    ) -> None:
        self.peers = peers
        self.targets = dict(targets)
        self.materialize = materialize
        self.call = call
        self.variants = tuple(variants)
        self.kappa = kappa
        self.deterministic = deterministic
        self.threads = threads
        self._stack = json.dumps([torch.__version__, str(torch.backends.cpu.get_cpu_capability())])

    def run(self, recipe: Recipe, step: int, **_: Any) -> RoundOutcome:
        """One round of ``recipe`` at ``step`` (docs/moe.md); collective over the peer group."""
        assert recipe.path is not None
        target = self.targets[recipe.path]
        group = self.peers.ranks
        name = recipe.name
        params = [
            [n, str(p.dtype), list(p.shape), p.requires_grad]
            for n, p in target.ref.module.named_parameters()
        ]
        digest = _digest(
            {
                "recipe": name,
                "step": step,
                "rows": list(target.rows),
                "d_model": target.d_model,
                "params": params,
                "variants": [float(v).hex() for v in self.variants],
                "stack": self._stack,
            }
        )
        ready = exchange(
            [
                Surface(f"{name}/ready", Mode.EXACT, digest),
                Surface(f"{name}/threads", Mode.EXACT, self.threads or torch.get_num_threads()),
            ],
            group=self.peers.pg,
            ranks=group,
            kappa=self.kappa,
        )
        meta = ready[f"{name}/ready"]
        if meta.status is not Status.AGREE:
            return RoundOutcome(recipe, step, group, False, dict(ready), "peers differ")
        threads = self.threads or int(
            min(int(e) for e in ready[f"{name}/threads"].evidence if isinstance(e, int))
        )
        src = group[step % len(group)]
        seed, t_bcast = self._seed(src, target)
        values = self._replay(target, seed, threads)
        surfaces = [Surface(f"{name}/{s}", Mode.EXACT, values.get(s)) for s in SURFACES]
        surfaces.append(Surface(f"{name}/gap", Mode.EXACT, values.get("gap", 0)))
        surfaces.append(Surface(f"{name}/t_M", Mode.STATISTICAL, values.get("t_M")))
        surfaces.append(Surface(f"{name}/t_bcast", Mode.STATISTICAL, t_bcast))
        results: dict[str, C3Result] = exchange(
            surfaces, group=self.peers.pg, ranks=group, kappa=self.kappa
        )
        return RoundOutcome(recipe, step, group, True, {**ready, **results}, source=src)

    def _seed(self, src: int, target: ExpertTarget) -> tuple[int, float]:
        like = [p.detach() for p in target.ref.module.parameters()][:1]
        device = payload_device(self.peers, like)
        if dist.get_rank() == src:
            value = int.from_bytes(os.urandom(8), "little") >> 1
            buf = torch.tensor([value], dtype=torch.int64).view(torch.uint8).to(device)
        else:
            buf = torch.empty(8, dtype=torch.uint8, device=device)
        t_bcast = timed_broadcast(buf, src, self.peers)
        return int(buf.cpu().view(torch.int64).item()), t_bcast

    def _replay(self, target: ExpertTarget, seed: int, threads: int) -> dict[str, Any]:
        values: dict[str, Any] = {"received": sign([torch.tensor([seed], dtype=torch.int64)])}
        try:
            with self.materialize(target.ref) as full:
                params = dict(full)
            values["params"] = sign(params[k] for k in sorted(params))
            values.update(self._compute(target, params, seed, threads))
        except Exception as exc:  # evidence goes missing; peers read inconclusive
            log.warning("expert replay of %s failed on this rank: %s", target.ref.path, exc)
            values["gap"] = int(Gap.RAISED)
        return values

    def _compute(
        self, target: ExpertTarget, params: dict[str, torch.Tensor], seed: int, threads: int
    ) -> dict[str, Any]:
        experts = _children(target.ref.module)
        some = next(iter(params.values()))
        device, dtype = some.device, some.dtype if some.is_floating_point() else torch.float32
        timer = Interval(device)
        outs: list[torch.Tensor] = []
        in_grads: list[torch.Tensor | None] = []
        p_grads: list[torch.Tensor | None] = []
        with deterministic_scope(self.deterministic, threads, cuda=device.type == "cuda"):
            for j, (key, expert) in enumerate(experts):
                prefix = f"{key}."
                state = {
                    k[len(prefix) :]: v.detach().clone().requires_grad_(True)
                    for k, v in params.items()
                    if k.startswith(prefix)
                }
                state.update({k: b.clone() for k, b in expert.named_buffers()})
                rows = target.rows[j % len(target.rows)]
                gen = torch.Generator().manual_seed((seed + 7919 * j) % 2**63)
                base = torch.randn(rows, target.d_model, generator=gen).to(device, dtype)
                grad_out = torch.randn(rows, target.d_model, generator=gen).to(device, dtype)
                weights = [w for w in state.values() if w.requires_grad]
                for v in self.variants:
                    x = (base * v).requires_grad_(True)
                    with timer.timing():
                        out = self.call(expert, state, (x,), {})
                        assert isinstance(out, torch.Tensor), "an expert must return a tensor"
                        grads = torch.autograd.grad(
                            [out], [x, *weights], grad_outputs=[grad_out], allow_unused=True
                        )
                    outs.append(out.detach())
                    in_grads.append(grads[0])
                    p_grads.extend(grads[1:])
        values: dict[str, Any] = {
            "forward": evidence(outs, expected=True),
            "input_grad": evidence(in_grads, expected=True),
            "param_grad": evidence(p_grads, expected=True),
            "t_M": timer.seconds,
        }
        values["gap"] = int(first_gap(values))
        return values
