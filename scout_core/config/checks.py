"""Per-field checks of SCOUT's configuration: one rule per field, whatever the source.

Contract: :func:`check` type-checks a value against the field's annotation (a list stands
for a tuple, an int for a float, never a bool for a number), normalises it and runs the
field's rule, including its exact range in :data:`RANGES`; a bad value is a
:class:`~scout_core.errors.ConfigError` naming the key (and a fixed set's valid values),
never an ``OverflowError``. Docs: docs/configuration.md.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import reprlib
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from scout_core.errors import ConfigError

__all__ = [
    "MAX_VARIANTS",
    "ON_HANG_ACTIONS",
    "ON_SDC_ACTIONS",
    "GATE_MEMORY",
    "RANGES",
    "RECIPES",
    "RESERVED_EXIT_CODES",
    "Spec",
    "VARIANT_RANGE",
    "check",
    "field_names",
    "range_text",
    "shown",
    "specs",
]

RECIPES: tuple[str, ...] = (
    "hidden",
    "embedding",
    "lm_head",
    "optimizer",
    "router",
    "experts",
    "all_to_all",
)
"""The replay recipes ``Config.recipes`` may name, in catalog order."""

ON_HANG_ACTIONS: tuple[str, ...] = ("report", "dump_stacks", "terminate")
"""What the observer may do once it has a hang verdict."""

ON_SDC_ACTIONS: tuple[str, ...] = ("recover", "terminate")
"""What the job does when replay's SDC verdict makes the checkpoint gate select."""

GATE_MEMORY: tuple[str, ...] = ("full", "lean")
"""How many generations the in-memory gate may hold: three (``full``) or two (``lean``)."""

RESERVED_EXIT_CODES: Mapping[int, str] = {
    16: "Megatron-Core's rerun state machine exits 16 to ask for a restart on other hardware",
    17: "Megatron-Core's rerun state machine exits 17 when result validation failed",
    93: "NVIDIA nvidia-resiliency-ext gives exit code 93 its own meaning",
}
"""Exit codes a hang exit must not reuse, with the reason: a launcher or recovery
policy that knows those codes would misread a SCOUT hang exit."""

_DOTTED_PATH = re.compile(r"^[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*$")
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_MAX_TEXT = 4096
_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother, _SHORT.maxlong = 3, 80, 80, 40

RANGES: Mapping[str, tuple[float, float, bool]] = {
    "replay_interval": (1, 1_000_000, False),
    "embedding_interval": (1, 1_000_000, False),
    "lm_head_interval": (1, 1_000_000, False),
    "optimizer_interval": (1, 1_000_000, False),
    "router_interval": (1, 1_000_000, False),
    "expert_interval": (1, 1_000_000, False),
    "all_to_all_interval": (1, 1_000_000, False),
    "optimizer_slice": (1, 1 << 26, False),
    "custody_slices": (0, 1_000_000, False),
    "custody_every": (1, 1_000_000, False),
    "referee_timeout_s": (1, 3600, False),
    "kappa": (0, 100, True),
    "straggler_rounds": (1, 1000, False),
    "straggler_min_excess_s": (0, 3600, False),
    "straggler_min_ratio": (1, 1000, False),
    "replay_threads": (1, 1024, False),
    "hang_timeout_s": (1, 86_400, False),
    "stage_timeout_s": (1, 86_400, False),
    "observer_join_timeout_s": (1, 3600, False),
    "catalog_size": (1, 1_000_000, False),
    "gate_capture_interval": (1, 1_000_000, False),
}
"""Sane range of each numeric key: ``(low, high, low_is_open)``; a value outside is a mistake
(hang timeouts start at 1 s because a healthy step takes longer than a few milliseconds)."""

MAX_VARIANTS = 8
"""At most this many input scale variants (each one is a whole extra replay)."""
VARIANT_RANGE: tuple[float, float] = (1e-4, 1e4)


@dataclass(frozen=True, slots=True)
class Spec:
    """What a field accepts: its base type, whether None is allowed, its element type."""

    base: type
    optional: bool
    element: type | None = None

    def describe(self) -> str:
        text = f"list of {self.element.__name__}" if self.element else self.base.__name__
        return f"{text} or null" if self.optional else text


