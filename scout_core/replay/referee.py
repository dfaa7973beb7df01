"""Referee replay: a third rank decides which of two disagreeing copies computed wrong.

C3 needs a strict majority; a peer group of two that disagrees has none, so the round
reads as a group-scope SDC with no culprit. Where the pair's inputs agree (the
``received`` surface: the broadcast input, the output gradients and the RNG states) and
its parameters agree (``params``, and ``shard`` where there is one) but a computed
surface differs (``forward``, ``input_grad`` or ``param_grad``), one copy computed
wrong on equal state. A third rank that recomputes the same replay from the same state
says which:

* **Trigger** (:func:`wants_referee`): the pair's own round, read identically by both
  members. The flag rides the round's *timing-pool* all-gather (:mod:`.pools`), which
  every member of the pool runs anyway, so a healthy round adds no collective and no
  byte beyond one word of that all-gather's fixed-size row.
* **Choice** (:func:`choose_referee`): a pure function of the layout and of what that
  all-gather told every pool member (each member's work key and flag), so every rank
  agrees on it without talking: the first member, walking the pool's other peer groups
  from the next one on and each group from the source's position on, that replayed the
  same work (equal work key: same module class, parameter and input shapes, device
  kind) and whose own group did not ask for a referee.
* **Shipping**: the pair's source (the rank that broadcast the replay inputs) sends the
  referee a fixed-size header of int64 words and one byte payload: the gathered
  parameters of the layer (under TP the whole layer, as replay runs it; see
  ``docs/replay.md``), the replay inputs, the output gradients and the RNG states, and
  the parameter and RNG names as JSON text. No pickle. It travels point to point on
  SCOUT's own Gloo group of the pool (never ``WORLD``, never a training group), made
  with the ``referee_timeout_s`` timeout.
* **Validation** (:func:`read_header`, :func:`check_payload`): the referee checks the
  header against its own readiness metadata of the same round (the readiness digest,
  which covers the step, the call's structure, dtypes and shapes, the parameters and
  the variants) and every tensor's dtype, shape and byte count; anything else is
  refused with a reason, never replayed.
* **Recompute**: the referee replays its own copy of the module class (its own
  capture of the round gives the call's structure) on the shipped state, with the
  pair's thread count, and sends its three signatures back to both pair members.
* **Decision** (:func:`decide`): the copy whose signatures the referee matches on every
  computed surface is healthy and the other is named (``sdc``, rank scope); a referee
  that matches neither, is missing, refuses, dies or times out leaves the pair a
  group-scope verdict with the reason, never a culprit and never a hang.

After a referee exchange fails on a rank (a timeout, a closed connection), that rank
never uses the referee group again: a late message on it could otherwise be read as
another round's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from enum import IntEnum
from typing import Any, Protocol

import torch
import torch.distributed as dist

from scout_core.decision.c3 import C3Result
from scout_core.replay import taps
from scout_core.vocabulary import Status

__all__ = [
    "COMPUTED",
    "HEADER_WORDS",
    "NO_CANDIDATE",
    "NO_THIRD",
    "Expected",
    "Finding",
    "Plan",
    "RefereeDesk",
    "RefereeLink",
    "Refusal",
    "Shipment",
    "apply_finding",
    "check_payload",
    "choose_referee",
    "decide",
    "make_header",
    "read_header",
    "read_result",
    "result_words",
    "wants_referee",
]

log = logging.getLogger(__name__)

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


def _refusal_text(code: int) -> str:
    try:
        return _REFUSAL_TEXT[Refusal(code)]
    except (ValueError, KeyError):
        return f"code {code}"


def _signed(v: int) -> int:
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >= 1 << 63 else v


def _unsigned(v: int) -> int:
    return v & ((1 << 64) - 1)


# -- the trigger ------------------------------------------------------------------------


def wants_referee(name: str, results: Mapping[str, C3Result], ready: bool) -> tuple[str, ...]:
    """The computed surfaces on which a pair disagrees with equal inputs and parameters.

    Empty unless the round of recipe ``name`` was ready, its group has two members, the
    ``received``, ``params`` (and ``shard``) surfaces agree, no peer lacks evidence
    (``gap`` agrees on 0) and at least one of :data:`COMPUTED` holds two different
    values. The same on both members: they read the same C3 results."""
    if not ready:
        return ()
    for leaf in ("received", "params", "shard"):
        result = results.get(f"{name}/{leaf}")
        if result is not None and result.status is not Status.AGREE:
            return ()
    gap = results.get(f"{name}/gap")
    if gap is None or gap.status is not Status.AGREE or any(gap.evidence):
        return ()
    differing: list[str] = []
    for leaf in COMPUTED:
        result = results.get(f"{name}/{leaf}")
        if result is None or len(result.ranks) != 2:
            continue
        if any(e is None for e in result.evidence):
            return ()
        if result.evidence[0] != result.evidence[1]:
            differing.append(leaf)
    return tuple(differing)


# -- the choice -------------------------------------------------------------------------


def choose_referee(
    groups: Sequence[Sequence[int]],
    pair: Sequence[int],
    source: int,
    keys: Mapping[int, int | None],
    asking: Mapping[int, bool],
) -> int | None:
    """The referee of ``pair`` (module doc), or None when no rank qualifies.

    ``groups``: the peer groups of the pool, sorted by their lowest rank; ``source``:
    the pair's source in this round; ``keys``: each pool member's work key (None: it
    replayed nothing); ``asking``: each member's referee flag. A candidate must hold
    the pair's work key and sit in a group none of whose members asked."""
    pair = tuple(pair)
    ordered = [tuple(g) for g in groups]
    if pair not in ordered or source not in pair:
        return None
    want = {keys.get(r) for r in pair}
    if len(want) != 1 or None in want:
        return None
    key = want.pop()
    at, pos = ordered.index(pair), pair.index(source)
    for k in range(1, len(ordered)):
        group = ordered[(at + k) % len(ordered)]
        if any(asking.get(r, False) for r in group):
            continue
        for j in range(len(group)):
            candidate = group[(pos + j) % len(group)]
            if keys.get(candidate) == key:
                return candidate
    return None


