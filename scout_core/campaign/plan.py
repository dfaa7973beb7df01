"""The campaign's plan: which setups and fault kinds exist, and the trials a seed draws.

Contract: :func:`draw_plan` draws each trial from ``random.Random(seed)`` alone, so the
same seed gives the same plan on any machine with the same plugins installed. Kinds are
dealt like cards, every kind once per shuffled round. :data:`SETUPS` is :data:`CORE_SETUPS`,
then the plugins' setups by entry-point name; a broken entry is skipped, never fatal.
Docs: docs/campaign.md, "What a trial is".
"""

from __future__ import annotations

import importlib.util
import logging
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from importlib import metadata
from typing import Any

from scout_core.testing.trial import FAULT_KINDS, Setup

__all__ = [
    "CORE_SETUPS",
    "ENTRY_POINT_GROUP",
    "QUICK_SETUPS",
    "SETUPS",
    "Setup",
    "Trial",
    "draw_plan",
    "missing_module",
    "plugin_setups",
    "setup_named",
]

ENTRY_POINT_GROUP = "scout.campaign_setups"
log = logging.getLogger(__name__)

_TORCH_BODY = "scout_core.campaign.torch_setups:trial_rank"

CORE_SETUPS: tuple[Setup, ...] = (
    Setup("ddp", 4, _TORCH_BODY, options={"layout": "ddp"}),
    Setup("fsdp2", 4, _TORCH_BODY, options={"layout": "fsdp"}),
    Setup("hsdp", 4, _TORCH_BODY, options={"layout": "hsdp"}),
    Setup("dptp", 4, _TORCH_BODY, options={"layout": "dptp"}),
)
"""The core's own setups (plain PyTorch parallelism)."""


def plugin_setups(taken: Sequence[str] = ()) -> tuple[Setup, ...]:
    """The setups installed plugins register, by entry-point name; a broken entry, or a
    setup whose name is in ``taken`` or already registered, is logged and skipped."""
    names = set(taken)
    found: list[Setup] = []
    for ep in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        try:
            setups = tuple(ep.load())
        except Exception as exc:  # a broken plugin must not break the campaign
            log.warning("skipping campaign setups %r (%s): %s", ep.name, ep.value, exc)
            continue
        for setup in setups:
            if not isinstance(setup, Setup):
                log.warning("skipping campaign setups %r: %r is not a Setup", ep.name, setup)
            elif setup.name in names:
                log.warning("skipping campaign setup %r of %r: name taken", setup.name, ep.name)
            else:
                names.add(setup.name)
                found.append(setup)
    return tuple(found)


SETUPS: tuple[Setup, ...] = CORE_SETUPS + plugin_setups([s.name for s in CORE_SETUPS])
"""Every setup installed here, in the order tables list them (module doc)."""

QUICK_SETUPS: tuple[str, ...] = tuple(s.name for s in CORE_SETUPS)
"""The setups ``--quick`` draws from: the core's own, cheap to start."""


def setup_named(name: str) -> Setup:
    """The setup called ``name`` (``ValueError`` listing the known ones otherwise)."""
    for s in SETUPS:
        if s.name == name:
            return s
    raise ValueError(f"unknown setup {name!r}; known: {', '.join(s.name for s in SETUPS)}")


def missing_module(setup: Setup) -> str | None:
    """The first module ``setup`` requires that cannot be imported here, else None.

    Looks the module up without importing it (the core never imports a framework)."""
    for module in setup.requires:
        try:
            found = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            found = None
        if found is None:
            return module
    return None


@dataclass(frozen=True)
class Trial:
    """One drawn trial (what ``--plan`` prints and the JSON records)."""

    index: int
    setup: str
    kind: str
    victim: int | None
    """The faulty rank; None for a clean control."""
    step: int
    """The injection step (0-based); for a clean control, where a fault would have been."""
    steps: int
    world: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def label(self) -> str:
        who = "clean control" if self.victim is None else f"rank {self.victim}"
        return f"#{self.index} {self.setup} {self.kind} {who} step {self.step}"


FIRST_STEP = 2
"""The earliest injection step: steps before it are clean in every trial."""
AFTER = 5
"""Steps run after the injection: time for the replay rotation and two straggler rounds."""


def draw_plan(
    seed: int,
    *,
    trials: int,
    setups: Sequence[str],
    kinds: Sequence[str] = FAULT_KINDS,
) -> list[Trial]:
    """``trials`` trials drawn from ``random.Random(seed)`` (module doc)."""
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    chosen = [setup_named(name) for name in setups]
    if not chosen or not kinds:
        raise ValueError("a plan needs at least one setup and one fault kind")
    unknown = sorted(set(kinds) - set(FAULT_KINDS))
    if unknown:
        raise ValueError(f"unknown fault kinds {unknown}; known: {', '.join(FAULT_KINDS)}")
    rng = random.Random(seed)
    deck: list[str] = []
    plan: list[Trial] = []
    for index in range(trials):
        if not deck:
            deck = list(kinds)
            rng.shuffle(deck)
        kind = deck.pop()
        setup = rng.choice(chosen)
        victim = rng.randrange(setup.world)
        step = rng.randrange(FIRST_STEP, FIRST_STEP + 2)
        plan.append(
            Trial(
                index=index,
                setup=setup.name,
                kind=kind,
                victim=None if kind == "clean" else victim,
                step=step,
                steps=step + AFTER,
                world=setup.world,
            )
        )
    return plan