@functools.cache
def field_names(cls: type) -> tuple[str, ...]:
    """The field names of the config dataclass ``cls``, in declaration order."""
    return tuple(f.name for f in dataclasses.fields(cls))


@functools.cache
def specs(cls: type) -> dict[str, Spec]:
    """What each field of the config dataclass ``cls`` accepts, from its type hints."""
    hints = typing.get_type_hints(cls)
    out: dict[str, Spec] = {}
    for name in field_names(cls):
        hint = hints[name]
        args = typing.get_args(hint)
        optional = isinstance(hint, types.UnionType) and type(None) in args
        if optional:
            (hint,) = (a for a in args if a is not type(None))
        if typing.get_origin(hint) is tuple:
            out[name] = Spec(tuple, optional, typing.get_args(hint)[0])
        else:
            out[name] = Spec(hint, optional)
    return out


def check(cls: type, name: str, value: object) -> Any:
    """Type-check and normalise one field's value, then apply its value rule."""
    spec = specs(cls)[name]
    if value is None:
        if spec.optional:
            return None
        raise ConfigError(f"key {name!r} expects {spec.describe()}, got None")
    value = _coerce(name, spec, value)
    rule = _RULES.get(name)
    if rule is not None:
        rule(name, value)
    return value


def _coerce(name: str, spec: Spec, value: object) -> Any:
    def wrong() -> ConfigError:
        return ConfigError(
            f"key {name!r} expects {spec.describe()}, got {type(value).__name__} {shown(value)}"
        )

    if spec.base is tuple:
        if not isinstance(value, list | tuple):
            raise wrong()
        assert spec.element is not None
        return tuple(_scalar(spec.element, item, wrong) for item in value)
    return _scalar(spec.base, value, wrong)


def _scalar(kind: type, value: object, wrong: Callable[[], ConfigError]) -> Any:
    # bool is an int subclass; a true/false in a file is never meant as 1/0.
    if kind is bool:
        if isinstance(value, bool):
            return value
    elif kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif kind is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            try:
                return float(value)
            except OverflowError:  # a 400-digit integer: out of every range anyway
                return math.inf
    elif kind is str and isinstance(value, str):
        return value
    raise wrong()


def shown(value: object) -> str:
    """A bounded ``repr`` for messages: huge or deeply nested values stay short."""
    try:
        return _SHORT.repr(value)
    except RecursionError:  # pragma: no cover - reprlib bounds the depth already
        return f"<{type(value).__name__}>"


def _in_range(name: str, value: Any) -> None:
    """Check ``value`` against the field's sane range (exact for ints: no float overflow)."""
    low, high, open_low = RANGES[name]
    if isinstance(value, float) and not math.isfinite(value):
        ok = False
    else:
        ok = (value > low if open_low else value >= low) and value <= high
    if not ok:
        where = range_text(name) if RANGES[name][2] else f"in {range_text(name)}"
        raise ConfigError(f"key {name!r} must be {where}, got {shown(value)}")


def range_text(name: str) -> str:
    """The documented range of numeric field ``name``, e.g. ``1..1,000,000``."""
    low, high, open_low = RANGES[name]
    lo, hi = _number(low), _number(high)
    return f"> {lo} and <= {hi}" if open_low else f"{lo}..{hi}"


def _number(x: float) -> str:
    if isinstance(x, int) or float(x).is_integer():
        return f"{int(x):,}"
    return f"{x:g}"


def _nonempty(name: str, value: str) -> None:
    if not value.strip():
        raise ConfigError(f"key {name!r} must not be empty")
    if len(value) > _MAX_TEXT or "\x00" in value:
        raise ConfigError(
            f"key {name!r} must be at most {_MAX_TEXT} characters without NUL bytes, "
            f"got {shown(value)}"
        )


def _run_id(name: str, value: str) -> None:
    _nonempty(name, value)
    if not _RUN_ID.match(value):
        raise ConfigError(
            f"key {name!r} must be 1..128 letters, digits, '.', '_' or '-', starting with a "
            f"letter or digit (it names the run's report directory), got {shown(value)}"
        )


