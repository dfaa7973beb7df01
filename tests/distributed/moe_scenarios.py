"""Rank bodies for the MoE test model (EP x expert-DP on Gloo); imported by spawned ranks."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch
import torch.distributed as dist

from scout_core.decision.signature import signature_many
from scout_core.testing.models import batch
from scout_core.testing.moe_models import MoESpec, TinyMoE, moe_parallel, moe_train_step

UNIFORM = (MoESpec(4, 32), MoESpec(4, 32))
HETERO = (MoESpec(4, 32), MoESpec(2, 16), MoESpec(8, 24))


def _sig(params: Any) -> str:
    return f"{signature_many([p.detach() for p in params]):016x}"


def train_moe(steps: int, ep_size: int) -> dict[str, Any]:
    """Train the uniform and the heterogeneous TinyMoE a few steps; report what to compare."""
    rank = dist.get_rank()
    parallel = moe_parallel(ep_size)
    out: dict[str, Any] = {"ep_rank": parallel.ep_rank}
    for name, specs in (("uniform", UNIFORM), ("hetero", HETERO)):
        model = TinyMoE(specs, parallel=parallel, seed=3)
        reference = TinyMoE(specs, parallel=None, seed=3)  # every expert, one process
        start = _sig(model.expert_parameters())
        with torch.no_grad():
            tokens = batch(0, rank)[:, :-1]
            err = float((model(tokens) - reference(tokens)).abs().max())
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        losses = [moe_train_step(model, optimizer, s, rank, parallel) for s in range(steps)]
        out[name] = {
            "losses": [x.hex() for x in losses],
            "dense": _sig(model.dense_parameters()),
            "experts": _sig(model.expert_parameters()),
            "experts_at_start": start,
            "expert_ids": [list(layer.expert_ids) for _, layer in model.moe_layers()],
            "tokens_per_expert": [
                list(layer.last_tokens_per_expert) for _, layer in model.moe_layers()
            ],
            "reference_error": err,
        }
    return out


def write_catalog(path: str, specs: Any, tokens_per_rank: int, ep_size: int) -> int:
    """Discover the tile-model catalog of ``specs`` under EP ``ep_size`` and save it;
    returns the number of distinct (layer, representative rows) expert targets."""
    from scout_core.moe import CatalogSet, TileModel, discover, expert_classes

    model = TinyMoE(specs, parallel=None, seed=3)
    layers = [
        dataclasses.replace(s, ep_size=ep_size, max_tokens_per_expert=tokens_per_rank * ep_size)
        for s in model.layer_specs(tokens_per_rank)
    ]
    catalogs = CatalogSet(
        [discover(c, TileModel()) for c in expert_classes(layers, dtype="float32")]
    )
    catalogs.save(path)
    targets = {
        (layer, rep.rows)
        for c in catalogs.catalogs.values()
        for rep in c.representatives
        for layer in {p.rsplit(".", 1)[0] for p in c.workload.layers}
    }
    return len(targets)


A2A_PAYLOAD = ("a2a_payload_fails", "a2a_corrupt_send")
"""Faults on this rank's replayed all-to-all payload, keyed by kind."""


def _arm_all_to_all(
    session: Any, parallel: Any, payload_faults: dict[int, str], fired: list[Any]
) -> None:
    """Check that all-to-all replay talks on SCOUT's own EP group (never the model's
    training EP group or WORLD), and arm this rank's payload faults (step → kind)."""
    from scout_core.testing import flip_bit
    from scout_core.topology.groups import is_diagnostic

    a2a = session.replay.all_to_all
    if a2a.targets:
        assert a2a.ep is not None and is_diagnostic(a2a.ep.pg)
        assert a2a.ep.pg is not parallel.ep_group and a2a.ep.pg is not dist.group.WORLD
        assert a2a.ep.ranks == tuple(dist.get_process_group_ranks(parallel.ep_group))
    if payload_faults:
        payload = a2a._payload

        def faulty(*args: Any, **kwargs: Any) -> torch.Tensor:
            kind = payload_faults.get(session.step)
            if kind is not None:
                fired.append([kind, session.step])
            if kind == "a2a_payload_fails":
                raise RuntimeError("injected payload failure")
            out: torch.Tensor = payload(*args, **kwargs)
            if kind == "a2a_corrupt_send":  # row 0 goes to EP position 0
                flip_bit(out, index=0, bit=0)
            return out

        a2a._payload = faulty


