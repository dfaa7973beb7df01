"""A small autotuned Triton GEMM for the ``gpu`` tests of the Triton profiler (imports triton).

No ``from __future__ import annotations`` here: Triton reads the kernel's annotations.
"""

from typing import Any

import torch
import triton
import triton.language as tl

from scout_core.moe.shapes import ExpertShape


@triton.autotune(
    configs=[
        triton.Config({"block_m": 16, "block_n": 64, "block_k": 32}, num_warps=4),
        triton.Config({"block_m": 64, "block_n": 64, "block_k": 64}, num_warps=4),
    ],
    key=["m_bucket", "n", "k"],
)
@triton.jit
def scout_test_gemm(  # noqa: PLR0917  # a Triton kernel takes its arguments positionally
    a_ptr,
    b_ptr,
    c_ptr,
    m,
    n,
    k,
    m_bucket,
    block_m: tl.constexpr,
    block_n: tl.constexpr,
    block_k: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * block_m + tl.arange(0, block_m)
    rn = pid_n * block_n + tl.arange(0, block_n)
    rk = tl.arange(0, block_k)
    acc = tl.zeros((block_m, block_n), dtype=tl.float32)
    for step in range(0, tl.cdiv(k, block_k)):
        kk = step * block_k + rk
        a = tl.load(
            a_ptr + rm[:, None] * k + kk[None, :],
            mask=(rm[:, None] < m) & (kk[None, :] < k),
            other=0.0,
        )
        b = tl.load(
            b_ptr + kk[:, None] * n + rn[None, :],
            mask=(kk[:, None] < k) & (rn[None, :] < n),
            other=0.0,
        )
        acc += tl.dot(a, b)
    tl.store(
        c_ptr + rm[:, None] * n + rn[None, :],
        acc.to(tl.bfloat16),
        mask=(rm[:, None] < m) & (rn[None, :] < n),
    )


def launch(shape: ExpertShape, *, out: list[torch.Tensor] | None = None) -> None:
    """One launch per expert (rows > 0) of ``shape``, bf16, deterministic inputs."""
    gen = torch.Generator(device="cuda").manual_seed(7)
    w = torch.randn(shape.k, shape.n, device="cuda", dtype=torch.bfloat16, generator=gen)
    for r in shape.rows:
        if r == 0:
            continue
        x = torch.randn(r, shape.k, device="cuda", dtype=torch.bfloat16, generator=gen)
        y = torch.empty(r, shape.n, device="cuda", dtype=torch.bfloat16)

        def grid(meta: dict[str, Any], r: int = r) -> tuple[int, int]:
            return (
                triton.cdiv(r, meta["block_m"]),
                triton.cdiv(shape.n, meta["block_n"]),
            )

        bucket = triton.next_power_of_2(r)
        scout_test_gemm[grid](x, w, y, r, shape.n, shape.k, bucket)
        if out is not None:
            out.append((x.float() @ w.float() - y.float()).abs().max().reshape(1))