def _module_path(name: str, value: str) -> None:
    if not _DOTTED_PATH.match(value) or len(value) > _MAX_TEXT:
        raise ConfigError(
            f"key {name!r} must be a dotted module path such as 'model.layers', got {shown(value)}"
        )


def _recipes(name: str, value: tuple[str, ...]) -> None:
    for item in value:
        if item not in RECIPES:
            raise ConfigError(
                f"key {name!r} has unknown recipe {shown(item)}; valid recipes: "
                f"{', '.join(RECIPES)}"
            )
    if len(set(value)) != len(value):
        raise ConfigError(f"key {name!r} names a recipe twice: {shown(list(value))}")


def _variants(name: str, value: tuple[float, ...]) -> None:
    if not value:
        raise ConfigError(f"key {name!r} needs at least one input scale, e.g. [1.0]")
    if len(value) > MAX_VARIANTS:
        raise ConfigError(
            f"key {name!r} has {len(value)} scales; at most {MAX_VARIANTS} (each one is a "
            "whole extra replay)"
        )
    for item in value:
        if not (math.isfinite(item) and item > 0):
            raise ConfigError(f"key {name!r}: every scale must be finite and > 0, got {item!r}")
        if not VARIANT_RANGE[0] <= item <= VARIANT_RANGE[1]:
            raise ConfigError(
                f"key {name!r}: every scale must be in {VARIANT_RANGE[0]:g}..{VARIANT_RANGE[1]:g} "
                f"(larger scales overflow low-precision replay), got {item!r}"
            )
    if len(set(value)) != len(value):
        raise ConfigError(f"key {name!r} repeats a scale: {list(value)}")


def _port(name: str, value: int) -> None:
    if not 1 <= value <= 65535:
        raise ConfigError(f"key {name!r} must be a TCP port in 1..65535, got {shown(value)}")


def _on_hang(name: str, value: str) -> None:
    if value not in ON_HANG_ACTIONS:
        raise ConfigError(
            f"key {name!r} must be one of {', '.join(ON_HANG_ACTIONS)}; got {shown(value)}"
        )


def _on_sdc(name: str, value: str) -> None:
    if value not in ON_SDC_ACTIONS:
        raise ConfigError(
            f"key {name!r} must be one of {', '.join(ON_SDC_ACTIONS)}; got {shown(value)}"
        )


def _gate_memory(name: str, value: str) -> None:
    if value not in GATE_MEMORY:
        raise ConfigError(
            f"key {name!r} must be one of {', '.join(GATE_MEMORY)}; got {shown(value)}"
        )


_EXIT_KIND = {"hang_exit_code": "hang ", "sdc_exit_code": "SDC "}


def _exit_code(name: str, value: int) -> None:
    if not 1 <= value <= 255:
        raise ConfigError(f"key {name!r} must be an exit code in 1..255, got {shown(value)}")
    if value in RESERVED_EXIT_CODES:
        raise ConfigError(
            f"key {name!r} must not be {value}: {RESERVED_EXIT_CODES[value]}, so a launcher "
            f"would misread a SCOUT {_EXIT_KIND.get(name, '')}exit; reserved: "
            f"{', '.join(str(code) for code in sorted(RESERVED_EXIT_CODES))}"
        )


_RULES: dict[str, Callable[[str, Any], None]] = {
    "run_id": _run_id,
    "report_dir": _nonempty,
    "layers": _module_path,
    "embedding": _module_path,
    "lm_head": _module_path,
    "recipes": _recipes,
    "variants": _variants,
    "observer_addr": _nonempty,
    "observer_port": _port,
    "on_hang": _on_hang,
    "hang_exit_code": _exit_code,
    "on_sdc": _on_sdc,
    "sdc_exit_code": _exit_code,
    "checkpoint_dir": _nonempty,
    "gate_memory": _gate_memory,
    "moe_catalog": _nonempty,
    **{name: _in_range for name in RANGES},
}
