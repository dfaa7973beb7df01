"""Expert-input shapes and the expert class a catalog is built for.

An expert GEMM computes ``Y[r, n] = X[r, k] @ W[k, n]`` for every expert in one kernel
launch: routing decides ``r``, the rows (tokens) each expert receives; the model fixes the
projection ``k x n``. :class:`ExpertShape` is one launch, :class:`ExpertClass` the workload
one catalog covers; :meth:`ExpertClass.describe` is the model part of the catalog's
environment binding.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DTYPES", "ExpertClass", "ExpertShape"]

DTYPES: tuple[str, ...] = ("bfloat16", "float16", "float32")
"""Expert GEMM dtypes a class may name."""


@dataclass(frozen=True, slots=True, order=True)
class ExpertShape:
    """One expert-kernel launch: rows per expert and the ``k x n`` projection."""

    rows: tuple[int, ...]
    """Tokens each expert of the kernel receives (length = experts per kernel)."""
    k: int
    """Input features (the reduction dimension)."""
    n: int

    def __post_init__(self) -> None:
        if not self.rows or any((not isinstance(r, int)) or r < 0 for r in self.rows):
            raise ValueError(f"rows must be a non-empty tuple of integers >= 0, got {self.rows}")
        if self.k < 1 or self.n < 1:
            raise ValueError(f"projection must be at least 1x1, got k={self.k} n={self.n}")

    @property
    def total_rows(self) -> int:
        """Tokens the whole launch processes (its semantic work, in rows)."""
        return sum(self.rows)

    def label(self) -> str:
        """Short human form, e.g. ``rows=64x4 128x128`` or ``rows=(3,9) 16x32``."""
        if len(set(self.rows)) == 1:
            rows = f"{self.rows[0]}" if len(self.rows) == 1 else f"{self.rows[0]}x{len(self.rows)}"
        else:
            rows = "(" + ",".join(map(str, self.rows)) + ")"
        return f"rows={rows} {self.k}x{self.n}"

    def to_json(self) -> dict[str, Any]:
        return {"rows": list(self.rows), "k": self.k, "n": self.n}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ExpertShape:
        return cls(rows=tuple(int(r) for r in data["rows"]), k=int(data["k"]), n=int(data["n"]))


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpertClass:
    """The workload of one catalog: one projection, experts per kernel, admitted rows."""

    name: str
    """Identifies the class inside a catalog set, e.g. ``"up:16x32/e2"``."""
    k: int
    n: int
    experts_per_kernel: int = 1
    """Experts one kernel launch processes (1: a plain GEMM per expert)."""
    admitted: tuple[tuple[int, ...], ...]
    """Admitted row vectors, one entry per expert of the kernel, in discovery order."""
    dtype: str = "bfloat16"
    """One of :data:`DTYPES`."""
    layers: tuple[str, ...] = field(default=())
    """Names of the layer projections that share this class (documentation and routing)."""

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("an expert class needs a name")
        if self.experts_per_kernel < 1:
            raise ValueError(f"experts_per_kernel must be >= 1, got {self.experts_per_kernel}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not one of {DTYPES}")
        if not self.admitted:
            raise ValueError(f"class {self.name!r} admits no shapes")
        if len(set(self.admitted)) != len(self.admitted):
            raise ValueError(f"class {self.name!r} lists an admitted row vector twice")
        for vec in self.admitted:
            if len(vec) != self.experts_per_kernel:
                raise ValueError(
                    f"class {self.name!r}: row vector {vec} has {len(vec)} entries, "
                    f"experts_per_kernel is {self.experts_per_kernel}"
                )
        self.shapes()  # builds every ExpertShape, which validates rows and the projection

    @classmethod
    def uniform(
        cls,
        *,
        name: str,
        k: int,
        n: int,
        tokens: Iterable[int],
        experts_per_kernel: int = 1,
        dtype: str = "bfloat16",
        layers: tuple[str, ...] = (),
    ) -> ExpertClass:
        """Every expert of the kernel receives the same row count, for each admitted count."""
        admitted = tuple((int(t),) * experts_per_kernel for t in tokens)
        return cls(
            name=name,
            k=k,
            n=n,
            experts_per_kernel=experts_per_kernel,
            admitted=admitted,
            dtype=dtype,
            layers=layers,
        )

    def shapes(self) -> list[ExpertShape]:
        """The admitted shapes, in discovery order."""
        return [ExpertShape(rows=vec, k=self.k, n=self.n) for vec in self.admitted]

    def describe(self) -> dict[str, Any]:
        """The model configuration this class's catalog is bound to (JSON-able)."""
        return {
            "name": self.name,
            "k": self.k,
            "n": self.n,
            "experts_per_kernel": self.experts_per_kernel,
            "dtype": self.dtype,
            "layers": list(self.layers),
            "admitted": [list(v) for v in self.admitted],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ExpertClass:
        return cls(
            name=str(data["name"]),
            k=int(data["k"]),
            n=int(data["n"]),
            experts_per_kernel=int(data["experts_per_kernel"]),
            dtype=str(data["dtype"]),
            layers=tuple(str(x) for x in data["layers"]),
            admitted=tuple(tuple(int(r) for r in v) for v in data["admitted"]),
        )
