"""The GPU profilers: their trace logic on CPU (synthetic launches), the real thing on CUDA.

The tests marked ``gpu`` run cuBLAS (through ``torch.matmul``) and an autotuned Triton
GEMM on a CUDA device and check that what the profilers read agrees with what was
launched; they skip without CUDA (and the Triton one without Triton).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import torch

from scout_core.moe.gpu import KernelLaunch, _from_launches, _resolve, parse_cluster, parse_tile
from scout_core.moe.shapes import ExpertShape
from scout_core.moe.tiles import TileConfig, path_counts

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_the_module_imports_without_a_gpu_or_triton() -> None:
    code = "import sys, scout_core.moe.gpu; print('triton' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(
    ("name", "tile"),
    [
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1",
         (128, 128, 64)),
        ("ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x3_tn", (128, 64, 64)),
        ("cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_256x128_32x3_nn_align8", (256, 128, 32)),
        ("nvjet_tst_128x64_64x8_2x1_v_bz_TNT", (128, 64, 64)),
        ("void at::native::vectorized_elementwise_kernel<4>", None),
    ],
)  # fmt: skip
def test_parse_tile(name: str, tile: tuple[int, int, int] | None) -> None:
    assert parse_tile(name) == tile


GEMM = "cutlass_80_tensorop_bf16_s16816gemm_bf16_64x128_32x3_tn_align8"


def test_resolve_finds_the_frame_that_reproduces_the_grid() -> None:
    cfg = TileConfig(block_m=64, block_n=128, block_k=32)
    # 300 rows x 128 cols under a 64x128 tile: cuBLAS's column-major frame (its M is our n)
    # takes 2 x 3 = 6 CTAs; a rows-first frame would take 5.
    cublas = _resolve(KernelLaunch(GEMM, (2, 3, 1), (128, 1, 1)), 300, 256, 128)
    want = path_counts(ExpertShape(rows=(128,), k=256, n=300), cfg)
    assert cublas == ({**want, "pad": 0}, "cublas")
    rows = _resolve(KernelLaunch(GEMM, (5, 1, 1), (128, 1, 1)), 300, 256, 128)
    want = path_counts(ExpertShape(rows=(300,), k=256, n=128), cfg)
    assert rows == ({**want, "pad": 0}, "rows")
    split = _resolve(KernelLaunch(GEMM, (2, 3, 2), (128, 1, 1)), 300, 256, 128)  # split-K 2
    assert isinstance(split, tuple) and sum(split[0].values()) == 12
    # 100 rows x 384 cols: 6 CTAs in either frame; cuBLAS's own frame wins.
    both = _resolve(KernelLaunch(GEMM, (6, 1, 1), (128, 1, 1)), 100, 256, 384)
    assert isinstance(both, tuple) and both[1] == "cublas"
    wrong = _resolve(KernelLaunch(GEMM, (7, 1, 1), (128, 1, 1)), 300, 256, 128)
    assert isinstance(wrong, str) and "does not reproduce grid" in wrong
    assert "no tile size" in str(_resolve(KernelLaunch("gemv_kernel", (1, 1, 1), None), 1, 8, 8))


def test_cluster_padding_is_its_own_path() -> None:
    # Seen on an H200 (cuBLAS 13): 17 rows x 128 cols ran this kernel on grid (8, 1, 1):
    # 2 tiles of 64 along n x 3 tiles of 8 along the rows, the rows rounded up to the
    # cluster's 4: 8 CTAs, 2 of them padding.
    name = "nvjet_sm90_tst_64x8_64x16_2x4_h_bz_NNT"
    assert parse_cluster(name) == (2, 4) and parse_cluster(GEMM) == (1, 1)
    counts, frame = _resolve(KernelLaunch(name, (8, 1, 1), (384, 1, 1)), 17, 128, 128)
    assert frame == "cublas" and counts["pad"] == 2 and sum(counts.values()) == 8


def test_profiles_from_launches_need_stable_repeats_and_one_gemm_per_expert() -> None:
    shape = ExpertShape(rows=(300, 300), k=256, n=128)
    launch = KernelLaunch(GEMM, (2, 3, 1), (128, 1, 1))
    stable = _from_launches([[[launch], [launch]]] * 3, shape, [300, 300], num_sms=132)
    assert stable.certain and sum(stable.counts or ()) == 12
    assert stable.fingerprint is not None and ":s1:w1:cublas" in stable.fingerprint
    other = KernelLaunch(GEMM.replace("64x128", "128x128"), (3, 1, 1), (256, 1, 1))
    flaky = _from_launches([[[launch], [launch]], [[other], [launch]]], shape, [300, 300], 132)
    assert flaky.fingerprint is None and "changed across 2 repeats" in flaky.note
    reduce = KernelLaunch("splitKreduce_kernel", (6, 1, 1), (256, 1, 1))
    with_aux = _from_launches([[[launch, reduce], [launch, reduce]]], shape, [300, 300], 132)
    assert with_aux.certain and ":aux:" in (with_aux.fingerprint or "")
    assert with_aux.counts == stable.counts
    persistent = KernelLaunch(GEMM, (1, 1, 1), (128, 1, 1))  # fewer CTAs than tiles
    kept = _from_launches([[[persistent], [persistent]]], shape, [300, 300], 132)
    assert kept.fingerprint is not None and kept.counts is None and not kept.certain


@pytest.mark.gpu
@needs_cuda
def test_cublas_profiler_reads_a_stable_consistent_profile() -> None:
    from scout_core.moe.catalog import discover
    from scout_core.moe.gpu import CublasProfiler
    from scout_core.moe.shapes import ExpertClass

    profiler = CublasProfiler()
    seen = []
    for rows, k, n in [((1,), 128, 128), ((100,), 128, 128), ((1000,), 128, 128),
                       ((64, 64), 1024, 4096), ((2048,), 6144, 10752)]:  # fmt: skip
        shape = ExpertShape(rows=rows, k=k, n=n)
        p = profiler.profile(shape)
        launches = profiler.last_launches
        again = profiler.profile(shape)
        seen.append((shape.label(), [x.name for x in launches], p.note))
        assert launches, "torch.matmul launched no kernel"
        assert p.fingerprint is not None, p.note
        assert again == p  # the same profile every time
        if p.counts is not None:  # counts are only given when the tile reproduced the grid
            gemm_ctas = sum(x.ctas or 0 for x in launches if parse_tile(x.name))
            assert sum(p.counts) == gemm_ctas  # every launched CTA is a counted unit
    print("cuBLAS launches:", *seen, sep="\n  ")
    cls = ExpertClass.uniform(name="cublas", k=128, n=128, tokens=range(1, 65))
    catalog = discover(cls, profiler)  # the cover is re-verified when the catalog is built
    print("cuBLAS catalog 128x128 rows 1..64:", catalog.summary())
    assert catalog.size <= 64


@pytest.mark.gpu
@needs_cuda
@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton")
def test_triton_profiler_reads_the_autotuned_config() -> None:
    import _triton_gemm

    from scout_core.moe.catalog import discover
    from scout_core.moe.gpu import TritonProfiler
    from scout_core.moe.shapes import ExpertClass

    profiler = TritonProfiler(
        _triton_gemm.scout_test_gemm,
        _triton_gemm.launch,
        block_keys=("block_m", "block_n", "block_k"),
        per_expert=True,  # the test kernel is a plain GEMM, launched once per expert
    )
    for rows in [(1,), (16,), (100,), (37, 5)]:
        shape = ExpertShape(rows=rows, k=96, n=160)
        errors: list[torch.Tensor] = []
        _triton_gemm.launch(shape, out=errors)
        assert max(float(e) for e in errors) < 0.5  # the kernel computes the GEMM
        p = profiler.profile(shape)
        assert p.certain, p.note
        want: dict[str, int] = {}
        for r in rows:  # each expert's launch, under the config the autotuner picked for it
            _triton_gemm.launch(ExpertShape(rows=(r,), k=96, n=160))
            best = _triton_gemm.scout_test_gemm.best_config
            cfg = TileConfig(block_m=best.kwargs["block_m"], block_n=best.kwargs["block_n"],
                             block_k=best.kwargs["block_k"], num_warps=best.num_warps,
                             num_stages=best.num_stages)  # fmt: skip
            assert f"{cfg.key()}:waves" in (p.fingerprint or "")
            for path, c in path_counts(ExpertShape(rows=(r,), k=96, n=160), cfg).items():
                want[f"{cfg.key()}:{path}"] = want.get(f"{cfg.key()}:{path}", 0) + c
        assert dict(zip(p.paths, p.counts or (), strict=True)) == want
    cls = ExpertClass.uniform(name="triton", k=96, n=160, tokens=range(1, 129))
    catalog = discover(cls, profiler)
    print("Triton catalog 96x160 rows 1..128:", catalog.summary())
    assert catalog.uncertain == 0 and catalog.size < 128
