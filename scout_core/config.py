"""SCOUT's configuration: one flat, validated, frozen dataclass.

Every knob SCOUT has is a field of :class:`Config`, with a docstring under it. The
same object is built from Python (``Config(report_dir=...)``), from a TOML or JSON
file (:meth:`Config.from_file`), from a framework's own config section such as the
``"scout"`` key of a DeepSpeed JSON (:meth:`Config.from_mapping`), and from
``SCOUT_<FIELD>`` environment variables (:meth:`Config.from_env`), which override
file values. All four paths go through one per-field check, so a bad value fails
the same way wherever it came from: a :class:`~scout_core.errors.ConfigError` that
names the key (or the environment variable) and, for a fixed set, the valid values.

The config is flat on purpose: a flat namespace maps one-to-one onto environment
variables, command-line flags and a framework's config section, with no nesting
rules to learn. ``docs/configuration.md`` is generated from the field docstrings
(:func:`fields_doc`) and a test keeps it in step with this file.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import inspect
import itertools
import json
import math
import os
import re
import sys
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scout_core.errors import ConfigError

# tomllib is in the standard library from 3.11; tomli is the same parser, backported.
if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on Python 3.10
    import tomli as tomllib

__all__ = [
    "Config",
    "RECIPES",
    "ON_HANG_ACTIONS",
    "RESERVED_EXIT_CODES",
    "ENV_PREFIX",
    "NON_CONFIG_ENV",
    "NON_CONFIG_ENV_PREFIXES",
    "fields_doc",
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

ENV_PREFIX = "SCOUT_"
"""Every environment override is ``SCOUT_<FIELD NAME IN UPPER CASE>``."""

NON_CONFIG_ENV: frozenset[str] = frozenset({"SCOUT_CONFIG"})
"""``SCOUT_*`` variables that are not field overrides (``SCOUT_CONFIG`` names a file)."""

NON_CONFIG_ENV_PREFIXES: tuple[str, ...] = ("SCOUT_TEST_", "SCOUT_INTERNAL_")
"""Prefixes reserved for the test harness and for SCOUT's own child processes; variables
under them are never read as config, so a typo elsewhere cannot hide behind them."""

_DOTTED_PATH = re.compile(r"^[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*$")
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


@dataclass(kw_only=True, slots=True, frozen=True)
class Config:
    """Everything SCOUT can be told. Build with keywords; change with ``dataclasses.replace``."""

    enabled: bool = True
    """Master switch. A disabled config attaches nothing: no hooks, no observer, no records."""

    run_id: str | None = None
    """Run identity written into every evidence record. ``None`` uses the environment
    variable ``TORCHELASTIC_RUN_ID`` (torchrun sets it identically on every rank), else
    ``"scout"``. It must be the same on every rank; see ``resolved_run_id()``."""

    report_dir: str = "scout-report"
    """Directory for evidence records; each rank appends to ``rank-<global rank>.jsonl``."""

    layers: str | None = None
    """Dotted module path (from the model root) of the ``ModuleList`` of repeated layers,
    e.g. ``"model.layers"``. ``None`` auto-detects the largest ``ModuleList`` of
    same-class blocks."""

    embedding: str | None = None
    """Dotted module path of the token embedding. ``None`` auto-detects it."""

    lm_head: str | None = None
    """Dotted module path of the LM head (output projection). ``None`` auto-detects it."""

    replay_interval: int = 20
    """Replay one hidden layer every this many optimizer steps, rotating through the
    layers (>= 1)."""

    embedding_interval: int = 20
    """Replay the embedding every this many optimizer steps (>= 1). Switch the recipe
    off through ``recipes``, not with 0."""

    lm_head_interval: int = 20
    """Replay the LM head every this many optimizer steps (>= 1). Switch the recipe off
    through ``recipes``, not with 0."""

    optimizer_interval: int = 20
    """Replay the optimizer update on one slice every this many optimizer steps (>= 1).
    Switch the recipe off through ``recipes``, not with 0."""

    recipes: tuple[str, ...] = RECIPES
    """Replay recipes to run, any of ``hidden``, ``embedding``, ``lm_head``,
    ``optimizer`` (no repeats). An empty list turns numerical replay off and leaves
    the hang observer."""

    variants: tuple[float, ...] = (0.1, 1.0, 10.0)
    """Input scale variants each replay runs, to widen value coverage (non-empty,
    finite, > 0, no repeats)."""

    optimizer_slice: int = 65536
    """Elements in one optimizer-replay slice; the slice rotates over the parameters
    (>= 1)."""

    kappa: float = 5.0
    """Sensitivity of statistical C3: a peer is an outlier when its timing is more than
    ``kappa`` robust scales from the median (> 0)."""

    straggler_rounds: int = 2
    """Consecutive timing rounds in which the same rank must be the outlier before a
    straggler verdict (>= 1)."""

    straggler_min_excess_s: float = 0.05
    """Minimum absolute excess over the peers' median, in seconds, for a timing outlier
    to count towards a straggler (>= 0)."""

    straggler_min_ratio: float = 1.5
    """Minimum ratio of the outlier's time to the peers' median for a timing outlier to
    count towards a straggler (>= 1)."""

    deterministic: bool = True
    """Run replay under deterministic algorithms (scoped to the replay), so equal inputs
    give bitwise-equal outputs on healthy peers."""

    replay_threads: int | None = None
    """Intra-op CPU threads during replay (>= 1). ``None``: the peers agree on the
    minimum of their current thread counts, since BLAS may change path with the
    thread count."""

    observer: bool = True
    """Start the out-of-band hang observer (one CPU process per rank)."""

    hang_timeout_s: float = 60.0
    """Seconds of silent progress before the observer starts a hang diagnosis (> 0)."""

    stage_timeout_s: float | None = None
    """Seconds a rank may stay inside one stage (dataloader, checkpoint I/O) before it
    counts as stalled (> 0). ``None`` uses ``hang_timeout_s``."""

    observer_addr: str | None = None
    """Host of the observers' own c10d store. ``None`` derives it under torchrun."""

    observer_port: int | None = None
    """Port of the observers' own c10d store (1..65535). ``None`` derives it under
    torchrun."""

    observer_join_timeout_s: float = 30.0
    """Seconds the observers wait for each other to join their group (> 0)."""

    on_hang: str = "report"
    """What to do after a hang verdict: ``report`` (write evidence only),
    ``dump_stacks`` (also dump every thread's stack) or ``terminate`` (also end the
    process with ``hang_exit_code`` so the launcher restarts the job)."""

    hang_exit_code: int = 86
    """Exit code used by ``on_hang = "terminate"`` (1..255; not 16 or 17, which
    Megatron-Core uses, nor 93, which nvidia-resiliency-ext uses)."""

    gate: bool = True
    """Run the checkpoint gate at replay boundaries: keep latest / candidate / verified
    in-memory checkpoints, certify them by clean replay cycles, and let
    ``session.recover`` restore the one recovery can trust."""

    checkpoint_dir: str | None = None
    """Directory for durable gate checkpoints (torch.distributed.checkpoint). ``None``
    keeps gate checkpoints in memory only."""

    catalog_size: int | None = None
    """K, the number of recipe checks in one catalog cycle (>= 1). ``None`` derives it
    from the recipe catalog (rotated layers plus embedding, LM head, optimizer)."""

    peer_replication: bool = False
    """Also replicate each in-memory gate checkpoint to a peer, so a lost machine's
    state can be recovered."""

    def __post_init__(self) -> None:
        # Frozen: normalised values (list -> tuple, int -> float) go in through
        # object.__setattr__, which is how a frozen dataclass sets its own fields.
        for f in dataclasses.fields(self):
            value = _check(f.name, getattr(self, f.name))
            object.__setattr__(self, f.name, value)

    # -- resolved views ---------------------------------------------------------------

    def resolved_run_id(self, environ: Mapping[str, str] | None = None) -> str:
        """The run id records carry: ``run_id``, else ``TORCHELASTIC_RUN_ID``, else ``"scout"``."""
        if self.run_id is not None:
            return self.run_id
        env = os.environ if environ is None else environ
        return env.get("TORCHELASTIC_RUN_ID") or "scout"

    def resolved_stage_timeout_s(self) -> float:
        """``stage_timeout_s`` when set, else ``hang_timeout_s``."""
        return self.hang_timeout_s if self.stage_timeout_s is None else self.stage_timeout_s

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict of every field (tuples become lists); ``from_mapping`` reads it back."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    # -- constructors -----------------------------------------------------------------

    @classmethod
    def from_mapping(
        cls,
        mapping: Mapping[str, Any],
        *,
        source: str = "config mapping",
        base: Config | None = None,
    ) -> Config:
        """Build a config from a mapping of field names to values (a file's table, a
        framework's ``"scout"`` section), on top of ``base`` (default: the defaults).

        Unknown keys and wrong types raise :class:`ConfigError` naming ``source`` and
        the key. Values must have the field's type: a list stands for a tuple and an
        int for a float, but strings are not parsed (that is what env overrides do).
        """
        if not isinstance(mapping, Mapping):
            raise ConfigError(
                f"{source}: expected a table of config keys, got {type(mapping).__name__}"
            )
        valid = _field_names()
        values: dict[str, Any] = {}
        for key, value in mapping.items():
            if key not in valid:
                raise ConfigError(f"{source}: {_unknown(str(key), valid)}")
            try:
                values[key] = _check(key, value)
            except ConfigError as exc:
                raise ConfigError(f"{source}: {exc}") from None
        start = cls() if base is None else base
        return dataclasses.replace(start, **values)

    @classmethod
    def from_file(
        cls, path: str | os.PathLike[str], *, environ: Mapping[str, str] | None = None
    ) -> Config:
        """Read a ``.toml`` or ``.json`` file, then apply ``SCOUT_*`` env overrides.

        The file holds the config keys either at the top level or inside one
        ``[scout]`` table (TOML) / ``"scout"`` object (JSON). The ``scout`` table is
        used when the file has a top-level ``scout`` key, and then any other top-level
        keys are left alone, so the section can live inside a larger file.
        """
        mapping = _read_file(Path(path))
        base = cls.from_mapping(mapping, source=str(path))
        return cls.from_env(base, environ=os.environ if environ is None else environ)

    @classmethod
    def from_env(
        cls, base: Config | None = None, environ: Mapping[str, str] | None = None
    ) -> Config:
        """Apply ``SCOUT_<FIELD>`` overrides from ``environ`` to ``base``.

        With no ``base``, ``SCOUT_CONFIG=<path>`` names a file to start from (its
        values, then these overrides); without it the defaults are the start.
        Values are parsed from text: bools ``1/0/true/false/yes/no/on/off``, ints,
        floats, comma-separated lists, and ``none`` or an empty value for ``None``
        (an empty value is an empty list for a list field). An unknown ``SCOUT_*``
        variable is an error, so a misspelt override cannot be silently ignored.
        """
        env = os.environ if environ is None else environ
        if base is None:
            file = env.get("SCOUT_CONFIG")
            base = cls.from_mapping(_read_file(Path(file)), source=file) if file else cls()
        valid = _field_names()
        overrides: dict[str, Any] = {}
        for var in sorted(env):
            if not var.startswith(ENV_PREFIX) or _is_non_config_env(var):
                continue
            name = var[len(ENV_PREFIX) :].lower()
            if name not in valid:
                raise ConfigError(f"environment variable {var}: {_unknown(name, valid, env=True)}")
            try:
                overrides[name] = _check(name, _parse_env(name, env[var]))
            except ConfigError as exc:
                raise ConfigError(f"environment variable {var}={env[var]!r}: {exc}") from None
        return dataclasses.replace(base, **overrides) if overrides else base


