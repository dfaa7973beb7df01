"""SCOUT's settings as Megatron-LM command-line flags.

Contract: :func:`add_args` (Megatron-LM's ``extra_args_provider``) adds ``--scout-config PATH``
and ``--scout-<key>`` per ``Config`` field, values as in ``SCOUT_<KEY>``; absent flags stay out of
the namespace. :func:`section_from_args` types and validates them; :func:`config_from_args`
applies the precedence (defaults, file, flags, ``SCOUT_*``); any SCOUT flag switches SCOUT on.
Docs: docs/megatron.md, "Switching it on".
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from scout_core import Config, ConfigError

__all__ = ["FLAG_PREFIX", "add_args", "config_from_args", "flag_of", "section_from_args"]

FLAG_PREFIX = "--scout-"
_DEST_PREFIX = "scout_"
_CONFIG_DEST = "scout_config"


def flag_of(key: str) -> str:
    """The command-line flag of a config key: ``replay_interval`` -> ``--scout-replay-interval``."""
    return FLAG_PREFIX + key.replace("_", "-")


def _is_bool(field: dataclasses.Field[Any]) -> bool:
    return isinstance(field.default, bool)


def add_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Megatron-LM's ``extra_args_provider``: add ``--scout-config`` and ``--scout-<key>`` flags."""
    group = parser.add_argument_group(
        "SCOUT", "SCOUT failure localization (see docs/configuration.md for every key)"
    )
    group.add_argument(
        f"{FLAG_PREFIX}config",
        dest=_CONFIG_DEST,
        metavar="PATH",
        default=argparse.SUPPRESS,
        help="TOML or JSON file of SCOUT keys; --scout-<key> flags override it",
    )
    for field in dataclasses.fields(Config):
        extra: dict[str, Any] = {"nargs": "?", "const": "true"} if _is_bool(field) else {}
        group.add_argument(
            flag_of(field.name),
            dest=_DEST_PREFIX + field.name,
            metavar="VALUE",
            default=argparse.SUPPRESS,
            help=f"SCOUT key {field.name!r} (text as in SCOUT_{field.name.upper()})",
            **extra,
        )
    return parser


def _typed(key: str, text: str) -> Any:
    """``text`` parsed and checked as config key ``key`` (the core's env-var parsing)."""
    variable = f"SCOUT_{key.upper()}"
    try:
        parsed = Config.from_env(Config(), environ={variable: text})
    except ConfigError as exc:
        message = str(exc).replace(f"environment variable {variable}={text!r}: ", "")
        raise ConfigError(f"{flag_of(key)} {text!r}: {message}") from None
    return getattr(parsed, key)


def section_from_args(args: argparse.Namespace) -> dict[str, Any] | None:
    """The SCOUT section the flags give (file values, then flags), or None without any; a bad
    value raises ``ConfigError`` naming the flag or the file key."""
    given = vars(args)
    flags = {
        field.name: given[_DEST_PREFIX + field.name]
        for field in dataclasses.fields(Config)
        if _DEST_PREFIX + field.name in given
    }
    path = given.get(_CONFIG_DEST)
    if path is None and not flags:
        return None
    section: dict[str, Any] = {}
    if path is not None:
        section.update(Config.from_file(path, environ={}).to_dict())
    for key, text in flags.items():
        section[key] = _typed(key, str(text))
    return section


def config_from_args(
    args: argparse.Namespace, environ: Mapping[str, str] | None = None
) -> Config | None:
    """The ``Config`` the ``--scout-*`` flags give (then ``SCOUT_*`` overrides), or None when no
    SCOUT flag was given: the environment then decides (``SCOUT_CONFIG``, ``SCOUT_ENABLED``; off
    by default), as for a framework without a SCOUT section."""
    env = os.environ if environ is None else environ
    section = section_from_args(args)
    if section is None:
        return None
    base = Config.from_mapping(section, source="Megatron-LM --scout-* flags")
    return Config.from_env(base, environ=env)
