"""Unit tests for scout_core.decision.signature: definition, sensitivity, dtypes, views, stability.

The reference implementation below is written from the definition in the module
docstring with Python integers only, so the torch kernels (chunked, wrapping int64)
are checked against arithmetic that cannot overflow.
"""

from __future__ import annotations

import importlib

import pytest
import torch

from scout_core.decision.signature import (
    MAX_FOLD_WORDS,
    finalize,
    fold,
    from_int64,
    signature,
    signature_many,
    to_int64,
)

# scout_core re-exports the function ``signature``, which shadows the submodule as an
# attribute of the package; the module itself is needed for its private helpers.
sigmod = importlib.import_module("scout_core.decision.signature")

M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


# --------------------------------------------------------------------------- reference


def ref_mix(z: int) -> int:
    z &= M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def ref_absorb(h: int, v: int) -> int:
    return ref_mix(((h ^ (v & M64)) + GOLDEN) & M64)


def tensor_bytes(t: torch.Tensor) -> bytes:
    return bytes(t.detach().contiguous().reshape(-1).view(torch.uint8).tolist())


M32 = (1 << 32) - 1
LANES = 2 * MAX_FOLD_WORDS


def ref_fold(data: bytes) -> list[int]:
    """32-bit lanes, rows of 1024, odd 32-bit row multipliers; lanes read back in pairs."""
    nbytes = len(data)
    data = data + b"\0" * (-len(data) % 4)
    lanes = [int.from_bytes(data[k : k + 4], "little") for k in range(0, len(data), 4)]
    width = min(MAX_FOLD_WORDS, -(-nbytes // 8))
    out = [0] * (2 * width)
    for p, y in enumerate(lanes):
        i, j = divmod(p, LANES)
        r = (ref_mix((i + 1) * GOLDEN) | 1) & M32
        out[j] = (out[j] + r * y) & M32
    return [out[2 * k] | (out[2 * k + 1] << 32) for k in range(width)]


def ref_signature(t: torch.Tensor) -> int:
    words = ref_fold(tensor_bytes(t))
    body = sum(ref_mix(w + (j + 1) * GOLDEN) for j, w in enumerate(words)) & M64
    code = 0xCBF29CE484222325
    for byte in str(t.dtype).encode():
        code = ((code ^ byte) * 0x100000001B3) & M64
    h = 0x5C0D7E11A9B3F00D
    dims = list(t.shape)
    for v in (code, len(dims), *dims, t.numel() * t.element_size(), len(words), body):
        h = ref_absorb(h, v)
    return h


def unsigned(words: torch.Tensor) -> list[int]:
    return [v & M64 for v in words.tolist()]


def flip_bit(t: torch.Tensor, byte_index: int, bit: int) -> torch.Tensor:
    raw = t.detach().clone().contiguous().reshape(-1).view(torch.uint8)
    raw[byte_index] ^= 1 << bit
    return raw.view(t.dtype).reshape(t.shape)


DTYPES = [
    torch.float32,
    torch.bfloat16,
    torch.float16,
    torch.float64,
    torch.int8,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.bool,
    *[
        getattr(torch, name)
        for name in ("float8_e4m3fn", "float8_e5m2")
        if hasattr(torch, name)  # float8 arrived in torch 2.1; absent dtypes are skipped
    ],
]


def sample(dtype: torch.dtype, n: int = 300, seed: int = 7) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (n * dtype.itemsize,), dtype=torch.uint8, generator=g)
    if dtype == torch.bool:
        raw = raw & 1  # keep bool bytes canonical
    return raw.view(dtype)


# --------------------------------------------------------------------------- arithmetic


@pytest.mark.parametrize("n", [3, 4096])  # scalar loop and vectorised kernel
def test_torch_int64_arithmetic_wraps_mod_2_64(n: int) -> None:
    vals = [(1 << 62) + 12345, -(1 << 63), (1 << 63) - 1, -7, 0x123456789ABCDEF]
    a = torch.tensor([vals[k % len(vals)] for k in range(n)], dtype=torch.int64)
    b = torch.tensor([to_int64(0xBF58476D1CE4E5B9)] * n, dtype=torch.int64)
    prod = (a * b).tolist()
    expect = [to_int64(((v & M64) * 0xBF58476D1CE4E5B9) & M64) for v in a.tolist()]
    assert prod == expect
    assert (a * to_int64(GOLDEN)).tolist() == [
        to_int64(((v & M64) * GOLDEN) & M64) for v in a.tolist()
    ]
    total = int(torch.mul(a, b).sum())
    assert total & M64 == sum(e & M64 for e in expect) & M64
    # reduction over rows (the fold's own kernel) wraps too
    col = torch.tensor([(1 << 63) - 1] * 8, dtype=torch.int64).reshape(8, 1)
    assert int(col.sum(0)) == to_int64((8 * ((1 << 63) - 1)) & M64)


def test_mix_tensor_matches_python_mix() -> None:
    z = torch.tensor([0, 1, -1, 1 << 62, -(1 << 63), 0x0123456789ABCDEF], dtype=torch.int64)
    assert unsigned(sigmod._mix64_tensor(z)) == [ref_mix(v & M64) for v in z.tolist()]


# --------------------------------------------------------------------------- definition


@pytest.mark.parametrize("nbytes", [0, 1, 7, 8, 9, 4095, 4096, 4097, 3 * 4096 + 13])
def test_fold_and_signature_match_reference(nbytes: int) -> None:
    t = sample(torch.uint8, n=nbytes, seed=nbytes)
    words = fold(t)
    assert words.dtype == torch.int64 and words.dim() == 1
    assert words.shape[0] == min(MAX_FOLD_WORDS, -(-nbytes // 8))
    assert unsigned(words) == ref_fold(tensor_bytes(t))
    assert signature(t) == ref_signature(t)


@pytest.mark.parametrize("chunk_rows", [1, 2, 3, 5, 8, 128, 1024, 1 << 20])
def test_chunking_never_changes_the_fold(chunk_rows: int) -> None:
    t = sample(torch.float32, n=11 * 1024 + 5, seed=3)  # 11 full rows and a tail
    full = t.view(torch.uint8)[: 11 * 4096].view(torch.int32).view(11, 1024).to(torch.int64)
    mult = sigmod._MULTIPLIERS.get(12, t.device).to(torch.int64)
    direct = (full * mult[:11]).sum(0)  # full-size temporary in int64: the plain definition
    tail = torch.zeros(1024, dtype=torch.int32)
    tail.view(torch.uint8)[:20] = t.view(torch.uint8)[11 * 4096 :]
    direct = (direct + tail.to(torch.int64) * mult[11]) & M32
    lanes = torch.where(direct >= 1 << 31, direct - (1 << 32), direct).to(torch.int32)
    assert torch.equal(sigmod._fold(t, chunk_rows), lanes.view(torch.int64))
    assert torch.equal(sigmod._fold(t, chunk_rows), fold(t))


def test_the_cpu_folds_with_one_integer_matrix_product_that_equals_the_chunked_fold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Random bytes over every row: the int32 products and sums wrap mod 2**32 many times.
    t = sample(torch.float32, n=300 * 1024 + 7, seed=11)
    assert sigmod._chunk_rows(t.device) is None  # this build's int32 mm is exact
    chunked = sigmod._fold(t, 128)
    assert torch.equal(sigmod._fold(t, None), chunked)
    assert torch.equal(fold(t), chunked)
    # Where the probe finds no exact int32 mm, the CPU chunks and signs the same.
    monkeypatch.setattr(sigmod, "_int_mm_folds", lambda: False)
    assert sigmod._chunk_rows(t.device) is not None
    assert torch.equal(fold(t), chunked)


def test_fold_does_not_depend_on_thread_count() -> None:
    t = sample(torch.float32, n=1 << 18, seed=5)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = fold(t)
        torch.set_num_threads(2)
        two = fold(t)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)


def test_signature_under_deterministic_algorithms() -> None:
    # Replay runs its work under torch.use_deterministic_algorithms(True).
    t = sample(torch.float32, n=3 * 1024 + 1, seed=6)
    expected = signature(t)
    before = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        assert signature(t) == expected
        assert torch.equal(sigmod._fold(t, 1), fold(t))
    finally:
        torch.use_deterministic_algorithms(before)


def test_multiplier_cache_growth_keeps_prefix() -> None:
    cpu = torch.device("cpu")
    small = sigmod._MULTIPLIERS.get(4, cpu).clone()
    sigmod._MULTIPLIERS.get(5000, cpu)  # grows the cache
    assert torch.equal(sigmod._MULTIPLIERS.get(4, cpu), small)
    assert [v & M32 for v in small.reshape(-1).tolist()] == [
        (ref_mix((i + 1) * GOLDEN) | 1) & M32 for i in range(4)
    ]
    assert small.dtype == torch.int32
    assert all(v & 1 for v in sigmod._MULTIPLIERS.get(5000, cpu).reshape(-1).tolist())


# --------------------------------------------------------------------------- sensitivity


def test_every_bit_of_a_small_tensor_is_seen() -> None:
    t = sample(torch.float32, n=16, seed=11)  # 64 bytes
    base = signature(t)
    seen = {base}
    for byte in range(64):
        for bit in range(8):
            s = signature(flip_bit(t, byte, bit))
            assert s != base, (byte, bit)
            seen.add(s)
    assert len(seen) == 1 + 64 * 8  # every single flip gives its own signature


def test_every_byte_position_is_seen_across_rows() -> None:
    t = sample(torch.float32, n=2 * 1024 + 150, seed=12)  # 2 full rows and a tail
    nbytes = t.numel() * 4
    base = signature(t)
    for byte in range(nbytes):
        # byte % 8 walks every bit of a word, bit 63 included, across all rows. Flips
        # of a high bit in one column but different rows may collide with each other
        # (2**63 * r is 2**63 for every odd r); each still differs from the original.
        assert signature(flip_bit(t, byte, byte % 8)) != base, byte
    low = {signature(flip_bit(t, word * 8, 0)) for word in range(nbytes // 8)}
    assert base not in low and len(low) == nbytes // 8  # low bits: all distinct


def test_top_bit_flip_in_a_chunked_fold() -> None:
    t = sample(torch.int64, n=5 * 512, seed=13)
    base = sigmod._fold(t, 2)
    for word in (0, 511, 512, 1500, 5 * 512 - 1):
        flipped = sigmod._fold(flip_bit(t, word * 8 + 7, 7), 2)
        diff = [j for j in range(512) if int(flipped[j]) != int(base[j])]
        assert diff == [word % 512]


def test_position_swaps_and_transposes_change_the_signature() -> None:
    t = torch.arange(1, 2049, dtype=torch.int64)  # 4 rows
    swapped = t.clone()
    swapped[[3, 515]] = swapped[[515, 3]]  # same column, different rows
    assert signature(swapped) != signature(t)
    swapped = t.clone()
    swapped[[3, 4]] = swapped[[4, 3]]  # same row
    assert signature(swapped) != signature(t)
    m = torch.arange(16, dtype=torch.float32).reshape(4, 4)
    assert signature(m.t()) != signature(m)
    sym = m + m.t()
    assert signature(sym.t()) == signature(sym)  # same bytes in the same order


# --------------------------------------------------------------------------- dtypes, shapes


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_training_dtype(dtype: torch.dtype) -> None:
    t = sample(dtype, n=700, seed=21)
    s = signature(t)
    assert 0 <= s < 1 << 64
    assert s == signature(t.clone()) == ref_signature(t)
    assert fold(t).shape[0] == min(512, -(-700 * dtype.itemsize // 8))
    bit = 0 if dtype == torch.bool else 5
    assert signature(flip_bit(t, 3, bit)) != s
    assert signature(flip_bit(t, t.numel() * dtype.itemsize - 1, bit)) != s


@pytest.mark.parametrize(
    "group",
    [
        [torch.float32, torch.int32],
        [torch.float16, torch.bfloat16],
        [torch.float64, torch.int64],
        [
            torch.int8,
            torch.uint8,
            torch.bool,
            *[getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)],
        ],
    ],
    ids=lambda g: "/".join(str(d).removeprefix("torch.") for d in g),
)
def test_dtype_matters_for_the_same_bytes(group: list[torch.dtype]) -> None:
    raw = torch.tensor([0, 1, 1, 0, 1, 0, 0, 1] * 4, dtype=torch.uint8)
    sigs = {signature(raw.view(dtype)) for dtype in group}
    assert len(sigs) == len(group)
    assert len({unsigned(fold(raw.view(d)))[0] for d in group}) == 1  # bytes alone agree


def test_shape_matters_for_the_same_bytes() -> None:
    t = torch.arange(6, dtype=torch.float32)
    sigs = {signature(t.reshape(s)) for s in [(6,), (2, 3), (3, 2), (1, 6), (6, 1), (1, 2, 3)]}
    assert len(sigs) == 6


def test_empty_and_scalar_tensors() -> None:
    shapes = [(0,), (0, 3), (3, 0), (0, 0)]
    sigs = [signature(torch.empty(s)) for s in shapes]
    assert len(set(sigs)) == len(shapes)
    assert fold(torch.empty(0, 3)).shape == (0,)
    assert signature(torch.empty(0, dtype=torch.float64)) != sigs[0]
    scalar = torch.tensor(1.5)
    assert scalar.dim() == 0
    assert signature(scalar) == ref_signature(scalar)
    assert signature(scalar) != signature(torch.tensor([1.5]))
    assert signature(scalar) != signature(torch.tensor(2.5))


# --------------------------------------------------------------------------- views


def test_views_sign_like_their_contiguous_copies() -> None:
    base = sample(torch.float32, n=64 * 96, seed=31).reshape(64, 96)
    views = [
        base[:, ::2],
        base.t(),
        base[5:40, 7:90],
        base.reshape(64, 8, 12).permute(2, 0, 1),
        base[3].expand(4, 96),
        base.reshape(-1)[1:],  # 4-byte offset: not word aligned
    ]
    for v in views:
        assert signature(v) == signature(v.contiguous()) == ref_signature(v)
    bf = sample(torch.bfloat16, n=999, seed=32)[1:]  # 2-byte offset
    assert bf.storage_offset() == 1
    assert signature(bf) == signature(bf.clone())


def test_lazy_conjugate_and_grad_tensors() -> None:
    c = torch.complex(torch.arange(4.0), torch.arange(4.0) + 1)
    assert signature(c.conj()) == signature(c.conj().resolve_conj())
    assert signature(c.conj()) != signature(c)
    p = torch.nn.Parameter(torch.arange(5.0))
    assert signature(p) == signature(torch.arange(5.0))


# --------------------------------------------------------------------------- stability


# Golden values, computed once from the definition (the 32-bit-lane fold, with the
# reference above). If one of these fails the signature's definition changed, and
# every peer of a job must run the same version.
GOLDEN_CASES = {
    "f32_arange_10": (lambda: torch.arange(10, dtype=torch.float32), 2905422214273431793),
    "i64_arange_3000": (lambda: torch.arange(3000, dtype=torch.int64), 17189791198674281984),
    "bf16_2x3": (lambda: torch.arange(6, dtype=torch.bfloat16).reshape(2, 3), 11639092918638818709),
    "bool_5": (lambda: torch.tensor([True, False, True, True, False]), 188031123408839469),
    "f32_empty": (lambda: torch.empty(0, dtype=torch.float32), 13065480544063567938),
    "f64_scalar": (lambda: torch.tensor(1.5, dtype=torch.float64), 6029812487650925456),
}


@pytest.mark.parametrize("name", sorted(GOLDEN_CASES))
def test_golden_signatures(name: str) -> None:
    make, expected = GOLDEN_CASES[name]
    assert signature(make()) == expected


def test_golden_fold_words() -> None:
    words = unsigned(fold(torch.arange(3000, dtype=torch.int64)))
    # Small int64 values leave the high lane of every word 0.
    assert words[:3] == [0x98EEBA00, 0x6E42CC66, 0x4396DECC]
    assert words[-1] == 0xF09B1285


def test_golden_signature_many() -> None:
    items = [torch.arange(4.0), None, torch.tensor([1, 2], dtype=torch.int32)]
    assert signature_many(items) == 11882343997136836753


# --------------------------------------------------------------------------- API helpers


def test_int64_conversion_round_trips() -> None:
    for sig in [0, 1, (1 << 63) - 1, 1 << 63, M64, signature(torch.arange(3.0))]:
        v = to_int64(sig)
        assert -(1 << 63) <= v < 1 << 63
        assert torch.tensor([v], dtype=torch.int64).item() == v
        assert from_int64(v) == sig
    assert to_int64(M64) == -1
    for bad in (-1, 1 << 64):
        with pytest.raises(ValueError):
            to_int64(bad)
    for bad in (1 << 63, -(1 << 63) - 1):
        with pytest.raises(ValueError):
            from_int64(bad)


def test_signature_many_is_order_sensitive_and_marks_none() -> None:
    a, b = torch.arange(3.0), torch.arange(4.0)
    cases = [[], [a], [b], [a, b], [b, a], [a, None], [None, a], [None], [None, None], [a, a]]
    sigs = [signature_many(c) for c in cases]
    assert len(set(sigs)) == len(cases)
    assert signature_many(iter([a, None, b])) == signature_many([a.clone(), None, b.clone()])
    with pytest.raises(TypeError):
        signature_many([a, 3])  # type: ignore[list-item]  # checking the runtime guard


def test_finalize_rejects_foreign_words() -> None:
    t = torch.arange(100, dtype=torch.float32)
    words = fold(t)
    assert finalize(words, t.dtype, t.shape) == signature(t)
    with pytest.raises(ValueError):
        finalize(words.to(torch.int32), t.dtype, t.shape)
    with pytest.raises(ValueError):
        finalize(torch.zeros(513, dtype=torch.int64), t.dtype, [513 * 2])
    with pytest.raises(ValueError):
        finalize(words, t.dtype, [10])  # 40 bytes would fold to 5 words, not 50


def test_rejects_non_dense_tensors() -> None:
    with pytest.raises(ValueError):
        signature(torch.eye(3).to_sparse())
    with pytest.raises(ValueError):
        signature(torch.empty(3, device="meta"))
    with pytest.raises(TypeError):
        fold([1, 2, 3])  # type: ignore[arg-type]  # checking the runtime guard


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_fold_equals_cpu_fold() -> None:
    for n in (5, 4096 + 3, 8 * 1024 * 1024 + 11):
        t = sample(torch.uint8, n=n, seed=n % 1000)
        cuda_words = fold(t.to("cuda"))
        assert cuda_words.device.type == "cuda"
        assert torch.equal(cuda_words.cpu(), fold(t))
        assert torch.equal(sigmod._fold(t.to("cuda"), 100).cpu(), fold(t))  # many chunks
        assert signature(t.to("cuda")) == signature(t)
    x = sample(torch.bfloat16, n=3001, seed=1)
    assert signature_many([x.to("cuda"), None, x]) == signature_many([x, None, x])


def test_documented_limit_two_top_bit_flips_in_one_column_cancel() -> None:
    # The module docstring's stated limit of a linear fold, pinned so that a change of
    # the definition that removes (or widens) it is noticed and documented: bit 31 of a
    # 32-bit lane (here the sign of an fp32 value), in lanes 4 KiB apart.
    t = sample(torch.float32, n=3 * 1024, seed=41)
    both = flip_bit(flip_bit(t, 5 * 4 + 3, 7), (1024 + 5) * 4 + 3, 7)  # same column, rows 0, 1
    assert signature(both) == signature(t)
    apart = flip_bit(flip_bit(t, 5 * 4 + 3, 7), (1024 + 6) * 4 + 3, 7)  # different columns
    assert signature(apart) != signature(t)
    low = flip_bit(flip_bit(t, 5 * 4, 0), (1024 + 5) * 4, 0)  # same column, low bit
    assert signature(low) != signature(t)


def test_torch_int32_arithmetic_wraps_mod_2_32() -> None:
    # The fold relies on 32-bit multiplication and summation wrapping, as on every device.
    a = torch.tensor([(1 << 31) - 1, -(1 << 31), 123456789, -7] * 1024, dtype=torch.int32)
    r = torch.tensor([-1640531527], dtype=torch.int32)  # odd
    got = (a * r).view(-1, 4).sum(0, dtype=torch.int32).tolist()
    want = [((v * -1640531527) * 1024) & M32 for v in [(1 << 31) - 1, -(1 << 31), 123456789, -7]]
    assert [g & M32 for g in got] == want


# --------------------------------------------------------------------------- NumPy path


needs_numpy = pytest.mark.skipif(sigmod._np is None, reason="NumPy is not installed")


@needs_numpy
@pytest.mark.parametrize("nbytes", [0, 1, 3, 4, 7, 8, 9, 100, 4095, 4096])
def test_numpy_fold_of_one_row_is_the_torch_fold_and_the_reference(nbytes: int) -> None:
    t = sample(torch.uint8, n=nbytes, seed=100 + nbytes)
    data = sigmod._byte_view(t)
    np_words = sigmod._fold_row_np(data)
    assert torch.equal(np_words, sigmod._fold(t, None))
    assert torch.equal(np_words, sigmod._fold(t, 1))
    assert unsigned(np_words) == ref_fold(tensor_bytes(t))
    # An odd offset into a larger buffer (a view starting mid-lane) folds the same.
    base = sample(torch.uint8, n=nbytes + 3, seed=nbytes)
    view = base[3:]
    assert torch.equal(sigmod._fold_row_np(sigmod._byte_view(view)), sigmod._fold(view, 1))


@needs_numpy
def test_numpy_mix_sums_every_run_as_the_torch_ops_do(monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(21)
    words = torch.randint(-(1 << 63), (1 << 63) - 1, (2000,), dtype=torch.int64, generator=g)
    for counts in ([512], [1], [0], [3, 0, 512, 7], [0, 0], [512, 512, 512, 464]):
        part = words[: sum(counts)]
        np_bodies = sigmod._bodies(part, counts)
        monkeypatch.setattr(sigmod, "_np", None)
        assert np_bodies == sigmod._bodies(part, counts), counts
        monkeypatch.undo()
        at = 0
        for n, body in zip(counts, np_bodies, strict=True):
            run = unsigned(part[at : at + n])
            assert body == sum(ref_mix(w + (j + 1) * GOLDEN) for j, w in enumerate(run)) & M64
            at += n


@needs_numpy
def test_signatures_are_the_same_with_and_without_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    dtypes = [torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.uint8, torch.float64]
    tensors = [sample(d, n=n, seed=n) for d in dtypes for n in (0, 1, 5, 300, 1100, 5000)]
    groups = [tensors, tensors[:1], [None, *tensors[3:9], None], []]
    with_np = [signature(t) for t in tensors] + [signature_many(g) for g in groups]
    monkeypatch.setattr(sigmod, "_np", None)
    without = [signature(t) for t in tensors] + [signature_many(g) for g in groups]
    assert with_np == without
    assert with_np[:-4] == [ref_signature(t) for t in tensors]
