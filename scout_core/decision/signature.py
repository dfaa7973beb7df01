"""Deterministic, position-sensitive 64-bit signatures of tensors (paper §5).

Contract: equal tensors sign equal on every rank, run and device, and a single flipped bit
anywhere changes the signature. :func:`fold` reduces the bytes on the tensor's device to at
most :data:`MAX_FOLD_WORDS` 64-bit words; :func:`finalize` mixes them with dtype and shape on
the CPU. Definition, limits and speed: docs/internals.md, "Signatures: the fold".
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import Tensor

try:
    import numpy as _np
except ImportError:  # optional: the torch ops compute the same words (module doc)
    _np = None  # type: ignore[assignment]

__all__ = [
    "MAX_FOLD_WORDS",
    "fold",
    "finalize",
    "signature",
    "signature_many",
    "to_int64",
    "from_int64",
]

MAX_FOLD_WORDS = 512
"""Most 64-bit words :func:`fold` leaves on the device (one row of the layout)."""

_WORD_BYTES = 8
_LANE_BYTES = 4
_LANES = 2 * MAX_FOLD_WORDS
_ROW_BYTES = _LANES * _LANE_BYTES
_MASK32 = (1 << 32) - 1
_MASK = (1 << 64) - 1

# splitmix64 (Steele, Lea, Flood 2014): golden-ratio increment, finalizer multipliers (bijective).
_GOLDEN = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB
_SEED_ONE = 0x5C0D7E11A9B3F00D  # start of a single tensor's chain
_SEED_MANY = 0x3A7C4E9D12F6B085  # start of a sequence's chain
_TAG_TENSOR = 1
_TAG_NONE = 2

# Rows per chunk (any value gives the same lanes): one CPU thread, 512 KiB in the core's cache;
# several, 4 MiB (last-level cache), as each chunk waits on every worker; an accelerator pays
# per launch, so larger still, bounded to keep the temporary small next to training memory.
_CPU_CHUNK_ROWS = 128
_CPU_PARALLEL_CHUNK_ROWS = 1024
_DEVICE_CHUNK_ROWS = 16384


def to_int64(sig: int) -> int:
    """Two's-complement view of an unsigned signature, for storage in an int64 tensor."""
    if not 0 <= sig <= _MASK:
        raise ValueError(f"signature must satisfy 0 <= sig < 2**64, got {sig}")
    return sig - (1 << 64) if sig >= 1 << 63 else sig


def from_int64(value: int) -> int:
    """Inverse of :func:`to_int64`: the unsigned signature stored as ``value``."""
    if not -(1 << 63) <= value < 1 << 63:
        raise ValueError(f"value must fit in int64, got {value}")
    return value & _MASK


def _mix64(z: int) -> int:
    """splitmix64 finalizer on a Python int (a bijection of [0, 2**64))."""
    z &= _MASK
    z = ((z ^ (z >> 30)) * _MIX1) & _MASK
    z = ((z ^ (z >> 27)) * _MIX2) & _MASK
    return z ^ (z >> 31)


def _absorb(h: int, value: int) -> int:
    # Bijective in h and in value: two chains that differ in one absorbed value end apart.
    return _mix64((h ^ (value & _MASK)) + _GOLDEN)


# Masks that make torch's arithmetic int64 ``>>`` logical (tensors: no int converted per call).
_LSR_MASKS = {shift: torch.tensor((1 << (64 - shift)) - 1) for shift in (30, 27, 31)}


def _mix64_inplace(z: Tensor) -> Tensor:
    """:func:`_mix64` element-wise on int64 ``z``, in place (wrapping mod 2**64; module doc)."""
    for shift, mult in ((30, to_int64(_MIX1)), (27, to_int64(_MIX2)), (31, None)):
        shifted = z >> shift
        shifted &= _LSR_MASKS[shift]
        z ^= shifted
        if mult is not None:
            z *= mult
    return z


def _mix64_tensor(z: Tensor) -> Tensor:
    return _mix64_inplace(z.clone())


