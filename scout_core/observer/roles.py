"""Group roles: the group word of a fingerprint, equal on equivalent ranks, and its members.

Contract: with a layout, a process group is described by its role (the mesh axes its members
span) and its position on the other axes, peer axes left out, so equivalent ranks in
different replicas publish the same group word; a point-to-point partner is relative to
this rank. Docs: docs/observer.md, "Peer groups: comparing equivalent ranks only".
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from scout_core.topology.mesh import AXES, Axis, MeshLayout

__all__ = [
    "KIND_ALIGNED",
    "KIND_OTHER",
    "KIND_P2P",
    "KIND_PLAIN",
    "GroupRoles",
    "collective_members",
    "decode_group_word",
    "plain_group_word",
]

KIND_PLAIN, KIND_ALIGNED, KIND_P2P, KIND_OTHER = 0, 1, 2, 3
_HASH_BITS = 48
_HASH_MASK = (1 << _HASH_BITS) - 1
_AXES_SHIFT = 48
_KIND_SHIFT = 54
_KIND_NAMES = {KIND_PLAIN: "ranks", KIND_ALIGNED: "axes", KIND_P2P: "p2p", KIND_OTHER: "other"}


def _hash48(text: str) -> int:
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & _HASH_MASK


def _word(kind: int, axes: int, text: str) -> int:
    return (kind << _KIND_SHIFT) | (axes << _AXES_SHIFT) | _hash48(text)


def plain_group_word(ranks: Sequence[int]) -> int:
    """The group word without a layout: a hash of the group's global ranks (kind 0)."""
    return _word(KIND_PLAIN, 0, ",".join(map(str, ranks)))


def decode_group_word(word: int) -> tuple[int, tuple[Axis, ...]]:
    """(kind, axes spanned) of a group word; the axes are empty unless aligned."""
    w = int(word) & ((1 << 64) - 1)
    kind = (w >> _KIND_SHIFT) & 0b11
    mask = (w >> _AXES_SHIFT) & 0b111111
    return kind, tuple(a for i, a in enumerate(AXES) if mask >> i & 1)


def describe_group_word(word: int) -> str:
    """``"t"``, ``"d+t"``, ``"p2p"``, ``"other"`` or ``"ranks"``: for evidence records."""
    kind, axes = decode_group_word(word)
    if kind == KIND_ALIGNED:
        return "+".join(a.value for a in axes) or "self"
    return _KIND_NAMES[kind]


@dataclass(frozen=True)
class GroupRoles:
    """Role-and-position descriptions of groups, seen from ``rank`` of ``layout``."""

    layout: MeshLayout
    rank: int

    @property
    def peer_axes(self) -> tuple[Axis, ...]:
        """The axes this rank's peers differ on (``d``, or ``s`` without replicas)."""
        return self.layout.axes_for("peer")

    def _relative(self, member: int) -> tuple[int, ...]:
        """``member``'s address, peer-axis coordinates taken relative to this rank's."""
        mine = self.layout.address(self.rank)
        addr = self.layout.address(member)
        peer = set(self.peer_axes)
        return tuple(
            (addr.get(a) - mine.get(a)) % self.layout.size(a) if a in peer else addr.get(a)
            for a in AXES
        )

    def group_word(self, ranks: Sequence[int]) -> int:
        """The group word of a collective over the global ``ranks`` (module note)."""
        layout = self.layout
        try:
            addrs = [layout.address(r).as_tuple() for r in ranks]
        except ValueError:  # a rank outside the layout: describe it by its ranks
            return _word(KIND_OTHER, 0, "ranks:" + ",".join(map(str, sorted(ranks))))
        if not addrs:
            return _word(KIND_OTHER, 0, "empty")
        spans = [i for i in range(len(AXES)) if len({a[i] for a in addrs}) > 1]
        fixed = addrs[0]
        size = 1
        for i in spans:
            size *= layout.sizes[i]
        aligned = len(set(addrs)) == len(addrs) == size and all(
            a[i] == fixed[i] for a in addrs for i in range(len(AXES)) if i not in spans
        )
        if aligned:
            peer = {AXES.index(a) for a in self.peer_axes}
            position = [
                f"{AXES[i].value}={fixed[i]}"
                for i in range(len(AXES))
                if i not in spans and i not in peer
            ]
            mask = sum(1 << i for i in spans)
            text = "aligned:" + "+".join(AXES[i].value for i in spans) + "@" + ",".join(position)
            return _word(KIND_ALIGNED, mask, text)
        canon = sorted(self._relative(r) for r in ranks)
        return _word(KIND_OTHER, 0, "other:" + repr(canon))

    def p2p_word(self, peer: int) -> int:
        """The group word of a send or receive with global rank ``peer``."""
        try:
            rel = self._relative(peer)
        except ValueError:
            return _word(KIND_P2P, 0, f"p2p-outside:{peer}")
        return _word(KIND_P2P, 0, "p2p:" + repr(rel))


def collective_members(
    layout: MeshLayout, rank: int, word: int, peer: int | None
) -> tuple[int, ...] | None:
    """The global ranks taking part in ``rank``'s pending operation, or None if unknown.

    Known for an aligned group (ranks differing from ``rank`` only on its axes) and for
    point-to-point (``rank`` and ``peer``)."""
    kind, axes = decode_group_word(word)
    if kind == KIND_ALIGNED and axes:
        return layout.group_along(rank, axes)
    if kind == KIND_P2P and peer is not None and peer != rank:
        return tuple(sorted((rank, peer)))
    return None
