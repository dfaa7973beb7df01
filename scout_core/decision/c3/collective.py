"""The C3 collective: one AllGather of fixed-size evidence, then the rule on every peer.

Contract: each peer packs its surfaces into one int64 row of :data:`ROW_WORDS` words, one
AllGather runs on a diagnostic group, and every peer applies :mod:`.rule` to the same table, so
all return the same :class:`C3Result` per surface. A layout, kappa or peer-order mismatch raises
:class:`~scout_core.errors.ProtocolError` everywhere. docs/internals.md, "The C3 wire format".
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import operator
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import torch
import torch.distributed as dist

from scout_core.decision.agreement import all_gather_single
from scout_core.decision.c3.rule import Decision, decide_exact, decide_statistical
from scout_core.errors import ProtocolError
from scout_core.vocabulary import Mode, Status

__all__ = ["DEFAULT_KAPPA", "ROW_WORDS", "C3Result", "Evidence", "Surface", "exchange"]

DEFAULT_KAPPA = 5.0
"""Sensitivity multiplier of statistical C3, in unscaled MADs (see :mod:`.rule`)."""

ROW_WORDS = 128
"""Words in every peer's wire row (1 KiB): header, presence flags and values must fit."""

Evidence: TypeAlias = int | float | tuple[int, ...] | None
"""One peer's decoded value for one surface; ``None`` where the peer had none."""

_MASK64 = (1 << 64) - 1
_SIGN64 = 1 << 63
_LAYOUT_VERSION = "scout.c3/1"
_F64 = struct.Struct("<d")
_I64 = struct.Struct("<q")


def _word(value: Any, what: str) -> int:
    """One exact value as a signed int64 word (two's complement for ``[2**63, 2**64)``)."""
    try:
        v = operator.index(value)
    except TypeError:
        raise ValueError(f"{what} must be an int, got {type(value).__name__}") from None
    if isinstance(value, bool):
        raise ValueError(f"{what} must be an int, got bool")
    if not -_SIGN64 <= v <= _MASK64:
        raise ValueError(f"{what} = {v} does not fit 64 bits (valid: -2**63 .. 2**64-1)")
    return v - (1 << 64) if v >= _SIGN64 else v


@dataclass(frozen=True)
class Surface:
    """One thing compared across the peers in an :func:`exchange`: ``value`` is an int or ``width``
    ints (:attr:`Mode.EXACT`), a float in seconds (:attr:`Mode.STATISTICAL`), or ``None`` (then
    inconclusive everywhere); every peer passes the same names, modes and widths in order."""

    name: str
    """Stable identifier, e.g. ``layer/blocks.3/forward``; unique within one exchange."""
    mode: Mode
    value: int | float | Sequence[int] | None
    width: int = 1
    """Number of 64-bit words of an exact value; statistical surfaces have width 1."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"surface name must be a non-empty str, got {self.name!r}")
        try:
            object.__setattr__(self, "mode", Mode(self.mode))
        except ValueError:
            valid = ", ".join(m.value for m in Mode)
            raise ValueError(
                f"surface {self.name!r}: mode {self.mode!r} is not one of {valid}"
            ) from None
        if isinstance(self.width, bool) or not isinstance(self.width, int) or self.width < 1:
            raise ValueError(
                f"surface {self.name!r}: width must be an int >= 1, not {self.width!r}"
            )
        if self.value is None:
            if self.mode is Mode.STATISTICAL and self.width != 1:
                raise ValueError(f"surface {self.name!r}: statistical surfaces have width 1")
            return
        object.__setattr__(self, "value", self._normalised(self.value))

    def _normalised(self, value: Any) -> int | float | tuple[int, ...]:
        what = f"surface {self.name!r} value"
        if self.mode is Mode.STATISTICAL:
            if self.width != 1:
                raise ValueError(f"surface {self.name!r}: statistical surfaces have width 1")
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{what} must be a float (seconds), got {type(value).__name__}")
            return float(value)
        if self.width == 1:
            _word(value, what)
            return operator.index(value)
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
            raise ValueError(f"{what} must be a sequence of {self.width} ints")
        if len(value) != self.width:
            raise ValueError(f"{what} has {len(value)} words, the surface width is {self.width}")
        for i, w in enumerate(value):
            _word(w, f"{what}[{i}]")
        return tuple(operator.index(w) for w in value)

    def words(self) -> list[int]:
        """The ``width`` signed int64 words this surface contributes (zeros when missing)."""
        v = self.value
        if v is None:
            return [0] * self.width
        if isinstance(v, float):
            return [_I64.unpack(_F64.pack(v))[0]]
        if isinstance(v, int):
            return [v - (1 << 64) if v >= _SIGN64 else v]
        return [w - (1 << 64) if w >= _SIGN64 else w for w in v]


@dataclass(frozen=True)
class C3Result:
    """One surface's outcome, identical on every peer; position ``j`` of ``bitmap``,
    ``evidence`` and ``ranks`` is peer ``ranks[j]`` (a global rank)."""

    surface: str
    mode: Mode
    status: Status
    bitmap: tuple[bool, ...]
    evidence: tuple[Evidence, ...]
    """Decoded value per peer: unsigned int or word tuple (exact), float (statistical), or None."""
    ranks: tuple[int, ...]

    @property
    def outliers(self) -> tuple[int, ...]:
        """Global ranks whose bit is set (empty unless ``status`` is attributed)."""
        return tuple(r for r, bit in zip(self.ranks, self.bitmap, strict=True) if bit)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready view (enums as their string values, tuples as lists)."""
        return {
            "surface": self.surface,
            "mode": self.mode.value,
            "status": self.status.value,
            "bitmap": list(self.bitmap),
            "evidence": [list(e) if isinstance(e, tuple) else e for e in self.evidence],
            "ranks": list(self.ranks),
            "outliers": list(self.outliers),
        }


