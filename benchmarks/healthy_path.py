"""Healthy-path overhead of replay at the default cadence, printed as JSON.

    python benchmarks/healthy_path.py [--ranks 2] [--steps 200] [--layers 12 32 64]
        [--repeats 3] [--device cpu|cuda] [--null]

Two identical copies of a transformer-style model (``--layers`` blocks of
self-attention plus MLP) train side by side in one job (DDP over Gloo), one with
SCOUT enabled at the default cadence (every recipe every 20 steps, variants
0.1x/x/10x, the checkpoint gate on as ``enable`` wires it) and one without; their
steps are interleaved so both see the same machine load. Each model size runs
``--repeats`` times (fresh processes) and every figure is the median of the runs.

Per model it prints:

* ``overhead``: measured step-time overhead (sum of on / sum of off - 1);
* the estimates: the paper's ``V/(I*N)`` (hidden-layer replay only), the same from
  measured FLOP shares, and ``with_extras``, which adds the embedding, LM head and
  optimizer recipes at their own compute share (FLOPs of the module's forward and
  backward as ``torch.utils.flop_counter`` counts them, times the variants its inputs
  allow; the optimizer slice at its share of the optimizer step);
* ``measured_over_estimate`` against both;
* ``overhead_paired_median`` and ``paired_median_over_estimate``: the same overhead,
  robust to the machine's jitter: per phase of the recipe period, the median of the
  paired (same step) differences on - off, summed over a period, over the period's
  median step time (a jitter spike moves a sum by its whole size, a median not at all;
  on a shared 2-core machine the idle steps of one run read anywhere in about +-1%);
* ``critical_path_overhead`` and ``critical_path_over_estimate``: the time SCOUT's
  boundary held the job up, timed directly rather than as a difference of step times:
  per step, the last rank to leave the boundary minus the last rank to reach it (an
  early rank's wait there for a late peer is not counted: it would have waited as long
  at the next gradient all-reduce), per phase the median, summed over a period, over
  the period's median step time. It leaves out what SCOUT does inside the step (the
  capture hooks of a due step) and the gate's background copy; the paired figure
  includes them, with the machine's jitter;
* ``idle_overhead``: the overhead of steps with no replay due (measured ratio), and
  ``idle_scout_us``: the time SCOUT's step hooks take on such a step, measured
  directly (the ratio is below the timing noise of a shared machine, this is not);
* ``due``: the overhead of steps with replay due, and their breakdown (median per
  due step): ``boundary_ms`` (all of SCOUT's work at the boundary), ``collectives_ms``
  and ``collectives`` (count: readiness, payload broadcast, result exchange, gate
  combine), ``gate_capture_ms`` (the capture's blocking time, mean per due step: the
  gate copies on some due steps only), ``gate_copies`` (due steps that copied) and
  ``gate_capture_per_copy_ms``, and ``replay_compute_ms`` (the rest: the replayed
  module calls, signing, packing);
* ``per_recipe``: per recipe (each has its own phase with the spread cadence), the
  paired overhead of its due steps against its own estimate, in shares of the period
  and in ms per round, with its boundary, critical-path, collective (time and count)
  and gate-capture time: which recipe the gap between measured and estimate comes from;
* ``gate_memory``: the host bytes the checkpoint gate holds on rank 0 at the end
  (``held_bytes``), the most it held at once (``peak_bytes``) and both as a multiple
  of the model + optimizer state (``--gate-memory lean`` bounds them by 2x);
* ``load_avg``: the 1-minute load average before and after each run.

``--null`` trains both copies without SCOUT (an A-A run): every figure is then the
machine's noise floor, what a run reads when there is nothing to measure.

``--device cuda`` trains on the GPU (every rank on ``rank % device_count``: with one
GPU the ranks share it, over Gloo with CUDA tensors) and times with synchronised
clocks. ``scripts/quiet_bench.sh`` runs the acceptance set (12, 32 and 64 layers,
median of 3, this checkout against an earlier one).

The instrumentation lives here only (wrappers around ``torch.distributed`` and the
gate's capture, two optimizer hooks around SCOUT's), so the same script measures
any checkout: run it with ``PYTHONPATH`` at another tree to get its figures.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from healthy_summary import median_of, summarise  # a sibling script, not a package
from torch import nn

_COLLECTIVES = (
    "all_gather_single",
    "all_gather_into_tensor",
    "all_gather",
    "all_reduce",
    "broadcast",
    "reduce_scatter_tensor",
    "all_to_all_single",
    "isend",
    "irecv",
)


class Block(nn.Module):
    """Pre-norm self-attention plus MLP, the shape of a transformer layer."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.n1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.n2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.n1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.n2(x))