# -- the wire ---------------------------------------------------------------------------


@dataclass
class Shipment:
    """What the source sends: the parameters by name, the call's tensor leaves, the
    output gradients, the RNG states by name, with the round's step, readiness digest
    and thread count."""

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
    """The header words of ``ship`` and the payload's byte count (0 with a refusal).

    A shipment that does not fit the header (too many tensors, too many dimensions, a
    dtype without a wire code) is sent as a refusal."""
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
    """The referee's own materialised parameters of the layer: dtype and full shape by
    name."""
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
        return f"the source refused: {_refusal_text(words[11])}"
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
        return f"the referee refused: {_refusal_text(words[1])}"
    return {
        leaf: _unsigned(words[2 + i]) if words[5] >> i & 1 else None
        for i, leaf in enumerate(COMPUTED)
    }


# -- the decision -----------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    """What a pair's referee phase concluded, the same on both members."""

    pair: tuple[int, ...]
    surfaces: tuple[str, ...]
    """The computed surfaces (leaf names) on which the pair differs."""
    referee: int | None
    culprit: int | None
    reason: str
    signatures: Mapping[int, Mapping[str, int | None]] = field(default_factory=dict)
    """Each of the three ranks' signature per computed surface (the referee's where it
    answered)."""

    @property
    def healthy(self) -> int | None:
        if self.culprit is None:
            return None
        return next(r for r in self.pair if r != self.culprit)


def decide(
    pair: Sequence[int],
    surfaces: Sequence[str],
    pair_values: Mapping[str, Sequence[int | None]],
    referee: int | None,
    answer: Mapping[str, int | None] | str,
) -> Finding:
    """The pair's verdict from the referee's ``answer`` (its signatures, or why it has
    none). The copy the referee matches on *every* computed surface the pair compared is
    healthy and the other copy is named; matching neither (or both) names no one."""
    pair = tuple(pair)
    sigs: dict[int, dict[str, int | None]] = {r: {} for r in pair}
    for leaf, values in pair_values.items():
        for r, v in zip(pair, values, strict=True):
            sigs[r][leaf] = v
    if referee is None or isinstance(answer, str):
        reason = answer if isinstance(answer, str) else "no referee"
        return Finding(pair, tuple(surfaces), referee, None, reason, sigs)
    sigs[referee] = {leaf: answer.get(leaf) for leaf in pair_values}
    matches = [r for r in pair if all(answer.get(leaf) == sigs[r][leaf] for leaf in pair_values)]
    if len(matches) == 1:
        healthy = matches[0]
        culprit = next(r for r in pair if r != healthy)
        reason = f"referee rank {referee} recomputed rank {healthy}'s result"
        return Finding(pair, tuple(surfaces), referee, culprit, reason, sigs)
    reason = f"referee rank {referee} matches neither copy"
    return Finding(pair, tuple(surfaces), referee, None, reason, sigs)


# -- the exchange -----------------------------------------------------------------------


