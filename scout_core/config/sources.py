"""Where SCOUT's configuration comes from: files, environment variables, mappings.

Contract: files (top level or one ``scout`` table), framework sections and ``SCOUT_<FIELD>``
variables (which override files) all pass the one per-field check (:mod:`.checks`). An
unknown key is an error with a "did you mean" hint; an unknown ``SCOUT_*`` variable only
warns (the prefix is not SCOUT's alone). Hostile input is a ``ConfigError`` naming the file.
"""

from __future__ import annotations

import difflib
import json
import logging
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from scout_core.config.checks import check, field_names, shown, specs
from scout_core.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on Python 3.10
    import tomli as tomllib

__all__ = [
    "ENV_PREFIX",
    "NON_CONFIG_ENV",
    "NON_CONFIG_ENV_PREFIXES",
    "env_overrides",
    "is_non_config_env",
    "parse_env",
    "read_file",
    "unknown",
    "values_from_mapping",
]

ENV_PREFIX = "SCOUT_"
"""Every environment override is ``SCOUT_<FIELD NAME IN UPPER CASE>``."""

NON_CONFIG_ENV: frozenset[str] = frozenset({"SCOUT_CONFIG"})
"""``SCOUT_*`` variables that are not field overrides (``SCOUT_CONFIG`` names a file)."""

NON_CONFIG_ENV_PREFIXES: tuple[str, ...] = ("SCOUT_TEST_", "SCOUT_INTERNAL_")
"""Prefixes reserved for the test harness and SCOUT's child processes, never read as config
(so a typo elsewhere cannot hide behind them)."""
log = logging.getLogger(__name__)
_warned: set[str] = set()
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def values_from_mapping(cls: type, mapping: Mapping[str, Any], *, source: str) -> dict[str, Any]:
    """Checked field values from ``mapping``; ConfigError names ``source`` and the key."""
    if not isinstance(mapping, Mapping):
        raise ConfigError(
            f"{source}: expected a table of config keys, got {type(mapping).__name__}"
        )
    valid = field_names(cls)
    values: dict[str, Any] = {}
    for key, value in mapping.items():
        if key not in valid:
            raise ConfigError(f"{source}: {unknown(str(key), valid)}")
        try:
            values[key] = check(cls, key, value)
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None
    return values


def env_overrides(cls: type, environ: Mapping[str, str]) -> dict[str, Any]:
    """Checked field values from the ``SCOUT_<FIELD>`` variables of ``environ``."""
    valid = field_names(cls)
    overrides: dict[str, Any] = {}
    for var in sorted(environ):
        if not var.startswith(ENV_PREFIX) or is_non_config_env(var):
            continue
        name = var[len(ENV_PREFIX) :].lower()
        if name not in valid:
            if var not in _warned:  # once per variable and process: from_env runs often
                _warned.add(var)
                log.warning(
                    "ignoring environment variable %s: %s",
                    var,
                    unknown(name, valid, env=True),
                )
            continue
        try:
            overrides[name] = check(cls, name, parse_env(cls, name, environ[var]))
        except ConfigError as exc:
            raise ConfigError(f"environment variable {var}={shown(environ[var])}: {exc}") from None
    return overrides


def unknown(key: str, valid: tuple[str, ...], *, env: bool = False) -> str:
    """The message for a key (or ``SCOUT_*`` variable) that is no field, with a hint."""
    names = [f"{ENV_PREFIX}{v.upper()}" for v in valid] if env else list(valid)
    asked = f"{ENV_PREFIX}{key.upper()}" if env else key
    close = difflib.get_close_matches(asked, names, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    what = "SCOUT_* variable" if env else "key"
    return f"unknown {what} {shown(asked)}{hint}; valid: {', '.join(names)}"


def is_non_config_env(var: str) -> bool:
    """Whether ``var`` is a ``SCOUT_*`` variable that is not a field override."""
    return var in NON_CONFIG_ENV or var.startswith(NON_CONFIG_ENV_PREFIXES)


def parse_env(cls: type, name: str, text: str) -> object:
    """The value of field ``name`` of ``cls`` that the environment text ``text`` stands for."""
    spec = specs(cls)[name]
    stripped = text.strip()
    if spec.base is tuple:
        if not stripped:
            return ()
        assert spec.element is not None
        return tuple(parse_scalar(name, spec.element, part.strip()) for part in stripped.split(","))
    if spec.optional and stripped.lower() in {"", "none"}:
        return None
    return parse_scalar(name, spec.base, stripped)


def parse_scalar(name: str, kind: type, text: str) -> object:
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
        return int(text) if kind is int else float(text)  # nan and inf: the range check
    except ValueError:  # not a number, or an int of more digits than Python converts
        raise ConfigError(f"key {name!r} expects {kind.__name__}, got {shown(text)}") from None


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not a number a config may hold")


def read_file(path: Path) -> Mapping[str, Any]:
    """The config table of a ``.toml`` / ``.json`` file (its ``scout`` table when it has one)."""
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
        data: object = (
            tomllib.loads(raw.decode("utf-8"))
            if suffix == ".toml"
            else json.loads(raw, parse_constant=_no_constant)
        )
    except RecursionError:
        raise ConfigError(f"{path}: not valid {suffix[1:].upper()}: nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:  # JSON/TOML decode errors, 5000-digit ints
        raise ConfigError(f"{path}: not valid {suffix[1:].upper()}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a table of config keys at the top level")
    if "scout" in data:
        section = data["scout"]
        if not isinstance(section, dict):
            raise ConfigError(f"{path}: 'scout' must be a table of config keys")
        return section
    return data