def scout_moe(
    specs_name: str, faults: list[dict[str, Any]], steps: int, cfg: dict[str, Any]
) -> dict[str, Any]:
    """Train TinyMoE (EP 2 x expert-DP) under scout.enable with ``faults``; the verdicts.

    A fault ``{"rank", "step", "kind", ...}`` acts on one rank after that step's
    optimizer step: ``expert_weight`` adds 1.0 to an element of one local expert's
    ``up.weight`` in MoE layer ``layer`` (persistent); ``router_weight`` adds 1.0 to
    an element of that layer's router gate weight; ``slow_a2a`` makes the rank late by
    ``seconds`` into every replayed all-to-all from that step on (with ``"link": True``
    its exchange is slow instead: :meth:`~scout_core.testing.injectors.Trigger.delay_all_to_all`);
    ``a2a_payload_fails`` makes the rank's replayed all-to-all payload raise at that
    step's round, ``a2a_corrupt_send`` flips the lowest bit of its first row (sent to EP
    position 0).
    """
    import scout_core as scout
    from scout_core.testing import Faults
    from scout_core.topology.mesh import MeshLayout

    rank = dist.get_rank()
    ep = cfg.pop("ep_size", 2)
    parallel = moe_parallel(ep)
    specs = HETERO if specs_name == "hetero" else UNIFORM
    model = TinyMoE(specs, parallel=parallel, seed=3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    mesh = MeshLayout.from_order("e-d", e=ep, d=dist.get_world_size() // ep)
    report = os.path.join(os.environ["SCOUT_TEST_RANK_DIR"], "report")
    base: dict[str, Any] = {"report_dir": report, "run_id": "moe", "observer": False}
    base.update(cfg)
    fired: list[Any] = []
    log: list[Any] = []
    trace: list[Any] = []
    injected = Faults()
    for f in faults:
        if f["kind"] == "slow_a2a":
            slow = range(f["step"], steps)
            trigger = injected.at(rank=f["rank"], steps=slow)
            trigger.delay_all_to_all(f["seconds"], link=f.get("link", False))
    injected.attach(model, opt)
    payload_faults = {
        f["step"]: f["kind"] for f in faults if f["kind"] in A2A_PAYLOAD and f["rank"] == rank
    }
    faults = [f for f in faults if f["kind"] != "slow_a2a" and f["kind"] not in A2A_PAYLOAD]
    with scout.enable(model, opt, config=base, mesh=mesh) as session:
        _arm_all_to_all(session, parallel, payload_faults, fired)
        session.on_boundary(lambda b: log.append([b.step, [r.kind for r in b.due]]))
        for step in range(steps):
            moe_train_step(model, opt, step, rank, parallel)
            for f in faults:
                if f["rank"] == rank and f["step"] == step:
                    layer = model.layers[f["layer"]].moe
                    with torch.no_grad():
                        if f["kind"] == "expert_weight":
                            layer.experts[f.get("expert", 0)].up.weight[0, 0] += 1.0
                        else:
                            layer.router.gate.weight[0, 0] += 1.0
                    fired.append([f["kind"], step])
            gate = session.gate
            if gate is not None and hasattr(gate, "coordinator"):
                g = gate.coordinator.gate
                trace.append([step, g.latest, g.candidate, g.verified])
        verdicts = [r.to_dict() for r in session.verdicts]
        catalog = [[r.kind, r.path] for r in session.replay.schedule.catalog]
    injected.detach()
    fired += [[kind, step] for kind, _, step in injected.fired()]
    return {
        "verdicts": verdicts,
        "fired": fired,
        "rank": rank,
        "due": log,
        "catalog": catalog,
        "gate": trace,
    }
