"""The campaign's plan: which setups and fault kinds exist, and the trials a seed draws.

A trial is one short training job with one fault: a setup, a fault kind, a victim rank
and an injection step, all drawn from ``random.Random(seed)``, so the same seed always
gives the same plan, on any machine (the plan is drawn over every known setup; a setup
whose framework is not installed is skipped when the trial runs, with a line saying so).

[How a plan covers the kinds]
Fault kinds are dealt like cards: each round shuffles every kind once, so a plan of
``n`` trials holds each kind ``n // len(kinds)`` or one more times; the setup, the
victim and the step of each trial are drawn independently. ``--quick`` is one round
over the core setups; the long campaign deals many rounds over every setup.
"""

from __future__ import annotations

import importlib.util
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from scout_core.testing.trial import FAULT_KINDS

__all__ = [
    "QUICK_SETUPS",
    "SETUPS",
    "Setup",
    "Trial",
    "draw_plan",
    "missing_module",
    "setup_named",
]

_TORCH_BODY = "scout_core.campaign.torch_setups:trial_rank"


@dataclass(frozen=True)
class Setup:
    """A parallel setup a trial trains under."""

    name: str
    world: int
    """Ranks the trial spawns."""
    target: str
    """The rank body, ``"module:function"`` (a plugin's, for a framework setup)."""
    requires: tuple[str, ...] = ()
    """Top-level modules that must be importable, else the setup is skipped."""
    options: dict[str, Any] = field(default_factory=dict)
    """Passed to the rank body (the layout, the ZeRO stage ...)."""
    startup_s: float = 30.0
    """Rough start-up cost on a loaded CPU box, for the trial's hard timeout."""
    init_process_group: bool = True
    """Whether the harness initialises ``torch.distributed`` (TorchTitan does it itself)."""


SETUPS: tuple[Setup, ...] = (
    Setup("ddp", 4, _TORCH_BODY, options={"layout": "ddp"}),
    Setup("fsdp2", 4, _TORCH_BODY, options={"layout": "fsdp"}),
    Setup("hsdp", 4, _TORCH_BODY, options={"layout": "hsdp"}),
    Setup("dptp", 4, _TORCH_BODY, options={"layout": "dptp"}),
    *(
        Setup(
            f"deepspeed-zero{stage}",
            4,
            "scout_deepspeed.campaign:trial_rank",
            ("deepspeed", "scout_deepspeed"),
            {"zero_stage": stage},
            150.0,
        )
        for stage in (1, 2, 3)
    ),
    Setup(
        "deepspeed-pipeline",
        4,
        "scout_deepspeed.campaign:trial_rank",
        ("deepspeed", "scout_deepspeed"),
        {"pipeline": 2},
        150.0,
    ),
    Setup(
        "megatron",
        6,
        "scout_megatron.campaign:trial_rank",
        ("megatron", "scout_megatron"),
        {"tp": 2},
        240.0,
    ),
    Setup(
        "torchtitan",
        6,
        "scout_torchtitan.campaign:trial_rank",
        ("torchtitan", "scout_torchtitan"),
        {"tp": 2},
        240.0,
        init_process_group=False,
    ),
)
"""Every setup SCOUT supports, in the order tables list them."""

QUICK_SETUPS: tuple[str, ...] = ("ddp", "fsdp2", "hsdp", "dptp")
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
    """Training steps the trial runs."""
    world: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def label(self) -> str:
        who = "clean control" if self.victim is None else f"rank {self.victim}"
        return f"#{self.index} {self.setup} {self.kind} {who} step {self.step}"


FIRST_STEP = 2
"""The earliest injection step: steps before it are clean in every trial."""
AFTER = 5
"""Steps a trial runs after its injection step: time for the rotation of replayed
layers to come round and for two straggler rounds."""


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