@dataclass
class RefereeLink:
    """SCOUT's referee group of one pool: point-to-point, with a bounded wait."""

    pg: dist.ProcessGroup
    timeout_s: float
    broken: str | None = None
    """Why this rank stopped using the group (a failed exchange), or None."""
    _held: list[torch.Tensor] = field(default_factory=list)

    def _wait(self, work: Any, what: str) -> None:
        ok = work.wait(timeout=timedelta(seconds=self.timeout_s))
        if ok is False:
            raise RuntimeError(f"{what} did not complete")

    def send(self, t: torch.Tensor, dst: int, what: str) -> None:
        self._held.append(t)  # a send that failed must not free what Gloo may still read
        self._wait(dist.isend(t, dst=dst, group=self.pg), what)
        self._held.remove(t)

    def recv(self, t: torch.Tensor, src: int, what: str) -> None:
        self._held.append(t)
        self._wait(dist.irecv(t, src=src, group=self.pg), what)
        self._held.remove(t)

    def fail(self, exc: BaseException) -> str:
        """Stop using the group on this rank; the reason text for the verdict."""
        self.broken = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
        log.warning("referee exchange failed on this rank; referee replay is off: %s", exc)
        return self.broken


class Recomputer(Protocol):
    """The layer runner's part in a referee phase (:class:`~.runner.LayerRunner`)."""

    def shipment(self, step: int) -> Shipment | None: ...

    def expected(self, step: int) -> Expected | None: ...

    def recompute(
        self,
        params: dict[str, torch.Tensor],
        inputs: Sequence[torch.Tensor],
        grads: Sequence[torch.Tensor],
        rng: dict[str, torch.Tensor],
        threads: int,
    ) -> dict[str, Any] | Refusal: ...


NO_THIRD = "no referee: no rank outside the pair replays this work"
"""The reason a pair gets where its peer group is its whole timing pool (DDP x 2)."""
NO_CANDIDATE = (
    "no referee: no rank outside the pair replayed the same work with its own group agreeing"
)


