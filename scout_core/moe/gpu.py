"""Shape profilers that run the expert kernel on a GPU and read what launched.

Contract: import-safe on a CPU host (torch imported lazily, Triton only when a Triton
kernel is profiled); nothing runs without CUDA. :class:`CublasProfiler` trusts path counts
only when the tile parsed from the kernel name reproduces the launched grid;
:class:`TritonProfiler` reads the autotuner's ``best_config`` and checks the traced grid.
A profile that cannot be pinned down is uncertain, and its shape is kept. Docs:
docs/moe.md, "On a GPU".
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import tempfile
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from scout_core.moe.coverage import Profile
from scout_core.moe.shapes import ExpertShape
from scout_core.moe.tiles import TileConfig, path_counts

__all__ = [
    "CublasProfiler",
    "KernelLaunch",
    "TritonProfiler",
    "parse_cluster",
    "parse_tile",
    "trace_kernels",
]

_TILE_PATTERNS = (
    re.compile(r"tilesize(\d+)x(\d+)x(\d+)"),  # cuBLAS xmma / sm90 kernels
    re.compile(r"_(\d+)x(\d+)_ldg\d+.*?stages_(\d+)x\d+"),  # ampere_*gemm_128x128_ldg8_..._64x3
    re.compile(r"_(\d+)x(\d+)_(\d+)x\d+_"),  # cutlass 256x128_32x3_, nvjet 128x64_64x8_
)


_CLUSTER_PATTERN = re.compile(r"_\d+x\d+_\d+x\d+_(\d+)x(\d+)_")  # nvjet: tile_kxstages_cluster


def parse_cluster(kernel_name: str) -> tuple[int, int]:
    """Thread-block cluster shape named in a kernel's name (nvjet), else ``(1, 1)``."""
    match = _CLUSTER_PATTERN.search(kernel_name)
    return (int(match.group(1)), int(match.group(2))) if match else (1, 1)


def parse_tile(kernel_name: str) -> tuple[int, int, int] | None:
    """``(tile_m, tile_n, tile_k)`` named in a GEMM kernel's name, else None."""
    for pattern in _TILE_PATTERNS:
        match = pattern.search(kernel_name)
        if match:
            m, n, k = (int(g) for g in match.groups())
            if min(m, n, k) >= 1:
                return m, n, k
    return None


@dataclass(frozen=True, slots=True)
class KernelLaunch:
    """One GPU kernel launch read from a profiler trace."""

    name: str
    grid: tuple[int, int, int] | None
    block: tuple[int, int, int] | None

    @property
    def ctas(self) -> int | None:
        return None if self.grid is None else math.prod(self.grid)


def _dims(value: Any) -> tuple[int, int, int] | None:
    if isinstance(value, list) and len(value) == 3 and all(isinstance(v, int) for v in value):
        return (value[0], value[1], value[2])
    return None


