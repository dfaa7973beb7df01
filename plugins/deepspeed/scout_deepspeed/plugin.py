"""Switching SCOUT on for a DeepSpeed engine: the plugin, the ``"scout"`` section, ``initialize``.

Contract: the switch is a top-level ``"scout"`` section of the DeepSpeed JSON (read from
``engine._config._param_dict``) with ``SCOUT_*`` overrides; ``scout.enable(engine)`` or the
drop-in :func:`initialize` acts on it, and :func:`initialize` checks a dict or JSON-file
section before the engine is built. :class:`DeepSpeedPlugin` states the DeepSpeed facts;
the core owns the rest. Docs: docs/deepspeed.md, "Switching it on".
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from scout_core import Config, ConfigError, Record, UnsupportedSetupError
from scout_core.plugin_api import FrameworkGate, FrameworkPlugin, Session

__all__ = [
    "SECTION",
    "SUPPORTED_DEEPSPEED",
    "DeepSpeedPlugin",
    "check_version",
    "config_for",
    "enable",
    "initialize",
    "plugin",
    "section_config",
    "session_of",
]

SECTION = "scout"

SUPPORTED_DEEPSPEED = ">=0.19,<0.20"
"""Every 0.19.x release; the one tested is 0.19.8."""


def _require_engine(obj: object) -> None:
    if not any(
        cls.__name__ == "DeepSpeedEngine" and (cls.__module__ or "").startswith("deepspeed.")
        for cls in type(obj).__mro__
    ):
        raise UnsupportedSetupError(
            f"scout-deepspeed attaches to the engine deepspeed.initialize returns, "
            f"got {type(obj).__module__}.{type(obj).__qualname__}"
        )


def _param_dict(engine: Any) -> Mapping[str, Any]:
    params = getattr(getattr(engine, "_config", None), "_param_dict", None)
    return params if isinstance(params, Mapping) else {}


class DeepSpeedPlugin(FrameworkPlugin):
    """The ``scout.plugins`` entry point ``deepspeed``: DeepSpeed facts only."""

    name: ClassVar[str] = "deepspeed"
    distribution: ClassVar[str] = "scout-deepspeed"
    framework: ClassVar[str] = "deepspeed"
    supported: ClassVar[str] = SUPPORTED_DEEPSPEED
    prefixes: ClassVar[tuple[str, ...]] = ("deepspeed.",)
    section_name: ClassVar[str] = 'DeepSpeed config "scout" section'
    gates_checkpoints: ClassVar[bool] = True

    def build_adapter(self, obj: Any, config: Config, *args: Any, **kwargs: Any) -> Any:
        _require_engine(obj)
        if args or kwargs:
            extra = [type(a).__name__ for a in args] + sorted(kwargs)
            raise UnsupportedSetupError(
                "scout.enable(engine) takes only the DeepSpeed engine (the optimizer and groups "
                f"are read from it); unexpected: {', '.join(extra)}"
            )
        from scout_deepspeed.adapter import DeepSpeedAdapter

        return DeepSpeedAdapter(obj, config)

    def config_section(self, obj: Any) -> Any:
        return _param_dict(obj).get(SECTION)

    def wire_checkpoints(self, obj: Any, gate: FrameworkGate) -> Callable[[], None]:
        from scout_deepspeed.gating import wire

        return wire(obj, gate)


plugin = DeepSpeedPlugin()


def check_version(version: str | None = None) -> str:
    """The installed (or given) DeepSpeed version if supported, else UnsupportedSetupError."""
    return plugin.check_version(version)


def section_config(section: object, *, source: str = DeepSpeedPlugin.section_name) -> Config:
    """Validate a ``"scout"`` section and apply ``SCOUT_*`` overrides; ConfigError names the key."""
    if not isinstance(section, Mapping):
        raise ConfigError(
            f"{source}: expected an object of SCOUT config keys, got {type(section).__name__}"
        )
    return Config.from_env(Config.from_mapping(section, source=source))


def config_for(engine: Any, config: Config | None = None) -> Config | None:
    """The config for ``engine``: ``config`` if given, else its ``"scout"`` section, else None."""
    if config is not None:
        return config
    section = plugin.config_section(engine)
    return None if section is None else section_config(section)


def session_of(engine: Any) -> Session | None:
    """The SCOUT session attached to ``engine`` (also a disabled one), or None."""
    return plugin.session_of(engine)


def enable(
    engine: Any, config: Config | None = None, *, callback: Callable[[Record], None] | None = None
) -> Session:
    """Attach SCOUT to a DeepSpeed engine on every rank after ``deepspeed.initialize`` (collective).
    Returns the attached session if any; a disabled one without an enabled ``"scout"`` section."""
    _require_engine(engine)
    return plugin.enable(engine, config=config, callback=callback)


def _precheck(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    """Validate the ``"scout"`` section of a dict or JSON-file config before the engine exists."""
    candidates = [kwargs.get("config"), kwargs.get("config_params")]
    ds_args = kwargs.get("args", args[0] if args else None)
    candidates.append(getattr(ds_args, "deepspeed_config", None))
    for given in candidates:
        cfg = given
        if isinstance(given, (str, os.PathLike)) and os.path.isfile(given):
            with open(given, encoding="utf-8") as fh:
                try:
                    cfg = json.load(fh)
                except json.JSONDecodeError:
                    continue  # DeepSpeed also reads HJSON/base64 configs: it will report
        if isinstance(cfg, Mapping) and SECTION in cfg:
            section_config(cfg[SECTION])
            return


def initialize(*args: Any, callback: Callable[[Record], None] | None = None, **kwargs: Any) -> Any:
    """Drop-in for ``deepspeed.initialize`` that also attaches SCOUT (see :func:`session_of`) when
    the config has an enabled ``"scout"`` section; ``callback`` receives every verdict record."""
    import deepspeed

    check_version()
    _precheck(args, kwargs)
    out = deepspeed.initialize(*args, **kwargs)
    enable(out[0], callback=callback)
    return out