# -- field docs -----------------------------------------------------------------------


@functools.cache
def fields_doc() -> dict[str, str]:
    """Field name -> the docstring written under it in :class:`Config` (whitespace folded).

    Read from the source with :mod:`ast`, because a string under an assignment is not
    kept at runtime. ``docs/configuration.md`` is written from this.
    """
    tree = ast.parse(inspect.getsource(Config))
    cls = tree.body[0]
    assert isinstance(cls, ast.ClassDef)
    docs: dict[str, str] = {}
    body = cls.body
    for node, after in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = " ".join(after.value.value.split())
    return {name: docs.get(name, "") for name in _field_names()}


# -- per-field checks -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Spec:
    """What a field accepts: its base type, whether None is allowed, its element type."""

    base: type
    optional: bool
    element: type | None = None

    def describe(self) -> str:
        text = f"list of {self.element.__name__}" if self.element else self.base.__name__
        return f"{text} or null" if self.optional else text


@functools.cache
def _field_names() -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(Config))


@functools.cache
def _specs() -> dict[str, _Spec]:
    hints = typing.get_type_hints(Config)
    specs: dict[str, _Spec] = {}
    for name in _field_names():
        hint = hints[name]
        args = typing.get_args(hint)
        optional = isinstance(hint, types.UnionType) and type(None) in args
        if optional:
            (hint,) = (a for a in args if a is not type(None))
        if typing.get_origin(hint) is tuple:
            specs[name] = _Spec(tuple, optional, typing.get_args(hint)[0])
        else:
            specs[name] = _Spec(hint, optional)
    return specs