class _Multipliers:
    """Row multipliers ``r_i`` per device, made on the CPU (bit-identical everywhere), grown
    by doubling; they take 1/1024 of the largest tensor folded there."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_device: dict[torch.device, Tensor] = {}

    def get(self, rows: int, device: torch.device) -> Tensor:
        with self._lock:
            have = self._by_device.get(device)
            if have is None or have.shape[0] < rows:
                cap = 1024
                while cap < rows:
                    cap *= 2
                index = torch.arange(1, cap + 1, dtype=torch.int64)
                mixed = torch.bitwise_or(_mix64_tensor(index * to_int64(_GOLDEN)), 1)
                low = torch.bitwise_and(mixed, _MASK32)  # the odd low 32 bits, as int32
                mult = torch.where(low >= 1 << 31, low - (1 << 32), low).to(torch.int32)
                have = mult.reshape(cap, 1).to(device)
                self._by_device[device] = have
            return have[:rows]


_MULTIPLIERS = _Multipliers()


def _byte_view(t: Tensor) -> Tensor:
    """The tensor's bytes in C order as a 1-D uint8 tensor on its device."""
    if not isinstance(t, Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(t).__name__}")
    if t.layout != torch.strided:
        raise ValueError(f"only strided (dense) tensors have a signature, got {t.layout}")
    if t.device.type == "meta":
        raise ValueError("a meta tensor has no data to sign")
    t = t.detach()
    # Lazy conjugate/negative views carry a flag, not other bytes: sign the values shown.
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    # A view equals its contiguous copy by definition; this copies only when needed.
    return t.contiguous().reshape(-1).view(torch.uint8)


def _as_lanes(data: Tensor) -> Tensor:
    """int32 view of a 1-D uint8 tensor whose length is a multiple of 4."""
    if data.storage_offset() % _LANE_BYTES:
        data = data.clone()  # a view starting mid-lane cannot be reinterpreted in place
    return data.view(torch.int32)