class Model(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.layers:
            x = block(x)
        return self.head(self.norm(x))


class _Probe:
    """Benchmark-only instrumentation: time spent in SCOUT's boundary, its collectives
    and the gate's capture, per step."""

    def __init__(self) -> None:
        self.inside = False
        self.step: dict[str, float] = {}

    def reset(self) -> None:
        self.step = {
            "boundary": 0.0,
            "coll": 0.0,
            "coll_n": 0.0,
            "capture": 0.0,
            "enter_at": 0.0,
            "leave_at": 0.0,
        }

    def wrap_collectives(self) -> None:
        import torch.distributed as dist

        for name in _COLLECTIVES:
            fn = getattr(dist, name, None)
            if fn is not None:
                setattr(dist, name, self._timed(fn, "coll"))

    def wrap_capture(self) -> None:
        from scout_core.checkpoint.memory import InMemoryCheckpoints

        InMemoryCheckpoints.capture = self._timed(  # type: ignore[method-assign]
            InMemoryCheckpoints.capture, "capture", count=False
        )

    def _timed(self, fn: Callable[..., Any], key: str, *, count: bool = True) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self.inside:
                return fn(*args, **kwargs)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.step[key] += time.perf_counter() - t0
                if count:
                    self.step[key + "_n"] += 1

        return timed

    def enter(self, *_: Any) -> None:
        self.inside = True
        self.step["enter_at"] = time.perf_counter()

    def leave(self, *_: Any) -> None:
        self.step["leave_at"] = time.perf_counter()
        self.step["boundary"] += self.step["leave_at"] - self.step["enter_at"]
        self.inside = False


def _flop_shares(model: nn.Module, tokens: torch.Tensor, vocab: int) -> dict[str, float]:
    """Each module's share of one training step's FLOPs (forward and backward)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        logits = model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))
        loss.backward()
    model.zero_grad(set_to_none=True)
    counts = {k: float(sum(v.values())) for k, v in counter.get_flop_counts().items()}
    total = counts.get("Global", 0.0) or 1.0
    layers = [v for k, v in counts.items() if k.startswith("Model.layers.") and k.count(".") == 2]
    return {
        "layer": statistics.fmean(layers) / total,
        "embedding": counts.get("Model.embed", 0.0) / total,
        "lm_head": counts.get("Model.head", 0.0) / total,
    }


def bench_rank(
    steps: int,
    layers: int,
    report_dir: str,
    device: str,
    *,
    gate_memory: str | None = None,
    null: bool = False,
) -> dict[str, Any]:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from scout_core.config import Config
    from scout_core.plugin.torch_plugin import enable_torch

    rank = dist.get_rank()
    if device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dev = torch.device(device, torch.cuda.current_device()) if device == "cuda" else None
    vocab, dim = 256, 128
    probe = _Probe()
    probe.wrap_collectives()
    probe.wrap_capture()
    pairs = []
    for _ in range(2):
        torch.manual_seed(0)
        model = Model(vocab, dim, layers, heads=4).to(dev or "cpu")
        ddp = DistributedDataParallel(model)
        pairs.append((ddp, torch.optim.AdamW(ddp.parameters(), lr=1e-3)))
    probe_tokens = torch.randint(0, vocab, (8, 65), generator=torch.Generator().manual_seed(1))
    shares = _flop_shares(pairs[1][0].module, probe_tokens.to(dev or "cpu"), vocab)
    on_opt = pairs[0][1]
    on_opt.register_step_post_hook(probe.enter)  # before SCOUT's hooks: runs first
    # Only a non-default gate_memory is passed: a checkout from before the key still runs.
    more = {} if gate_memory is None else {"gate_memory": gate_memory}
    cfg = Config(report_dir=report_dir, run_id="bench", observer=False, **more)
    session = None if null else enable_torch(pairs[0][0], on_opt, cfg)
    on_opt.register_step_post_hook(probe.leave)  # after SCOUT's: the boundary is between
    kinds: list[list[str]] = []  # the recipe kinds due at each step (none: an idle step)
    if session is not None:
        session.on_boundary(lambda boundary: kinds.append([r.kind for r in boundary.due]))
    off_opt_s: list[float] = []
    mark = [0.0]
    pairs[1][1].register_step_pre_hook(lambda *_: mark.__setitem__(0, time.perf_counter()))
    pairs[1][1].register_step_post_hook(lambda *_: off_opt_s.append(time.perf_counter() - mark[0]))
    times, scout = _train(pairs, probe, steps, vocab, dev)
    opt_share = statistics.median(off_opt_s) / statistics.median(times["off"])
    params = sum(p.numel() for p in pairs[0][0].parameters())
    sched, verdicts, memory = None, 0, {}
    if session is None:  # an A-A run: no step is due
        kinds = [[] for _ in range(steps)]
    else:
        sched = session.replay.schedule if session.replay is not None else None
        verdicts = len(session.verdicts)
        memory = _gate_memory(session)
        session.close()
    intervals = [getattr(cfg, f"{k}_interval", 20) for k in ("replay", "embedding", "lm_head")]
    return {
        "period": math.lcm(*intervals, cfg.optimizer_interval),
        "memory": memory,
        "times": times,
        "scout": scout,
        "kinds": kinds,
        "verdicts": verdicts,
        "estimate": _estimates(
            cfg, layers=layers, shares=shares, opt_share=opt_share, params=params, sched=sched
        ),
    }


def _gate_memory(session: Any) -> dict[str, float]:
    """Host bytes the in-memory gate holds on this rank, and their multiple of the model
    + optimizer state (empty where the checkout does not report them)."""
    memory = getattr(
        getattr(getattr(session, "checkpoints", None), "coordinator", None), "memory", None
    )
    if memory is None or not hasattr(memory, "held_bytes") or not hasattr(memory, "state_bytes"):
        return {}
    state = float(memory.state_bytes())
    held = float(memory.held_bytes())
    peak = float(getattr(memory, "peak_bytes", 0) or held)
    return {
        "state_bytes": state,
        "held_bytes": held,
        "peak_bytes": peak,
        "held_over_state": held / state if state else 0.0,
        "peak_over_state": peak / state if state else 0.0,
    }


def _train(
    pairs: list[Any], probe: _Probe, steps: int, vocab: int, dev: torch.device | None
) -> tuple[dict[str, list[float]], list[dict[str, float]]]:
    """Train both models side by side, interleaved step by step; their step times."""
    import torch.distributed as dist

    rank = dist.get_rank()
    times: dict[str, list[float]] = {"on": [], "off": []}
    scout: list[dict[str, float]] = []

    def sync() -> None:
        if dev is not None:
            torch.cuda.synchronize()

    for step in range(steps):
        gen = torch.Generator().manual_seed(step * 100 + rank)
        tokens = torch.randint(0, vocab, (8, 65), generator=gen).to(dev or "cpu")
        for label, (model, opt) in zip(("on", "off"), pairs, strict=True):
            probe.reset()
            dist.barrier()
            sync()
            t0 = time.perf_counter()
            logits = model(tokens[:, :-1])
            loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sync()
            times[label].append(time.perf_counter() - t0)
            if label == "on":
                scout.append(dict(probe.step))
    return times, scout


def _estimates(
    cfg: Any,
    *,
    layers: int,
    shares: dict[str, float],
    opt_share: float,
    params: int,
    sched: Any,
) -> dict[str, Any]:
    """V/(I*N) and its FLOP-share versions, with and without the extra recipes."""
    v = len(cfg.variants)
    recipes = set(cfg.recipes)
    hidden = v / (cfg.replay_interval * layers) if "hidden" in recipes else 0.0
    per_recipe: dict[str, float] = {}
    if "hidden" in recipes:
        per_recipe["hidden"] = v * shares["layer"] / cfg.replay_interval
    if "embedding" in recipes:  # integer token inputs: one variant (no scaling)
        per_recipe["embedding"] = shares["embedding"] / cfg.embedding_interval
    if "lm_head" in recipes:
        per_recipe["lm_head"] = v * shares["lm_head"] / cfg.lm_head_interval
    if "optimizer" in recipes:
        per_recipe["optimizer"] = (
            min(1.0, cfg.optimizer_slice / params) * opt_share / cfg.optimizer_interval
        )
    return {
        "paper_v_over_i_n": hidden,
        "hidden_flops": per_recipe.get("hidden", 0.0),
        "with_extras": sum(per_recipe.values()),
        "per_recipe": per_recipe,
        "layer_flop_share": shares["layer"],
        "lm_head_flop_share": shares["lm_head"],
        "optimizer_time_share": opt_share,
        "spread": bool(getattr(sched, "spread", False)),
    }


def _load() -> float | None:
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):
        return None


def main(argv: list[str] | None = None) -> int:
    import tempfile

    from scout_core.testing.harness import run_ranks

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--layers", type=int, nargs="+", default=[12])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warm", type=int, default=10)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument(
        "--gate-memory",
        choices=("full", "lean"),
        default=None,
        help="Config.gate_memory (default: the checkout's default; older checkouts lack it)",
    )
    p.add_argument(
        "--null",
        action="store_true",
        help="train both copies without SCOUT (an A-A run): the figures are the noise floor",
    )
    args = p.parse_args(argv)
    out: dict[str, Any] = {
        "ranks": args.ranks,
        "steps": args.steps,
        "repeats": args.repeats,
        "device": args.device,
        "threads_per_rank": 1,
        "gate_memory": args.gate_memory or "default",
        "null": args.null,
        "models": {},
    }
    env = {"OMP_NUM_THREADS": "1"}
    if args.device == "cuda":
        # Replay's deterministic cuBLAS needs this before CUDA starts (the ranks set
        # their device first).
        env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    for layers in args.layers:
        runs = []
        for _ in range(args.repeats):
            report = tempfile.mkdtemp(prefix="scout-bench-")
            before = _load()
            results = run_ranks(
                "healthy_path:bench_rank",
                args.ranks,
                args=(args.steps, layers, report, args.device),
                kwargs={"gate_memory": args.gate_memory, "null": args.null},
                timeout_s=3600,
                env=env,
            )
            summary = summarise(results, args.warm)
            summary["load_avg"] = [before, _load()]
            runs.append(summary)
        out["models"][str(layers)] = {"median": median_of(runs), "runs": runs}
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
