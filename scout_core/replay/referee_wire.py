"""The referee's wire format: a fixed-size header, one byte payload, a fixed-size answer.

Contract: the source ships a :class:`Shipment` as :func:`make_header` words plus one uint8 payload
(the tensors' bytes, then the parameter and RNG names as JSON text; no pickle); the referee
validates both against its own round (:func:`read_header`, :func:`check_payload`) and refuses
anything else with a reason; its answer is :func:`result_words`, decoded by :func:`read_result`.
Sizes and fields: docs/replay.md, "Referee replay".
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import torch

__all__ = [
    "COMPUTED",
    "DRAIN_CAP",
    "HEADER_WORDS",
    "RESULT_WORDS",
    "Expected",
    "Plan",
    "Refusal",
    "Shipment",
    "announced_bytes",
    "check_payload",
    "make_header",
    "payload_cap",
    "read_header",
    "read_result",
    "refusal_text",
    "result_words",
]

COMPUTED = ("forward", "input_grad", "param_grad")
"""The computed surfaces a referee recomputes (the leaves of a layer round's names)."""

MAGIC = 0x5C0F_7E1F_EE00_0001
VERSION = 1
HEADER_WORDS = 1024
"""Words of the fixed-size header (8 KiB): 16 fixed words, then 8 per tensor."""
_FIXED = 16
_PER_TENSOR = 8
MAX_DIMS = _PER_TENSOR - 2
MAX_TENSORS = (HEADER_WORDS - _FIXED) // _PER_TENSOR
RESULT_WORDS = 8

_DTYPES: tuple[torch.dtype, ...] = (
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float64,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
)
"""Dtype codes on the wire: the position in this tuple plus one (0 is no dtype)."""


class Refusal(IntEnum):
    """Why a referee gave no signatures (0: it computed them)."""

    NONE = 0
    NO_CAPTURE = 1
    METADATA = 2
    PAYLOAD = 3
    RAISED = 4
    NOT_REPLAYABLE = 5
    NOT_SHIPPED = 6


_REFUSAL_TEXT = {
    Refusal.NO_CAPTURE: "the referee has no capture of this round",
    Refusal.METADATA: "the shipped header does not match the referee's readiness metadata",
    Refusal.PAYLOAD: "the shipped payload does not match its header",
    Refusal.RAISED: "the referee's recomputation raised",
    Refusal.NOT_REPLAYABLE: "the layer cannot be replayed on the referee",
    Refusal.NOT_SHIPPED: "the source could not ship its state",
}


def refusal_text(code: int) -> str:
    """The words for refusal ``code`` (a code no version knows is shown as a number)."""
    try:
        return _REFUSAL_TEXT[Refusal(code)]
    except (ValueError, KeyError):
        return f"code {code}"


def _signed(v: int) -> int:
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >= 1 << 63 else v


def _unsigned(v: int) -> int:
    return v & ((1 << 64) - 1)


@dataclass
class Shipment:
    """What the source sends: the parameters and RNG states by name, the call's tensor
    leaves and output gradients, with the round's step, referee digest and thread count."""

    step: int
    digest: int
    threads: int
    params: dict[str, torch.Tensor]
    inputs: list[torch.Tensor]
    grads: list[torch.Tensor]
    rng: dict[str, torch.Tensor]

    def tensors(self) -> list[torch.Tensor]:
        return [
            *(self.params[k] for k in sorted(self.params)),
            *self.inputs,
            *self.grads,
            *(self.rng[k] for k in sorted(self.rng)),
        ]

    def names(self) -> bytes:
        return json.dumps(
            {"params": sorted(self.params), "rng": sorted(self.rng)}, separators=(",", ":")
        ).encode()


def _names_digest(blob: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(blob, digest_size=8).digest(), "little", signed=True)


def make_header(ship: Shipment | None, status: Refusal = Refusal.NONE) -> tuple[list[int], int]:
    """The header words of ``ship`` and the payload's byte count (0 with a refusal); a shipment
    that does not fit (too many tensors or dimensions, a dtype without a wire code) is refused."""
    words = [0] * HEADER_WORDS
    words[0], words[1] = _signed(MAGIC), VERSION
    if ship is None or status is not Refusal.NONE:
        words[11] = int(status or Refusal.NOT_SHIPPED)
        return words, 0
    tensors = ship.tensors()
    blob = ship.names()
    if len(tensors) > MAX_TENSORS or any(
        t.dim() > MAX_DIMS or t.dtype not in _DTYPES for t in tensors
    ):
        return make_header(None, Refusal.NOT_SHIPPED)
    nbytes = sum(t.numel() * t.element_size() for t in tensors) + len(blob)
    words[2], words[3], words[4] = ship.step, _signed(ship.digest), ship.threads
    words[5:9] = [len(ship.params), len(ship.inputs), len(ship.grads), len(ship.rng)]
    words[9], words[10], words[12] = len(blob), nbytes, _names_digest(blob)
    for i, t in enumerate(tensors):
        at = _FIXED + _PER_TENSOR * i
        words[at], words[at + 1] = _DTYPES.index(t.dtype) + 1, t.dim()
        words[at + 2 : at + 2 + t.dim()] = list(t.shape)
    return words, nbytes


@dataclass(frozen=True)
class Expected:
    """What the referee's own round says the shipment must be."""

    step: int
    digest: int
    params: Mapping[str, tuple[torch.dtype, tuple[int, ...]]]
    """The referee's own materialised parameters of the layer: dtype and full shape by name."""
    inputs: Sequence[tuple[torch.dtype, tuple[int, ...]]]
    grads: Sequence[tuple[torch.dtype, tuple[int, ...]]]
    rng: Mapping[str, tuple[torch.dtype, tuple[int, ...]]]


@dataclass(frozen=True)
class Plan:
    """A validated header: the payload's byte count, each tensor's dtype and shape."""

    threads: int
    nbytes: int
    names_bytes: int
    names_digest: int
    counts: tuple[int, int, int, int]
    specs: tuple[tuple[torch.dtype, tuple[int, ...]], ...]


def read_header(words: Sequence[int], expected: Expected, *, max_bytes: int) -> Plan | str:
    """Validate header ``words`` against the referee's own round; a :class:`Plan`, or
    the reason it is refused (a refusal the source sent, or any mismatch)."""
    if len(words) != HEADER_WORDS or _unsigned(words[0]) != MAGIC or words[1] != VERSION:
        return "not a referee header"
    if words[11]:
        return f"the source refused: {refusal_text(words[11])}"
    if words[2] != expected.step or _unsigned(words[3]) != _unsigned(expected.digest):
        return _REFUSAL_TEXT[Refusal.METADATA]
    counts = (words[5], words[6], words[7], words[8])
    n = sum(counts)
    if min(counts) < 0 or n > MAX_TENSORS:
        return "the header lists an impossible number of tensors"
    if (counts[1], counts[2], counts[3]) != (
        len(expected.inputs),
        len(expected.grads),
        len(expected.rng),
    ) or counts[0] != len(expected.params):
        return "the header's tensor counts differ from the referee's round"
    specs: list[tuple[torch.dtype, tuple[int, ...]]] = []
    total = 0
    for i in range(n):
        at = _FIXED + _PER_TENSOR * i
        dcode, ndim = words[at], words[at + 1]
        if not 1 <= dcode <= len(_DTYPES) or not 0 <= ndim <= MAX_DIMS:
            return f"tensor {i}: bad dtype code or rank"
        shape = tuple(words[at + 2 : at + 2 + ndim])
        if any(d < 0 for d in shape):
            return f"tensor {i}: negative dimension"
        dtype = _DTYPES[dcode - 1]
        specs.append((dtype, shape))
        total += _numel(shape) * _itemsize(dtype)
    names_bytes = words[9]
    if names_bytes < 0 or names_bytes > 1 << 20:
        return "the header's name block is out of range"
    if words[10] != total + names_bytes:
        return "the header's byte count differs from its tensors"
    if words[10] > max_bytes:
        return f"the payload ({words[10]} bytes) exceeds the cap ({max_bytes} bytes)"
    np_ = counts[0]
    tail = specs[np_:]
    want = [*expected.inputs, *expected.grads]
    if [(d, tuple(s)) for d, s in tail[: len(want)]] != [(d, tuple(s)) for d, s in want]:
        return "the shipped inputs or gradients differ in dtype or shape from the referee's round"
    return Plan(words[4], words[10], names_bytes, words[12], counts, tuple(specs))


def check_payload(
    buf: torch.Tensor, plan: Plan, expected: Expected
) -> (
    tuple[dict[str, torch.Tensor], list[torch.Tensor], list[torch.Tensor], dict[str, torch.Tensor]]
    | str
):
    """Split a received payload by ``plan``: parameters and RNG states by name, inputs,
    gradients; or the reason it is refused (size, names, dtype or shape)."""
    if buf.dtype != torch.uint8 or buf.numel() != plan.nbytes:
        return "the payload's size differs from its header"
    blob = bytes(buf[plan.nbytes - plan.names_bytes :].tolist()) if plan.names_bytes else b""
    if _names_digest(blob) != plan.names_digest:
        return "the payload's name block does not match its header"
    try:
        names = json.loads(blob.decode())
    except (UnicodeDecodeError, ValueError):
        return "the payload's name block is not JSON"
    pnames, rnames = (names.get("params"), names.get("rng")) if isinstance(names, dict) else (0, 0)
    if not (
        isinstance(pnames, list)
        and isinstance(rnames, list)
        and all(isinstance(x, str) for x in [*pnames, *rnames])
    ):
        return "the payload's names are malformed"
    np_, ni, ng, nr = plan.counts
    if len(pnames) != np_ or len(rnames) != nr or pnames != sorted(set(pnames)):
        return "the payload's names do not match its header"
    if sorted(rnames) != sorted(expected.rng):
        return "the shipped RNG streams differ from the referee's round"
    if set(expected.params) != set(pnames):
        return "the shipped parameters differ by name from the referee's own"
    tensors: list[torch.Tensor] = []
    at = 0
    for dtype, shape in plan.specs:
        n = _numel(shape) * _itemsize(dtype)
        tensors.append(buf[at : at + n].clone().view(dtype).reshape(shape))
        at += n
    params = dict(zip(pnames, tensors[:np_], strict=True))
    for name, (dtype, shape) in expected.params.items():
        t = params[name]
        if t.dtype != dtype or tuple(t.shape) != tuple(shape):
            return f"shipped parameter {name} differs in dtype or shape"
    rng = dict(zip(rnames, tensors[np_ + ni + ng :], strict=True))
    for name, (dtype, shape) in expected.rng.items():
        if rng[name].dtype != dtype or tuple(rng[name].shape) != tuple(shape):
            return f"shipped RNG state {name} differs in dtype or shape"
    return params, tensors[np_ : np_ + ni], tensors[np_ + ni : np_ + ni + ng], rng


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def result_words(values: Mapping[str, Any] | None, refusal: Refusal) -> list[int]:
    """The referee's answer: magic, refusal code, the three signatures, presence bits."""
    words = [_signed(MAGIC), int(refusal), 0, 0, 0, 0, 0, 0]
    if values is None or refusal is not Refusal.NONE:
        return words
    present = 0
    for i, leaf in enumerate(COMPUTED):
        v = values.get(leaf)
        if isinstance(v, int):
            words[2 + i] = _signed(v)
            present |= 1 << i
    words[5] = present
    return words


def read_result(words: Sequence[int]) -> dict[str, int | None] | str:
    """Decode :func:`result_words`: the referee's signature per computed surface (None
    where it had none), or why it gave none."""
    if len(words) != RESULT_WORDS or _unsigned(words[0]) != MAGIC:
        return "the referee's answer is malformed"
    if words[1]:
        return f"the referee refused: {refusal_text(words[1])}"
    return {
        leaf: _unsigned(words[2 + i]) if words[5] >> i & 1 else None
        for i, leaf in enumerate(COMPUTED)
    }


def announced_bytes(words: Sequence[int]) -> int:
    """The payload size a header announces (0: a refusal or not a header), which the referee
    receives even when it refuses the header, to keep the channel in step."""
    if len(words) != HEADER_WORDS or _unsigned(words[0]) != MAGIC or words[11]:
        return 0
    return int(words[10])


DRAIN_CAP = 1 << 30
"""The largest payload a referee with no round of its own receives (and drops), so that
the source's send completes and the channel stays in step."""


def payload_cap(expected: Expected) -> int:
    """The largest payload a referee accepts: twice what its own round holds, plus 1 MiB
    (unregistered TP attributes and the name block)."""
    held = [*expected.params.values(), *expected.inputs, *expected.grads, *expected.rng.values()]
    return 2 * sum(_numel(s) * _itemsize(d) for d, s in held) + (1 << 20)
