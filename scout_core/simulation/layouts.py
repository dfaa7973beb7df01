"""Layout strings and the published layouts SCOUT is simulated on (PAPER.md Table 2).

Contract: :func:`parse_layout` reads ``<AXIS><degree>`` tokens (:data:`TOKENS`), separated
by spaces or commas, in any order and case, into a :class:`~scout_core.topology.mesh.MeshLayout`
laid out Megatron's way (:data:`ORDER`); every error names its token. Axes: docs/scale.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from scout_core.errors import ConfigError
from scout_core.topology.mesh import MeshLayout

__all__ = ["LARGE", "ORDER", "TABLE_2", "TOKENS", "PublishedLayout", "parse_layout"]

TOKENS: dict[str, str] = {
    "TP": "tp",
    "PP": "pp",
    "DP": "dp",
    "CP": "cp",
    "EP": "ep",
    "EDP": "ep",
    "FSDP": "fsdp",
}
"""Accepted axis tokens (upper case) and the mesh axis each sets."""
ORDER = "tp-cp-ep-fsdp-dp-pp"
"""Megatron-style rank order, fastest-varying axis first."""

_TOKEN = re.compile(r"^([A-Za-z]+)([0-9]+)$")


def parse_layout(text: str) -> MeshLayout:
    """The :class:`MeshLayout` a layout string describes; :class:`ConfigError` names a bad token."""
    tokens = [t for t in re.split(r"[\s,]+", text.strip()) if t]
    if not tokens:
        raise ConfigError(f"empty layout {text!r}; write degrees like 'TP8 PP16 DP128'")
    sizes: dict[str, int] = {}
    seen: dict[str, str] = {}
    for token in tokens:
        letters = re.match(r"[A-Za-z]*", token)
        name = letters.group(0).upper() if letters else ""
        if name not in TOKENS:
            raise ConfigError(
                f"unknown axis in token {token!r}; axes: {', '.join(TOKENS)} (e.g. 'TP8')"
            )
        match = _TOKEN.match(token)
        if match is None:
            raise ConfigError(f"token {token!r} is not <axis><degree>, e.g. '{name}8'")
        degree = int(match.group(2))
        if degree < 1:
            raise ConfigError(f"token {token!r}: a degree must be at least 1")
        axis = TOKENS[name]
        if axis in seen:
            raise ConfigError(
                f"token {token!r} sets the {axis} axis again (already set by {seen[axis]!r})"
            )
        seen[axis], sizes[axis] = token, degree
    return MeshLayout.from_order(ORDER, **sizes)


@dataclass(frozen=True)
class PublishedLayout:
    """A layout from the literature, with what the paper says about it."""

    model: str
    gpus: int
    layout: str
    peer_degree: int
    """Ranks in each replica group: the peers C3 compares."""


TABLE_2: tuple[PublishedLayout, ...] = (
    PublishedLayout("Megatron 1T", 3072, "TP8 PP64 DP6", 6),
    PublishedLayout("MegaScale 175B", 12288, "TP8 PP8 DP192", 192),
    PublishedLayout("GLM-130B", 768, "TP4 PP8 DP24", 24),
    PublishedLayout("Llama 3 405B", 16384, "TP8 PP16 DP128", 128),
    PublishedLayout("Skywork-MoE", 1536, "PP12 EDP4 DP32", 32),
    PublishedLayout("MegaScale-MoE", 1440, "PP15 EP8 DP12", 12),
)
"""PAPER.md Table 2: published layouts up to 16,384 GPUs."""
LARGE = PublishedLayout("100k-rank (hypothetical)", 102400, "TP8 CP2 PP16 DP400", 400)
"""A 100k-rank layout beyond Table 2: Llama 3's TP and PP, with context parallelism."""