def trace_kernels(fn: Callable[[], None]) -> list[KernelLaunch]:
    """Run ``fn`` under ``torch.profiler`` and return the CUDA kernels it launched, in order."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with warnings.catch_warnings():
        # torch warns once that a profiler cycle keeps only its own events: wanted here.
        warnings.filterwarnings("ignore", message=".*Profiler clears events", category=UserWarning)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
    fd, path = tempfile.mkstemp(suffix=".json", prefix="scout-trace-")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f).get("traceEvents", [])
    finally:
        os.unlink(path)
    kernels = [e for e in events if e.get("cat") == "kernel" and e.get("ph") == "X"]
    kernels.sort(key=lambda e: float(e.get("ts", 0)))
    return [
        KernelLaunch(
            str(e.get("name", "")),
            _dims(e.get("args", {}).get("grid")),
            _dims(e.get("args", {}).get("block")),
        )
        for e in kernels
    ]


def _num_sms() -> int:
    import torch

    return int(torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count)


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def _resolve(launch: KernelLaunch, rows: int, k: int, n: int) -> tuple[dict[str, int], str] | str:
    """Path counts of one GEMM launch and the frame they are in; or why they are unknown."""
    tile = parse_tile(launch.name)
    if tile is None:
        return f"no tile size in kernel name {launch.name!r}"
    if launch.grid is None or launch.ctas is None:
        return f"no grid recorded for {launch.name!r}"
    tm, tn, tk = tile
    cx, cy = parse_cluster(launch.name)
    split = launch.grid[2]
    cfg = TileConfig(block_m=tm, block_n=tn, block_k=tk, split_k=split)
    # torch's row-major x @ w reaches cuBLAS as the column-major w^T x^T, so cuBLAS's M
    # is our n: that frame is tried first, the rows-first one only if it alone fits.
    for frame, (a, b) in (("cublas", (n, rows)), ("rows", (rows, n))):
        ta, tb = math.ceil(a / tm), math.ceil(b / tn)
        padded = _round_up(ta, cx) * _round_up(tb, cy)  # grids are whole clusters
        if padded * split == launch.ctas:
            counts = path_counts(ExpertShape(rows=(a,), k=k, n=b), cfg)
            counts["pad"] = (padded - ta * tb) * split  # CTAs of a cluster with no tile
            return counts, frame
    return (
        f"tile {tm}x{tn} (cluster {cx}x{cy}) does not reproduce grid {launch.grid} "
        f"of {launch.name!r}"
    )


class CublasProfiler:
    """Profiles expert GEMMs as ``torch.matmul`` runs them (cuBLAS), one GEMM per expert."""

    name = "cublas-trace"

    def __init__(self, *, dtype: str = "bfloat16", repeats: int = 3, seed: int = 0) -> None:
        if repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {repeats}")
        self.dtype = dtype
        self.repeats = repeats
        self.seed = seed
        self.last_launches: list[KernelLaunch] = []

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "repeats": self.repeats}

    def profile(self, shape: ExpertShape) -> Profile:
        import torch

        dt = getattr(torch, self.dtype)
        gen = torch.Generator(device="cuda").manual_seed(self.seed)
        xs = [torch.randn(r, shape.k, device="cuda", dtype=dt, generator=gen) for r in shape.rows]
        w = torch.randn(shape.k, shape.n, device="cuda", dtype=dt, generator=gen)

        active = [(r, x) for r, x in zip(shape.rows, xs, strict=True) if r]

        def run() -> None:
            for _, x in active:
                torch.matmul(x, w)

        run()  # warm-up: handles, workspaces and heuristics settle before the trace
        torch.cuda.synchronize()
        runs = [[trace_kernels(_matmul(x, w)) for _, x in active] for _ in range(self.repeats)]
        self.last_launches = [k for per_expert in runs[-1] for k in per_expert]
        return _from_launches(runs, shape, [r for r, _ in active], _num_sms())


def _matmul(x: Any, w: Any) -> Callable[[], None]:
    def run() -> None:
        import torch

        torch.matmul(x, w)

    return run


def _from_launches(
    runs: Sequence[Sequence[Sequence[KernelLaunch]]],
    shape: ExpertShape,
    rows: Sequence[int],
    num_sms: int,
) -> Profile:
    """A profile from ``runs[repeat][expert]`` = the launches of that expert's GEMM.

    The launch whose name gives a tile is the GEMM; others (a split-K reduction, a cast)
    enter the fingerprint only. An expert without exactly one GEMM leaves counts unknown.
    """
    signatures = [
        tuple(tuple((k.name, k.block, k.ctas) for k in launches) for launches in run)
        for run in runs
    ]
    if any(s != signatures[0] for s in signatures[1:]):
        return Profile(None, note=f"kernel launches changed across {len(runs)} repeats")
    names: list[str] = []
    parts: list[str] = []
    counts: dict[str, int] = {}
    problem = ""
    for r, launches in zip(rows, runs[0], strict=True):
        gemms = [x for x in launches if parse_tile(x.name) is not None]
        for launch in launches:
            if launch.name not in names:
                names.append(launch.name)
            kid = names.index(launch.name)
            waves = "?" if launch.ctas is None else str(math.ceil(launch.ctas / num_sms))
            role = "gemm" if launch in gemms else "aux"
            resolved = _resolve(launch, r, shape.k, shape.n) if role == "gemm" else None
            orient = resolved[1] if isinstance(resolved, tuple) else "?"
            split = "?" if launch.grid is None else launch.grid[2]
            parts.append(f"K{kid}:{role}:b{launch.block}:s{split}:w{waves}:{orient}")
            if isinstance(resolved, str):
                problem = problem or resolved
            elif resolved is not None:
                for path, c in resolved[0].items():
                    key = f"K{kid}:{path}"
                    counts[key] = counts.get(key, 0) + c
        if len(gemms) != 1:
            problem = problem or (
                f"{len(gemms)} launches with a tile size for one expert GEMM: "
                f"{[x.name for x in launches]}"
            )
    fingerprint = "|".join([*names, *parts, f"k{shape.k}", f"n{shape.n}"])
    if problem:
        return Profile(fingerprint, note=problem)
    paths = tuple(sorted(counts))
    return Profile(fingerprint, paths, tuple(counts[p] for p in paths))


class TritonProfiler:
    """Profiles an autotuned Triton GEMM kernel through the configuration it picked.

    ``launch(shape)`` runs the production kernel once for ``shape``; ``kernel`` is the
    ``@triton.autotune`` object; ``block_keys`` and ``split_key`` name its block and split-K
    meta-parameters. With ``per_expert=True`` the kernel is a plain GEMM launched once per
    expert, and the configuration is read after each (row counts may tune differently);
    otherwise ``launch`` runs one grouped launch for all experts.
    """

    name = "triton-autotune"

    def __init__(
        self,
        kernel: Any,
        launch: Callable[[ExpertShape], None],
        *,
        block_keys: tuple[str, str, str] = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K"),
        split_key: str | None = None,
        per_expert: bool = False,
        repeats: int = 3,
        check_grid: bool = True,
    ) -> None:
        self.kernel = kernel
        self.launch = launch
        self.block_keys = block_keys
        self.split_key = split_key
        self.per_expert = per_expert
        self.repeats = repeats
        self.check_grid = check_grid

    def _kernel_name(self) -> str:
        fn = getattr(self.kernel, "fn", self.kernel)
        return str(getattr(fn, "__name__", type(fn).__name__))

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kernel": self._kernel_name(),
            "block_keys": list(self.block_keys),
            "split_key": self.split_key,
            "per_expert": self.per_expert,
            "repeats": self.repeats,
        }

    def _config(self) -> TileConfig | str:
        best = getattr(self.kernel, "best_config", None)
        if best is None:
            return f"{self._kernel_name()} has no best_config after launch"
        kwargs = dict(best.kwargs)
        try:
            bm, bn, bk = (int(kwargs[key]) for key in self.block_keys)
            split = int(kwargs[self.split_key]) if self.split_key else 1
        except KeyError as exc:
            return f"best_config lacks block parameter {exc}"
        return TileConfig(
            block_m=bm,
            block_n=bn,
            block_k=bk,
            split_k=split,
            num_warps=int(best.num_warps),
            num_stages=int(best.num_stages),
        )

    def _launches(self, shape: ExpertShape) -> list[ExpertShape]:
        if not self.per_expert:
            return [shape]
        return [ExpertShape(rows=(r,), k=shape.k, n=shape.n) for r in shape.rows if r]

    def profile(self, shape: ExpertShape) -> Profile:
        import torch

        units = self._launches(shape)
        for unit in units:
            self.launch(unit)  # warm-up: autotuning benchmarks happen here, not in the trace
        torch.cuda.synchronize()
        runs: list[list[tuple[TileConfig | str, list[KernelLaunch]]]] = []
        for _ in range(self.repeats):
            run = []
            for unit in units:
                launches = trace_kernels(functools.partial(self.launch, unit))
                run.append((self._config(), launches))
            runs.append(run)
        configs = [[c for c, _ in run] for run in runs]
        if any(c != configs[0] for c in configs[1:]):
            return Profile(None, note="autotuned configuration changed across repeats")
        counts: dict[str, int] = {}
        parts = [
            f"triton:{self._kernel_name()}",
            f"e{len(shape.rows)}",
            f"k{shape.k}",
            f"n{shape.n}",
        ]
        for unit, (cfg, launches) in zip(units, runs[0], strict=True):
            if isinstance(cfg, str):
                return Profile(None, note=cfg)
            mine = path_counts(unit, cfg)
            work = sum(mine.values())
            parts.append(f"{cfg.key()}:waves{math.ceil(work / _num_sms())}")
            ours = [x for x in launches if self._kernel_name() in x.name]
            ctas = sum(x.ctas or 0 for x in ours)
            if self.check_grid and (not ours or any(x.ctas is None for x in ours) or ctas != work):
                return Profile(
                    "|".join(parts),
                    note=f"launched grid ({ctas} programs) does not match {work} tile units "
                    f"of {cfg.key()}",
                )
            for path, c in mine.items():
                key = f"{cfg.key()}:{path}"
                counts[key] = counts.get(key, 0) + c
        paths = tuple(sorted(counts))
        return Profile("|".join(parts), paths, tuple(counts[p] for p in paths))
