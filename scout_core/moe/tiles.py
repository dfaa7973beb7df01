"""An analytic tile model of GEMM and grouped GEMM: shape profiles without a GPU.

Contract: :class:`TileModel` profiles an expert shape as a fingerprint (kernel, the tile
configuration a :class:`TileRule` picks by the largest per-expert row count, experts per
launch, projection, wave regime) and path counts summed over a launch's experts; a shape no
rule admits is uncertain. Docs: docs/moe.md, "The analytic tile model".
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scout_core.moe.coverage import Profile
from scout_core.moe.shapes import ExpertShape

__all__ = [
    "DEFAULT_RULES",
    "TileConfig",
    "TileModel",
    "TileRule",
    "k_paths",
    "path_counts",
    "path_names",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class TileConfig:
    """One kernel configuration: tile sizes, split-K and launch parameters."""

    block_m: int
    """Rows of the output tile (the routed dimension)."""
    block_n: int
    block_k: int
    split_k: int = 1
    """Slices each tile's reduction is cut into (each slice is a unit of work)."""
    num_warps: int = 4
    """Like ``num_stages``: part of the configuration, not of the path counts."""
    num_stages: int = 3

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "block_k", "split_k", "num_warps", "num_stages"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"TileConfig.{name} must be an integer >= 1, got {value!r}")

    def key(self) -> str:
        """Compact name, e.g. ``m64n128k64s1w4p3``."""
        return (
            f"m{self.block_m}n{self.block_n}k{self.block_k}s{self.split_k}"
            f"w{self.num_warps}p{self.num_stages}"
        )

    def to_json(self) -> dict[str, int]:
        return {
            "block_m": self.block_m,
            "block_n": self.block_n,
            "block_k": self.block_k,
            "split_k": self.split_k,
            "num_warps": self.num_warps,
            "num_stages": self.num_stages,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TileConfig:
        return cls(**{k: int(v) for k, v in data.items()})


@dataclass(frozen=True, slots=True)
class TileRule:
    """Use ``config`` when the largest per-expert row count is at most ``max_rows``."""

    max_rows: int | None
    """Upper bound of the bucket (inclusive); ``None``: no bound (the last rule)."""
    config: TileConfig

    def to_json(self) -> dict[str, Any]:
        return {"max_rows": self.max_rows, "config": self.config.to_json()}


def _rule(max_rows: int | None, tile: tuple[int, int, int], warps: int, stages: int) -> TileRule:
    m, n, k = tile
    cfg = TileConfig(block_m=m, block_n=n, block_k=k, num_warps=warps, num_stages=stages)
    return TileRule(max_rows, cfg)


DEFAULT_RULES: tuple[TileRule, ...] = (
    _rule(16, (16, 64, 64), 4, 4),
    _rule(32, (32, 64, 64), 4, 4),
    _rule(64, (64, 64, 64), 4, 4),
    _rule(128, (64, 128, 64), 4, 4),
    _rule(256, (128, 128, 64), 8, 3),
    _rule(512, (128, 128, 64), 8, 4),
    _rule(1024, (128, 256, 64), 8, 3),
    _rule(2048, (128, 256, 64), 8, 4),
    _rule(None, (128, 256, 32), 8, 4),
)
"""An illustrative per-bucket config table (power-of-two row buckets), not a measured one."""


def k_paths(k: int, cfg: TileConfig) -> Counter[str]:
    """How many of one tile's split-K slices follow each K-loop path."""
    steps = math.ceil(k / cfg.block_k)
    masked = k % cfg.block_k != 0
    per = math.ceil(steps / cfg.split_k)
    out: Counter[str] = Counter()
    for s in range(cfg.split_k):
        lo, hi = min(s * per, steps), min((s + 1) * per, steps)
        tail = masked and hi == steps and hi > lo
        out[f"k{hi - lo}" + ("+t" if tail else "")] += 1
    return out


def path_names(k: int, cfg: TileConfig) -> tuple[str, ...]:
    """The path vocabulary of one configuration and reduction size, in a fixed order."""
    ks = sorted(k_paths(k, cfg))
    return tuple(
        f"m:{m}/n:{n}/{kp}" for m in ("full", "tail") for n in ("full", "tail") for kp in ks
    )


def path_counts(shape: ExpertShape, cfg: TileConfig) -> dict[str, int]:
    """Units of work per path for ``shape`` under ``cfg``, summed over its experts."""
    n_tiles = {"full": shape.n // cfg.block_n, "tail": int(shape.n % cfg.block_n != 0)}
    per_tile = k_paths(shape.k, cfg)
    counts = dict.fromkeys(path_names(shape.k, cfg), 0)
    for r in shape.rows:
        m_tiles = {"full": r // cfg.block_m, "tail": int(r % cfg.block_m != 0)}
        for m, mc in m_tiles.items():
            for n, nc in n_tiles.items():
                for kp, kc in per_tile.items():
                    counts[f"m:{m}/n:{n}/{kp}"] += mc * nc * kc
    return counts


class TileModel:
    """The analytic profiler: fingerprint and path counts from the tile arithmetic."""

    name = "tile-model"

    def __init__(
        self,
        rules: Sequence[TileRule] | TileConfig = DEFAULT_RULES,
        *,
        kernel: str = "grouped_gemm",
        num_sms: int = 108,
        ctas_per_sm: int = 1,
        wave_regimes: bool = True,
    ) -> None:
        if isinstance(rules, TileConfig):
            rules = (TileRule(None, rules),)
        self.rules = tuple(rules)
        if not self.rules:
            raise ValueError("TileModel needs at least one rule")
        bounds = [r.max_rows for r in self.rules]
        if any(b is None for b in bounds[:-1]):
            raise ValueError("only the last TileRule may be unbounded (max_rows=None)")
        finite = [b for b in bounds if b is not None]
        if finite != sorted(set(finite)) or any(b < 0 for b in finite):
            raise ValueError(f"TileRule bounds must be increasing and >= 0, got {bounds}")
        if num_sms < 1 or ctas_per_sm < 1:
            raise ValueError(f"num_sms and ctas_per_sm must be >= 1, got {num_sms}, {ctas_per_sm}")
        self.kernel = kernel
        self.num_sms = num_sms
        self.ctas_per_sm = ctas_per_sm
        self.wave_regimes = wave_regimes

    def select(self, shape: ExpertShape) -> TileConfig | None:
        """The configuration the kernel would pick for ``shape`` (None: none admits it)."""
        key = max(shape.rows)
        for rule in self.rules:
            if rule.max_rows is None or key <= rule.max_rows:
                return rule.config
        return None

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kernel": self.kernel,
            "rules": [r.to_json() for r in self.rules],
            "num_sms": self.num_sms,
            "ctas_per_sm": self.ctas_per_sm,
            "wave_regimes": self.wave_regimes,
        }

    def profile(self, shape: ExpertShape) -> Profile:
        cfg = self.select(shape)
        if cfg is None:
            return Profile(
                None, note=f"no tile rule admits {max(shape.rows)} rows per expert (kernel unknown)"
            )
        counts = path_counts(shape, cfg)
        units = sum(counts.values())
        parts = [
            self.kernel,
            cfg.key(),
            f"e{len(shape.rows)}",
            f"k{shape.k}",
            f"n{shape.n}",
        ]
        if self.wave_regimes:
            parts.append(f"waves{math.ceil(units / (self.num_sms * self.ctas_per_sm))}")
        return Profile("|".join(parts), tuple(counts), tuple(counts.values()))