@dataclass(frozen=True)
class _Plan:
    """Everything derivable from the layout alone, computed once per layout."""

    header: int
    names: tuple[str, ...]
    modes: tuple[Mode, ...]
    widths: tuple[int, ...]
    offsets: tuple[int, ...]  # first value word of each surface
    used_words: int  # header + presence + values; the rest of the row is padding
    packer: struct.Struct  # packs the used words of a row
    order: tuple[int, ...]  # position j in ``ranks`` -> row index in the gathered table
    ranks: tuple[int, ...]
    description: str
    quiet: tuple[bool, ...]  # the all-false bitmap of this group


@functools.lru_cache(maxsize=256)
def _plan(
    layout: tuple[tuple[str, Mode, int], ...],
    kappa: float,
    ranks: tuple[int, ...],
    group_ranks: tuple[int, ...],
) -> _Plan:
    names = tuple(name for name, _, _ in layout)
    if len(set(names)) != len(names):
        dupes = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"surface names must be unique within one exchange, repeated: {dupes}")
    description = json.dumps(
        {
            "version": _LAYOUT_VERSION,
            "surfaces": [[name, mode.value, width] for name, mode, width in layout],
            "kappa": float(kappa).hex(),
            "ranks": list(ranks),
        },
        separators=(",", ":"),
    )
    digest = hashlib.blake2b(description.encode(), digest_size=8).digest()
    offsets: list[int] = []
    at = 1 + len(layout)
    for _, _, width in layout:
        offsets.append(at)
        at += width
    if at > ROW_WORDS:
        raise ValueError(
            f"the surfaces need {at} words (1 header + {len(layout)} presence + values), "
            f"more than the {ROW_WORDS}-word C3 row; split them over several exchanges"
        )
    return _Plan(
        header=int.from_bytes(digest, "little", signed=True),
        names=names,
        modes=tuple(mode for _, mode, _ in layout),
        widths=tuple(width for _, _, width in layout),
        offsets=tuple(offsets),
        used_words=at,
        packer=struct.Struct(f"<{at}q"),
        order=tuple(group_ranks.index(r) for r in ranks),
        ranks=ranks,
        description=description,
        quiet=(False,) * len(ranks),
    )


def _check_group(group: dist.ProcessGroup | None, ranks: Sequence[int]) -> tuple[int, ...]:
    """Validate the diagnostic group against ``ranks``; return the group's rank order."""
    if group is None or group is dist.group.WORLD:
        raise ValueError(
            "C3 refuses the WORLD group: diagnostic traffic must run on its own group, "
            'made with dist.new_group(ranks, backend="gloo")'
        )
    me = dist.get_rank()
    # new_group hands ranks outside the group a sentinel (GroupMember.NON_GROUP_MEMBER)
    if not isinstance(group, dist.ProcessGroup):
        raise ValueError(f"rank {me} is not a member of the C3 group (ranks {list(ranks)})")
    group_ranks = tuple(dist.get_process_group_ranks(group))
    if len(ranks) != len(group_ranks) or set(ranks) != set(group_ranks):
        raise ValueError(
            f"ranks {list(ranks)} do not match the group's ranks {sorted(group_ranks)}"
        )
    if me not in group_ranks:
        raise ValueError(f"rank {me} is not a member of the C3 group {sorted(group_ranks)}")
    return group_ranks