class RefereeDesk:
    """One rank's part in the referee phase of a layer round (module doc).

    ``peer_groups``: every peer group of the layout (ascending); ``links``: the referee
    group of each pooled recipe kind on this rank."""

    def __init__(
        self,
        rank: int,
        peer_groups: Sequence[Sequence[int]],
        links: Mapping[str, RefereeLink],
    ) -> None:
        self.rank = rank
        self.peer_groups = [tuple(g) for g in peer_groups]
        self.links = dict(links)

    def settle(self, outcome: Any, asks: Sequence[str], runner: Recomputer) -> Finding | None:
        """The referee phase of one round; this rank's pair's :class:`Finding` when its
        pair asked, else None. Runs only where some member of the round's pool asked, so
        a healthy round does nothing here. Collective over the pool's asking pairs and
        their referees, point to point; never over a healthy pair."""
        kind, name, step = outcome.recipe.kind, outcome.recipe.name, outcome.step
        pool = outcome.pool
        if pool is None:
            return self._alone(name, outcome, asks)
        if not any(pool.asking):
            return None
        asking = dict(zip(pool.ranks, pool.asking, strict=True))
        keys = dict(zip(pool.ranks, pool.keys, strict=True))
        members = set(pool.ranks)
        groups = [g for g in self.peer_groups if set(g) <= members]
        link = self.links.get(kind)
        mine: Finding | None = None
        for pair in groups:
            if len(pair) != 2 or not all(asking[r] for r in pair):
                continue
            source = pair[step % len(pair)]
            referee = choose_referee(groups, pair, source, keys, asking)
            involved = self.rank in pair or self.rank == referee
            if not involved:
                continue
            answer: Mapping[str, int | None] | str
            if referee is None:
                answer = NO_CANDIDATE
            elif link is None:
                answer = "no referee group"
            elif link.broken is not None:
                answer = f"the referee group failed earlier on this rank ({link.broken})"
            else:
                answer = self._exchange(
                    link, runner, step=step, pair=pair, source=source, referee=referee
                )
            if self.rank in pair:
                values = {
                    leaf: _pair_values(outcome.results.get(f"{name}/{leaf}"))
                    for leaf in COMPUTED
                    if f"{name}/{leaf}" in outcome.results
                }
                mine = decide(pair, asks, values, referee, answer)
        return mine

    def _alone(self, name: str, outcome: Any, asks: Sequence[str]) -> Finding | None:
        if not asks:
            return None
        values = {
            leaf: _pair_values(outcome.results.get(f"{name}/{leaf}"))
            for leaf in COMPUTED
            if f"{name}/{leaf}" in outcome.results
        }
        return decide(outcome.group, asks, values, None, NO_THIRD)

    def _exchange(
        self,
        link: RefereeLink,
        runner: Recomputer,
        *,
        step: int,
        pair: tuple[int, ...],
        source: int,
        referee: int,
    ) -> Mapping[str, int | None] | str:
        """This rank's roles for one pair (source, referee, member, in that order); the
        referee's decoded answer on a pair member, else an empty mapping."""
        try:
            if self.rank == source:
                self._ship(link, step, referee, runner)
            if self.rank == referee:
                self._referee(link, step, pair, source, runner)
            if self.rank in pair:
                got = torch.zeros(RESULT_WORDS, dtype=torch.int64)
                link.recv(got, referee, "the referee's answer")
                return read_result(got.tolist())
        except Exception as exc:  # a dead or late referee: a reason, never a hang
            return f"referee rank {referee} did not answer: {link.fail(exc)}"
        return {}

    def _ship(self, link: RefereeLink, step: int, referee: int, runner: Recomputer) -> None:
        ship = runner.shipment(step)
        words, nbytes = make_header(ship)
        link.send(torch.tensor(words, dtype=torch.int64), referee, "the referee header")
        if nbytes and ship is not None:
            tensors = [t.detach().to("cpu").contiguous() for t in ship.tensors()]
            blob = torch.frombuffer(bytearray(ship.names()), dtype=torch.uint8)
            parts = [t.reshape(-1).view(torch.uint8) for t in tensors] + [blob]
            link.send(torch.cat(parts), referee, "the referee payload")

    def _referee(
        self,
        link: RefereeLink,
        step: int,
        pair: tuple[int, ...],
        source: int,
        runner: Recomputer,
    ) -> None:
        # A test's slow or dead referee (the "referee" kind of :mod:`.taps`) acts here.
        taps.sleep_injected("referee")
        head = torch.zeros(HEADER_WORDS, dtype=torch.int64)
        link.recv(head, source, "the referee header")
        words = head.tolist()
        expected = runner.expected(step)
        values: dict[str, Any] | None = None
        refusal = Refusal.NONE
        if expected is None:
            refusal = Refusal.NO_CAPTURE
            plan: Plan | str = _REFUSAL_TEXT[refusal]
        else:
            plan = read_header(words, expected, max_bytes=_cap(expected))
        # Keep the channel in step: a payload announced within the cap is received even
        # when its header is refused (the source sends it whatever the answer).
        announced = words[10] if _unsigned(words[0]) == MAGIC and not words[11] else 0
        buf = None
        if 0 < announced <= (DRAIN_CAP if expected is None else _cap(expected)):
            buf = torch.empty(announced, dtype=torch.uint8)
            link.recv(buf, source, "the referee payload")
        if isinstance(plan, str):
            log.warning("referee for ranks %s refuses: %s", list(pair), plan)
            refusal = refusal or (Refusal.NOT_SHIPPED if words[11] else Refusal.METADATA)
        elif buf is None or expected is None:
            refusal = Refusal.PAYLOAD
        else:
            parts = check_payload(buf, plan, expected)
            if isinstance(parts, str):
                log.warning("referee for ranks %s refuses the payload: %s", list(pair), parts)
                refusal = Refusal.PAYLOAD
            else:
                done = runner.recompute(*parts, threads=plan.threads)
                if isinstance(done, Refusal):
                    refusal = done
                else:
                    values = done
        answer = torch.tensor(result_words(values, refusal), dtype=torch.int64)
        for member in pair:
            link.send(answer, member, "the referee's answer")


DRAIN_CAP = 1 << 30
"""The largest payload a referee with no round of its own receives (and drops), so that
the source's send completes and the channel stays in step."""


def _cap(expected: Expected) -> int:
    """The largest payload a referee accepts: twice what its own round holds, plus 1 MiB
    (unregistered TP attributes and the name block)."""
    held = [*expected.params.values(), *expected.inputs, *expected.grads, *expected.rng.values()]
    return 2 * sum(_numel(s) * _itemsize(d) for d, s in held) + (1 << 20)


def _pair_values(result: C3Result | None) -> tuple[int | None, ...]:
    if result is None:
        return ()
    return tuple(e if isinstance(e, int) else None for e in result.evidence)


def apply_finding(outcome: Any, finding: Finding) -> None:
    """Put ``finding`` on the round: where it names a copy, each differing surface reads
    attributed to it, so the checkpoint gate sees a localized SDC (as after a majority);
    the verdict maker writes the referee's records (:mod:`.verdicts`)."""
    outcome.referee = finding
    if finding.culprit is None:
        return
    name = outcome.recipe.name
    for leaf in finding.surfaces:
        key = f"{name}/{leaf}"
        result = outcome.results.get(key)
        if result is None:
            continue
        bitmap = tuple(r == finding.culprit for r in result.ranks)
        outcome.results[key] = dataclasses.replace(result, status=Status.ATTRIBUTED, bitmap=bitmap)
