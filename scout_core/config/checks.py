"""Per-field checks of SCOUT's configuration: one rule per field, whatever the source.

A value from Python, a file, a framework's section or an environment variable goes
through :func:`check` with the field's name: it is type-checked against the field's
annotation (:class:`Spec`: a list stands for a tuple, an int for a float, never a
bool for a number), normalised, and then the field's value rule runs, so a bad
value fails the same way wherever it came from, with a
:class:`~scout_core.errors.ConfigError` that names the key and, for a fixed set,
the valid values.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from scout_core.errors import ConfigError

__all__ = [
    "ON_HANG_ACTIONS",
    "RECIPES",
    "RESERVED_EXIT_CODES",
    "Spec",
    "check",
    "field_names",
    "specs",
]

RECIPES: tuple[str, ...] = ("hidden", "embedding", "lm_head", "optimizer")
"""The replay recipes ``Config.recipes`` may name, in catalog order."""

ON_HANG_ACTIONS: tuple[str, ...] = ("report", "dump_stacks", "terminate")
"""What the observer may do once it has a hang verdict."""

RESERVED_EXIT_CODES: Mapping[int, str] = {
    16: "Megatron-Core's rerun state machine exits 16 to ask for a restart on other hardware",
    17: "Megatron-Core's rerun state machine exits 17 when result validation failed",
    93: "NVIDIA nvidia-resiliency-ext gives exit code 93 its own meaning",
}
"""Exit codes a hang exit must not reuse, with the reason: a launcher or recovery
policy that knows those codes would misread a SCOUT hang exit."""

_DOTTED_PATH = re.compile(r"^[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*$")


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
            f"key {name!r} expects {spec.describe()}, got {type(value).__name__} {value!r}"
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
            return float(value)
    elif kind is str and isinstance(value, str):
        return value
    raise wrong()


def _at_least(low: float) -> Callable[[str, Any], None]:
    def rule(name: str, value: Any) -> None:
        if not (math.isfinite(value) and value >= low):
            raise ConfigError(f"key {name!r} must be >= {low:g}, got {value!r}")

    return rule


def _positive(name: str, value: Any) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"key {name!r} must be a finite number > 0, got {value!r}")


def _nonempty(name: str, value: str) -> None:
    if not value.strip():
        raise ConfigError(f"key {name!r} must not be empty")


def _module_path(name: str, value: str) -> None:
    if not _DOTTED_PATH.match(value):
        raise ConfigError(
            f"key {name!r} must be a dotted module path such as 'model.layers', got {value!r}"
        )


def _recipes(name: str, value: tuple[str, ...]) -> None:
    for item in value:
        if item not in RECIPES:
            raise ConfigError(
                f"key {name!r} has unknown recipe {item!r}; valid recipes: {', '.join(RECIPES)}"
            )
    if len(set(value)) != len(value):
        raise ConfigError(f"key {name!r} names a recipe twice: {list(value)}")


def _variants(name: str, value: tuple[float, ...]) -> None:
    if not value:
        raise ConfigError(f"key {name!r} needs at least one input scale, e.g. [1.0]")
    for item in value:
        if not (math.isfinite(item) and item > 0):
            raise ConfigError(f"key {name!r}: every scale must be finite and > 0, got {item!r}")
    if len(set(value)) != len(value):
        raise ConfigError(f"key {name!r} repeats a scale: {list(value)}")


def _port(name: str, value: int) -> None:
    if not 1 <= value <= 65535:
        raise ConfigError(f"key {name!r} must be a TCP port in 1..65535, got {value}")


def _on_hang(name: str, value: str) -> None:
    if value not in ON_HANG_ACTIONS:
        raise ConfigError(
            f"key {name!r} must be one of {', '.join(ON_HANG_ACTIONS)}; got {value!r}"
        )


def _exit_code(name: str, value: int) -> None:
    if not 1 <= value <= 255:
        raise ConfigError(f"key {name!r} must be an exit code in 1..255, got {value}")
    if value in RESERVED_EXIT_CODES:
        raise ConfigError(
            f"key {name!r} must not be {value}: {RESERVED_EXIT_CODES[value]}, so a launcher "
            f"would misread a SCOUT hang exit; reserved: "
            f"{', '.join(str(code) for code in sorted(RESERVED_EXIT_CODES))}"
        )


_RULES: dict[str, Callable[[str, Any], None]] = {
    "run_id": _nonempty,
    "report_dir": _nonempty,
    "layers": _module_path,
    "embedding": _module_path,
    "lm_head": _module_path,
    "replay_interval": _at_least(1),
    "embedding_interval": _at_least(1),
    "lm_head_interval": _at_least(1),
    "optimizer_interval": _at_least(1),
    "recipes": _recipes,
    "variants": _variants,
    "optimizer_slice": _at_least(1),
    "kappa": _positive,
    "straggler_rounds": _at_least(1),
    "straggler_min_excess_s": _at_least(0),
    "straggler_min_ratio": _at_least(1),
    "replay_threads": _at_least(1),
    "hang_timeout_s": _positive,
    "stage_timeout_s": _positive,
    "observer_addr": _nonempty,
    "observer_port": _port,
    "observer_join_timeout_s": _positive,
    "on_hang": _on_hang,
    "hang_exit_code": _exit_code,
    "checkpoint_dir": _nonempty,
    "catalog_size": _at_least(1),
}