def _decode(plan: _Plan, i: int, cols: list[tuple[int, ...]], kappa: float) -> C3Result:
    """Decode surface ``i`` from the per-word columns of the ordered table; apply the rule."""
    mode, width, at = plan.modes[i], plan.widths[i], plan.offsets[i]
    present = cols[1 + i]
    complete = 0 not in present
    values: list[Any]
    if complete and width == 1 and mode is Mode.EXACT:
        # The healthy path, without building a Decision: every peer sent the same word.
        col = cols[at]
        if col.count(col[0]) == len(col):
            agreed = (col[0] & _MASK64,) * len(col)
            return C3Result(plan.names[i], mode, Status.AGREE, plan.quiet, agreed, plan.ranks)
    if mode is Mode.STATISTICAL:
        values = _as_floats(cols[at])
    elif width == 1:
        values = [w & _MASK64 for w in cols[at]]
    else:
        peers = zip(*cols[at : at + width], strict=True)  # one word tuple per peer
        values = [tuple(w & _MASK64 for w in ws) for ws in peers]
    decision: Decision
    if not complete:  # a peer without evidence: fail closed, blame nobody
        values = [v if flag else None for v, flag in zip(values, present, strict=True)]
        decision = Decision(Status.INCONCLUSIVE, (False,) * len(present))
    elif mode is Mode.STATISTICAL:
        decision = decide_statistical(values, kappa)
    else:
        decision = decide_exact(values)
    status, bitmap = decision.status, decision.bitmap
    return C3Result(plan.names[i], mode, status, bitmap, tuple(values), plan.ranks)


def _as_floats(words: tuple[int, ...]) -> list[float]:
    fmt = f"<{len(words)}"
    return list(struct.unpack(fmt + "d", struct.pack(fmt + "q", *words)))


def exchange(
    surfaces: Sequence[Surface],
    *,
    group: dist.ProcessGroup,
    ranks: Sequence[int],
    kappa: float = DEFAULT_KAPPA,
    device: torch.device | str | None = None,
) -> dict[str, C3Result]:
    """Run C3 on several surfaces with one AllGather; one result per surface name. ``ranks``: the
    ``group``'s global ranks in result order; ``device`` places the wire tensors (NCCL needs CUDA;
    default CPU). ``ValueError`` before any communication for an empty or duplicated surface list,
    a bad ``kappa``, ``WORLD``, or a caller or ``ranks`` not matching the group."""
    if not (isinstance(kappa, (int, float)) and math.isfinite(kappa) and kappa > 0):
        raise ValueError(f"kappa must be a finite number > 0, got {kappa!r}")
    if not surfaces:
        raise ValueError("exchange needs at least one surface")
    group_ranks = _check_group(group, ranks)
    kappa = float(kappa)
    layout = tuple((s.name, s.mode, s.width) for s in surfaces)
    plan = _plan(layout, kappa, tuple(operator.index(r) for r in ranks), group_ranks)

    row = [plan.header]
    row.extend(0 if s.value is None else 1 for s in surfaces)
    for s in surfaces:
        row.extend(s.words())
    # Packing into a zeroed buffer is ~10x cheaper than torch.tensor(list) of a row.
    wire = bytearray(ROW_WORDS * 8)
    plan.packer.pack_into(wire, 0, *row)
    send = torch.frombuffer(wire, dtype=torch.int64)
    n = len(group_ranks)
    # The table lands in a Python buffer (one copy from a device); struct reads the rows.
    table = bytearray(n * ROW_WORDS * 8)
    host = torch.frombuffer(table, dtype=torch.int64)
    if device is None or torch.device(device).type == "cpu":
        all_gather_single()(host, send, group=group)
    else:
        recv = torch.empty(n * ROW_WORDS, dtype=torch.int64, device=device)
        all_gather_single()(recv, send.to(device), group=group)
        host.copy_(recv)
    rows = [plan.packer.unpack_from(table, k * ROW_WORDS * 8) for k in plan.order]

    bad = [(r, row[0]) for r, row in zip(plan.ranks, rows, strict=True) if row[0] != plan.header]
    if bad:
        listed = ", ".join(f"rank {r}: {h & _MASK64:#018x}" for r, h in bad)
        raise ProtocolError(
            f"C3 layout mismatch in group {list(plan.ranks)}: expected header "
            f"{plan.header & _MASK64:#018x} for {plan.description}, got {listed}"
        )
    cols = list(zip(*rows, strict=True))  # cols[k]: word k of every peer, in ranks order
    flags = set().union(*cols[1 : 1 + len(surfaces)])
    if not flags <= {0, 1}:
        raise ProtocolError(f"C3 presence words must be 0 or 1, got {sorted(flags)}")
    return {name: _decode(plan, i, cols, kappa) for i, name in enumerate(plan.names)}