def _fold_rows(lanes: Tensor, mult: Tensor, chunk_rows: int | None) -> Tensor:
    """``(lanes * mult).sum(0)`` mod 2**32 without a full-size temporary: one int32 ``mm``
    when ``chunk_rows`` is None, else a product and a sum per chunk."""
    if chunk_rows is None:
        return torch.mm(mult.reshape(1, -1), lanes).reshape(-1)
    rows = lanes.shape[0]
    if rows <= chunk_rows:
        return (lanes * mult).sum(0, dtype=torch.int32)
    n_chunks = -(-rows // chunk_rows)
    buf = torch.empty((chunk_rows, _LANES), dtype=torch.int32, device=lanes.device)
    partial = torch.empty((n_chunks, _LANES), dtype=torch.int32, device=lanes.device)
    for c in range(n_chunks):
        lo = c * chunk_rows
        hi = min(lo + chunk_rows, rows)
        out = buf[: hi - lo]
        torch.mul(lanes[lo:hi], mult[lo:hi], out=out)
        torch.sum(out, 0, dtype=torch.int32, out=partial[c])
    return partial.sum(0, dtype=torch.int32)


def _fold(t: Tensor, chunk_rows: int | None) -> Tensor:
    if chunk_rows is not None and chunk_rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    data = _byte_view(t)
    device = data.device
    nbytes = data.numel()
    width = min(MAX_FOLD_WORDS, -(-nbytes // _WORD_BYTES))
    full_rows, rest = divmod(nbytes, _ROW_BYTES)
    mult = _MULTIPLIERS.get(full_rows + (1 if rest else 0), device)
    if full_rows:
        body = _as_lanes(data[: full_rows * _ROW_BYTES]).view(full_rows, _LANES)
        acc = _fold_rows(body, mult[:full_rows], chunk_rows)
    else:
        acc = torch.zeros(_LANES, dtype=torch.int32, device=device)
    if rest:
        # The partial last row, copied into a zeroed row: padding lanes contribute nothing.
        tail = torch.zeros(_ROW_BYTES, dtype=torch.uint8, device=device)
        tail[:rest] = data[full_rows * _ROW_BYTES :]
        acc = acc + tail.view(torch.int32) * mult[full_rows]
    return acc[: 2 * width].contiguous().view(torch.int64)


@functools.cache
def _int_mm_folds() -> bool:
    """Whether this build's CPU int32 ``torch.mm`` wraps mod 2**32 exactly (probed once)."""
    gen = torch.Generator().manual_seed(0x5C07)
    lanes = torch.randint(-(1 << 31), 1 << 31, (67, _LANES), generator=gen, dtype=torch.int64)
    mult = _MULTIPLIERS.get(67, torch.device("cpu"))
    try:
        exact = _fold_rows(lanes.to(torch.int32), mult, None)
    except RuntimeError:  # no integer mm in this build
        return False
    return torch.equal(exact, _fold_rows(lanes.to(torch.int32), mult, 8))


def _chunk_rows(device: torch.device) -> int | None:
    """Rows per chunk of :func:`fold` on ``device``; None: one int32 ``mm`` (CPU, if exact)."""
    if device.type != "cpu":
        return _DEVICE_CHUNK_ROWS
    if _int_mm_folds():
        return None
    return _CPU_CHUNK_ROWS if torch.get_num_threads() == 1 else _CPU_PARALLEL_CHUNK_ROWS


def fold(t: Tensor) -> Tensor:
    """Reduce ``t``'s bytes to ``min(512, ceil(nbytes / 8))`` int64 words on ``t.device``;
    they depend only on the bytes, not on the device or the chunking."""
    if not isinstance(t, Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(t).__name__}")
    if _np is not None and t.device.type == "cpu" and t.numel() * t.element_size() <= _ROW_BYTES:
        return _fold_row_np(_byte_view(t))
    return _fold(t, _chunk_rows(t.device))


def _fold_row_np(data: Tensor) -> Tensor:
    """:func:`_fold` of at most one row of CPU bytes, on NumPy: lanes times ``r_0``."""
    nbytes = data.numel()
    width = min(MAX_FOLD_WORDS, -(-nbytes // _WORD_BYTES))
    out = _np.zeros(width * _WORD_BYTES, dtype=_np.uint8)
    out[:nbytes] = data.numpy()
    lanes = out.view(_np.uint32)
    lanes *= _row0_multiplier()
    return torch.from_numpy(out.view(_np.int64))


@functools.cache
def _row0_multiplier() -> Any:
    return _np.uint32(int(_MULTIPLIERS.get(1, torch.device("cpu"))[0]) & _MASK32)


def _dtype_code(dtype: torch.dtype) -> int:
    # FNV-1a over the dtype's name: stable across processes, unlike hash().
    h = 0xCBF29CE484222325
    for byte in str(dtype).encode():
        h = ((h ^ byte) * 0x100000001B3) & _MASK
    return h


_POSITION_KEYS = (
    torch.arange(1, MAX_FOLD_WORDS + 1, dtype=torch.int64) * to_int64(_GOLDEN)
).contiguous()


def _check_words(n: int, dtype: torch.dtype, shape: Sequence[int]) -> tuple[list[int], int]:
    """Dims and byte count, once ``n`` fold words are checked to fit ``dtype`` and ``shape``."""
    if n > MAX_FOLD_WORDS:
        raise ValueError(f"at most {MAX_FOLD_WORDS} words, got {n}")
    dims = [int(d) for d in shape]
    if any(d < 0 for d in dims):
        raise ValueError(f"shape must be non-negative, got {dims}")
    numel = 1
    for d in dims:
        numel *= d
    nbytes = numel * dtype.itemsize
    if n != min(MAX_FOLD_WORDS, -(-nbytes // _WORD_BYTES)):
        raise ValueError(f"{n} words do not belong to a {dtype} tensor of shape {dims}")
    return dims, nbytes


def _bodies(words: Tensor, counts: Sequence[int]) -> list[int]:
    """Each run of ``counts`` CPU fold words, keyed by position in its run, mixed and summed
    mod 2**64; one mix covers all runs (per-op dispatch dominates)."""
    if _np is not None:
        return _bodies_np(words, counts)
    one = len(counts) == 1
    keys = _POSITION_KEYS[: counts[0]] if one else torch.cat([_POSITION_KEYS[:n] for n in counts])
    lanes = _mix64_inplace(words + keys)
    parts = [lanes] if one else torch.split(lanes, list(counts))
    # int64 sums wrap mod 2**64 (tests/unit/test_signature.py checks this build's kernels).
    return [int(part.sum()) & _MASK for part in parts]


def _bodies_np(words: Tensor, counts: Sequence[int]) -> list[int]:
    """:func:`_bodies` on a NumPy view of the words (module doc); the same integers."""
    w = words.contiguous().numpy().view(_np.uint64)
    keys = _position_keys_np()
    if len(counts) == 1:
        z = w + keys[: counts[0]]
    else:
        z = w + _np.concatenate([keys[:n] for n in counts])
    z ^= z >> _np.uint64(30)
    z *= _np.uint64(_MIX1)
    z ^= z >> _np.uint64(27)
    z *= _np.uint64(_MIX2)
    z ^= z >> _np.uint64(31)
    if len(counts) == 1:
        return [int(z.sum(dtype=_np.uint64))]
    # Run sums as differences of a wrapping prefix sum (an empty run sums to 0).
    sizes = _np.asarray(counts, dtype=_np.int64)
    ends = _np.cumsum(sizes)
    prefix = _np.zeros(len(z) + 1, dtype=_np.uint64)
    _np.cumsum(z, dtype=_np.uint64, out=prefix[1:])
    return [int(v) for v in prefix[ends] - prefix[ends - sizes]]


@functools.cache
def _position_keys_np() -> Any:
    return _POSITION_KEYS.numpy().view(_np.uint64)


def _close(dtype: torch.dtype, dims: Sequence[int], nbytes: int, n: int, body: int) -> int:
    return _absorb(_header(dtype, tuple(dims), nbytes, n), body)


@functools.lru_cache(maxsize=4096)
def _header(dtype: torch.dtype, dims: tuple[int, ...], nbytes: int, n: int) -> int:
    """The chain's state after the header (cached: replay signs the same shapes each round)."""
    h = _SEED_ONE
    for value in (_dtype_code(dtype), len(dims), *dims, nbytes, n):
        h = _absorb(h, value)
    return h


def finalize(words: Tensor, dtype: torch.dtype, shape: Sequence[int]) -> int:
    """Mix fold ``words`` with ``dtype`` and ``shape`` into an unsigned 64-bit signature, on the
    CPU. Words are keyed by position and bijectively mixed: any single-word change changes the
    result, a swap does but for a 2**-64 coincidence."""
    if words.dtype != torch.int64 or words.dim() != 1:
        raise ValueError(
            f"words must be a 1-D int64 tensor, got {words.dtype} {tuple(words.shape)}"
        )
    n = words.shape[0]
    dims, nbytes = _check_words(n, dtype, shape)
    (body,) = _bodies(words.detach().to("cpu"), [n])
    return _close(dtype, dims, nbytes, n, body)


def signature(t: Tensor) -> int:
    """The unsigned 64-bit signature of ``t`` (0 <= s < 2**64): dtype, shape and bytes."""
    return finalize(fold(t), t.dtype, t.shape)


def signature_many(tensors: Iterable[Tensor | None]) -> int:
    """Order-sensitive signature of a sequence of tensors (a flattened pytree). ``None`` is a
    distinct marker: ``[a, None]``, ``[None, a]`` and ``[a]`` differ. The words leave each
    device in one copy (one sync per device) and are mixed in one CPU pass."""
    items = list(tensors)
    folded: dict[int, Tensor] = {}
    by_device: dict[torch.device, list[int]] = {}
    for index, item in enumerate(items):
        if item is None:
            continue
        if not isinstance(item, Tensor):
            raise TypeError(f"expected Tensor or None, got {type(item).__name__}")
        folded[index] = fold(item)
        by_device.setdefault(folded[index].device, []).append(index)
    on_cpu: list[Tensor] = []
    order: list[int] = []
    for indices in by_device.values():
        joined = torch.cat([folded[i] for i in indices]) if len(indices) > 1 else folded[indices[0]]
        on_cpu.append(joined.to("cpu"))
        order.extend(indices)
    bodies: dict[int, int] = {}
    if order:
        words = on_cpu[0] if len(on_cpu) == 1 else torch.cat(on_cpu)
        counts = [folded[i].shape[0] for i in order]
        bodies = dict(zip(order, _bodies(words, counts), strict=True))
    h = _SEED_MANY
    for index, item in enumerate(items):
        if item is None:
            h = _absorb(h, _TAG_NONE)
        else:
            n = folded[index].shape[0]
            dims, nbytes = _check_words(n, item.dtype, item.shape)
            h = _absorb(h, _TAG_TENSOR)
            h = _absorb(h, _close(item.dtype, dims, nbytes, n, bodies[index]))
    return _absorb(h, len(items))