def _check(name: str, value: object) -> Any:
    """Type-check and normalise one field's value, then apply its value rule."""
    spec = _specs()[name]
    if value is None:
        if spec.optional:
            return None
        raise ConfigError(f"key {name!r} expects {spec.describe()}, got None")
    value = _coerce(name, spec, value)
    rule = _RULES.get(name)
    if rule is not None:
        rule(name, value)
    return value


def _coerce(name: str, spec: _Spec, value: object) -> Any:
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


# -- sources --------------------------------------------------------------------------


def _unknown(key: str, valid: tuple[str, ...], *, env: bool = False) -> str:
    shown = [f"{ENV_PREFIX}{v.upper()}" for v in valid] if env else list(valid)
    asked = f"{ENV_PREFIX}{key.upper()}" if env else key
    close = difflib.get_close_matches(asked, shown, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    what = "SCOUT_* variable" if env else "key"
    return f"unknown {what} {asked!r}{hint}; valid: {', '.join(shown)}"


def _is_non_config_env(var: str) -> bool:
    return var in NON_CONFIG_ENV or var.startswith(NON_CONFIG_ENV_PREFIXES)


def _parse_env(name: str, text: str) -> object:
    spec = _specs()[name]
    stripped = text.strip()
    if spec.base is tuple:
        if not stripped:
            return ()
        assert spec.element is not None
        return tuple(
            _parse_scalar(name, spec.element, part.strip()) for part in stripped.split(",")
        )
    if spec.optional and stripped.lower() in {"", "none"}:
        return None
    return _parse_scalar(name, spec.base, stripped)


def _parse_scalar(name: str, kind: type, text: str) -> object:
    if kind is str:
        return text
    if kind is bool:
        lowered = text.lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise ConfigError(
            f"key {name!r} expects a bool: one of {', '.join(sorted(_TRUE | _FALSE))}; got {text!r}"
        )
    try:
        return int(text) if kind is int else float(text)
    except ValueError:
        raise ConfigError(f"key {name!r} expects {kind.__name__}, got {text!r}") from None


def _read_file(path: Path) -> Mapping[str, Any]:
    suffix = path.suffix.lower()
    if suffix not in {".toml", ".json"}:
        raise ConfigError(
            f"{path}: unsupported config file type {suffix or '(none)'!r}; use .toml or .json"
        )
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc.strerror or exc}") from None
    try:
        data: object = tomllib.loads(raw.decode("utf-8")) if suffix == ".toml" else json.loads(raw)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid {suffix[1:].upper()}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a table of config keys at the top level")
    if "scout" in data:
        section = data["scout"]
        if not isinstance(section, dict):
            raise ConfigError(f"{path}: 'scout' must be a table of config keys")
        return section
    return data
