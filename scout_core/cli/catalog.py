"""``scout catalog``: build and inspect MoE shape catalogs (paper §6.2).

``scout catalog discover`` profiles every admitted expert shape of one or more expert
classes, keeps the minimum cover of representatives and writes the catalog file (JSON,
bound to this environment); ``scout catalog show`` prints one. The workload is
projections crossed with experts per kernel and admitted tokens, explicit per-expert token
vectors, or a model (grouped into classes as :func:`scout_core.moe.expert_classes` does).
The profiler is the analytic tile model (any host) or ``cublas`` (a GPU). The progress
bar uses ``rich`` when it is installed, plain lines otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "parse_tokens"]


def parse_tokens(spec: str) -> list[int]:
    """``"1:2048"`` (inclusive), ``"16:256:16"`` (with a step), ``"1,2,4"`` or a mix."""
    out: list[int] = []
    for raw in spec.split(","):
        part = raw.strip()
        if not part:
            continue
        bits = part.split(":")
        try:
            nums = [int(b) for b in bits]
        except ValueError:
            raise argparse.ArgumentTypeError(f"bad token count {part!r} in {spec!r}") from None
        if len(nums) == 1:
            out.append(nums[0])
        elif len(nums) in (2, 3) and nums[0] <= nums[1] and (len(nums) == 2 or nums[2] > 0):
            out.extend(range(nums[0], nums[1] + 1, nums[2] if len(nums) == 3 else 1))
        else:
            raise argparse.ArgumentTypeError(f"bad token range {part!r}: want A:B or A:B:STEP")
    if not out or min(out) < 0:
        raise argparse.ArgumentTypeError(f"token counts {spec!r} must be >= 0 and non-empty")
    return sorted(set(out))


def _dims(spec: str, what: str, parts: int) -> list[int]:
    try:
        nums = [int(x) for x in spec.lower().replace("/", "x").split("x")]
    except ValueError:
        nums = []
    if len(nums) not in (parts, parts + 1) or min(nums, default=0) < 1:
        raise argparse.ArgumentTypeError(f"bad {what} {spec!r}")
    return nums


def _layer(raw: Mapping[str, Any]) -> Any:
    from scout_core.moe import ExpertLayerSpec

    fields = dict(raw)
    if fields.get("token_vectors") is not None:
        fields["token_vectors"] = tuple(tuple(int(r) for r in v) for v in fields["token_vectors"])
    return ExpertLayerSpec(**fields)


def _classes(args: argparse.Namespace) -> list[Any]:
    from scout_core.moe import ExpertClass, expert_classes

    if args.model:
        layers = [_layer(raw) for raw in json.loads(Path(args.model).read_text())]
        return expert_classes(layers, dtype=args.dtype)
    out = []
    for proj in args.projection or ["128x128"]:
        k, n = _dims(proj, "projection (want KxN)", 2)[:2]
        if args.token_vectors:
            vectors = tuple(
                tuple(int(r) for r in v) for v in json.loads(Path(args.token_vectors).read_text())
            )
            e = len(vectors[0]) if vectors else 1
            out.append(
                ExpertClass(
                    name=f"{k}x{n}/e{e}",
                    k=k,
                    n=n,
                    experts_per_kernel=e,
                    admitted=vectors,
                    dtype=args.dtype,
                )
            )
            continue
        for e in args.experts_per_kernel:
            out.append(
                ExpertClass.uniform(
                    name=f"{k}x{n}/e{e}",
                    k=k,
                    n=n,
                    tokens=args.tokens,
                    experts_per_kernel=e,
                    dtype=args.dtype,
                )
            )
    return out


def _profiler(args: argparse.Namespace) -> Any:
    from scout_core.moe import DEFAULT_RULES, TileConfig, TileModel, TileRule

    if args.profiler == "cublas":
        from scout_core.moe.gpu import CublasProfiler

        return CublasProfiler(dtype=args.dtype)
    if args.tile:
        nums = _dims(args.tile, "tile (want MxNxK or MxNxK/SPLIT)", 3)
        rules: Any = TileConfig(
            block_m=nums[0],
            block_n=nums[1],
            block_k=nums[2],
            split_k=nums[3] if len(nums) == 4 else 1,
        )
    elif args.rules:
        rules = [
            TileRule(r["max_rows"], TileConfig.from_json(r["config"]))
            for r in json.loads(Path(args.rules).read_text())
        ]
    else:
        rules = DEFAULT_RULES
    return TileModel(
        rules,
        kernel=args.kernel,
        num_sms=args.num_sms,
        ctas_per_sm=args.ctas_per_sm,
        wave_regimes=not args.no_wave_regimes,
    )


class _Position:
    """Turns per-class ``(done, label)`` into a position on one bar over all classes."""

    def __init__(self) -> None:
        self.base, self.last, self.label = 0, 0, ""

    def __call__(self, done: int, label: str) -> int:
        if label != self.label:
            self.base, self.label = self.base + self.last, label
        self.last = done
        return self.base + done


@contextmanager
def _progress(total: int, quiet: bool) -> Iterator[Callable[[int, int, str], None]]:
    """A ``progress(done, total, label)`` callback drawing one bar over all classes."""
    position = _Position()

    if quiet:
        yield lambda done, of, label: None
        return
    try:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
    except ImportError:
        step = max(1, total // 10)

        def plain(done: int, of: int, label: str) -> None:
            at = position(done, label)
            if at % step == 0 or at == total:
                print(f"profiling {label}: {at}/{total} shapes", file=sys.stderr)

        yield plain
        return
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, console=Console(stderr=True)) as bar:
        task = bar.add_task("profiling", total=total)

        def draw(done: int, of: int, label: str) -> None:
            bar.update(task, completed=position(done, label), description=f"profiling {label}")

        yield draw


def _discover(args: argparse.Namespace) -> int:
    from scout_core.moe import CatalogSet, discover

    try:
        classes = _classes(args)
        profiler = _profiler(args)
    except (ValueError, KeyError, TypeError, OSError, argparse.ArgumentTypeError) as exc:
        print(f"scout catalog discover: {exc}", file=sys.stderr)
        return 2
    total = sum(len(c.admitted) for c in classes)
    with _progress(total, args.quiet) as progress:
        catalogs = CatalogSet(
            [discover(c, profiler, device=args.device_name, progress=progress) for c in classes]
        )
    path = catalogs.save(args.out)
    _print_summary(catalogs)
    print(
        f"wrote {path} ({len(catalogs)} classes, {catalogs.size} representatives in one rotation)"
    )
    return 0


def _print_summary(catalogs: Any) -> None:
    first = next(iter(catalogs.catalogs.values()))
    env = first.environment
    print(
        f"environment: device {env.device!r}, torch {env.torch}, CUDA {env.cuda}, "
        f"Triton {env.triton}, profiler {env.profiler.get('name')}"
    )
    print(
        f"{'class':<22} {'admitted':>9} {'representatives':>16} {'reduction':>10} {'uncertain':>10}"
    )
    for s in catalogs.summary():
        print(
            f"{s['class']:<22} {s['admitted']:>9} {s['representatives']:>16} "
            f"{s['reduction']:>10.2%} {s['uncertain']:>10}"
        )


def _show(args: argparse.Namespace) -> int:
    from scout_core.errors import CatalogError
    from scout_core.moe import CatalogSet

    try:
        catalogs = CatalogSet.load(args.path)
    except CatalogError as exc:
        print(f"scout catalog show: {exc}", file=sys.stderr)
        return 2
    _print_summary(catalogs)
    for name, catalog in catalogs.catalogs.items():
        reps = ", ".join(
            s.label().split(" ")[0].removeprefix("rows=") for s in catalog.representatives
        )
        print(f"{name}: rotation of {catalog.size}: rows {reps}")
    return 0


def add_parser(sub: Any) -> None:
    """Register ``catalog discover`` and ``catalog show`` under the ``scout`` parser."""
    p = sub.add_parser("catalog", help="build or inspect an MoE shape catalog")
    verbs = p.add_subparsers(dest="verb", required=True)
    d = verbs.add_parser("discover", help="profile admitted expert shapes; write the catalog")
    d.add_argument("--out", required=True, help="catalog file to write (JSON)")
    w = d.add_argument_group("workload")
    w.add_argument(
        "--projection",
        action="append",
        metavar="KxN",
        help="expert GEMM projection, input x output features (repeatable; default 128x128)",
    )
    w.add_argument(
        "--experts-per-kernel",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1],
        metavar="E[,E...]",
        help="experts per kernel launch (default 1)",
    )
    w.add_argument(
        "--tokens",
        type=parse_tokens,
        default=list(range(1, 2049)),
        metavar="SPEC",
        help="admitted rows per expert: A:B, A:B:STEP or a list (default 1:2048)",
    )
    w.add_argument(
        "--token-vectors",
        metavar="FILE",
        help="JSON list of per-expert row vectors (heterogeneous routing)",
    )
    w.add_argument(
        "--model",
        metavar="FILE",
        help="JSON list of MoE layers (name, num_experts, ep_size, d_model, d_ff, "
        "max_tokens_per_expert, ...): one class per distinct expert GEMM "
        "(--tokens and --projection are not used)",
    )
    w.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    t = d.add_argument_group("profiler")
    t.add_argument(
        "--profiler",
        choices=("tile", "cublas"),
        default="tile",
        help="tile: analytic tile model (any host); cublas: run on this GPU",
    )
    t.add_argument(
        "--tile",
        metavar="MxNxK[/S]",
        help="one fixed tile config (default: the built-in per-bucket table)",
    )
    t.add_argument(
        "--rules",
        metavar="FILE",
        help='JSON list of {"max_rows": R|null, "config": {"block_m": ...}}',
    )
    t.add_argument("--num-sms", type=int, default=108, help="SMs of the target GPU (default 108)")
    t.add_argument("--ctas-per-sm", type=int, default=1)
    t.add_argument(
        "--no-wave-regimes",
        action="store_true",
        help="do not separate shapes by the number of waves their grid takes",
    )
    t.add_argument("--kernel", default="grouped_gemm", help="kernel name in the fingerprint")
    d.add_argument("--device-name", help="target device name (default: this host's device)")
    d.add_argument("--quiet", action="store_true", help="no progress bar")
    d.set_defaults(func=_discover)
    s = verbs.add_parser("show", help="print a catalog file's classes and representatives")
    s.add_argument("path")
    s.set_defaults(func=_show)
