"""Heterogeneous routing: expert classes of a model whose MoE layers differ.

Contract: :func:`expert_classes` puts two projections in one class, and so one catalog,
exactly when the kernel sees the same problem (``k x n``, experts per kernel, dtype,
admitted row vectors). Docs: docs/moe.md, "Heterogeneous routing".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from scout_core.moe.shapes import ExpertClass

__all__ = ["ExpertLayerSpec", "class_for", "expert_classes"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpertLayerSpec:
    """One MoE layer as the expert kernels see it."""

    name: str
    """The layer's module path, e.g. ``"layers.1.moe"``."""
    num_experts: int
    """Experts in the layer, over all expert-parallel ranks."""
    ep_size: int = 1
    d_model: int
    """Model width (input of ``up``, output of ``down``)."""
    d_ff: int
    gated: bool = False
    """``up`` produces ``2 * d_ff`` features (SwiGLU-style experts)."""
    max_tokens_per_expert: int = 0
    """Admitted rows per expert are ``min_tokens_per_expert .. max_tokens_per_expert``."""
    min_tokens_per_expert: int = 1
    """0 admits an expert that receives nothing."""
    experts_per_kernel: int | None = None
    """Experts one kernel launch processes; default: the rank's local experts."""
    token_vectors: tuple[tuple[int, ...], ...] | None = None
    """Admitted per-expert row vectors (heterogeneous routing); replaces the range."""

    def __post_init__(self) -> None:
        if self.num_experts < 1 or self.ep_size < 1 or self.num_experts % self.ep_size:
            raise ValueError(
                f"layer {self.name!r}: num_experts ({self.num_experts}) must be a positive "
                f"multiple of ep_size ({self.ep_size})"
            )
        if self.d_model < 1 or self.d_ff < 1:
            raise ValueError(f"layer {self.name!r}: widths must be >= 1")
        if self.token_vectors is None and not (
            0 <= self.min_tokens_per_expert <= self.max_tokens_per_expert
        ):
            raise ValueError(
                f"layer {self.name!r}: admitted rows {self.min_tokens_per_expert}.."
                f"{self.max_tokens_per_expert} are empty; set max_tokens_per_expert or "
                "token_vectors"
            )

    @property
    def local_experts(self) -> int:
        return self.num_experts // self.ep_size

    @property
    def kernel_experts(self) -> int:
        return self.experts_per_kernel or self.local_experts

    def admitted(self) -> tuple[tuple[int, ...], ...]:
        """The admitted row vectors of one kernel launch."""
        if self.token_vectors is not None:
            return tuple(tuple(v) for v in self.token_vectors)
        e = self.kernel_experts
        lo, hi = self.min_tokens_per_expert, self.max_tokens_per_expert
        return tuple((t,) * e for t in range(lo, hi + 1))

    def projections(self) -> list[tuple[str, int, int]]:
        """``(name, k, n)`` of the layer's expert GEMMs."""
        up_n = 2 * self.d_ff if self.gated else self.d_ff
        return [
            (f"{self.name}.up", self.d_model, up_n),
            (f"{self.name}.down", self.d_ff, self.d_model),
        ]


def expert_classes(
    layers: Sequence[ExpertLayerSpec], *, dtype: str = "bfloat16"
) -> list[ExpertClass]:
    """Group the layers' expert GEMMs into classes, one catalog each.

    Classes are named ``"<k>x<n>/e<experts per kernel>"`` (``#2``, ``#3``, ... for the same
    problem with other admitted rows), in order of first use.
    """
    groups: dict[tuple[int, int, int, tuple[tuple[int, ...], ...]], list[str]] = {}
    for layer in layers:
        admitted = layer.admitted()
        for proj, k, n in layer.projections():
            groups.setdefault((k, n, layer.kernel_experts, admitted), []).append(proj)
    seen: dict[str, int] = {}
    out = []
    for (k, n, e, admitted), members in groups.items():
        base = f"{k}x{n}/e{e}"
        seen[base] = seen.get(base, 0) + 1
        name = base if seen[base] == 1 else f"{base}#{seen[base]}"
        out.append(
            ExpertClass(
                name=name,
                k=k,
                n=n,
                experts_per_kernel=e,
                admitted=admitted,
                dtype=dtype,
                layers=tuple(members),
            )
        )
    return out


def class_for(classes: Sequence[ExpertClass], projection: str) -> ExpertClass:
    """The class whose catalog covers ``projection`` (e.g. ``"layers.1.moe.up"``)."""
    for cls in classes:
        if projection in cls.layers:
            return cls
    known = sorted(p for c in classes for p in c.layers)
    raise KeyError(f"no expert class covers {projection!r}; known projections: {known}")
