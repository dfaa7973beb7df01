"""Switching SCOUT on for a DeepSpeed engine: the ``"scout"`` section, ``enable``, ``initialize``.

DeepSpeed's JSON config tolerates unknown *top-level* keys (its nested sections are
pydantic models that reject them), and keeps the parsed dict as
``engine._config._param_dict``. So the user's whole switch is one section::

    {"train_batch_size": 16, ..., "scout": {"report_dir": "runs/scout", "replay_interval": 20}}

with the same keys as :class:`scout_core.Config`; ``SCOUT_*`` environment variables
override them. Two ways to act on it:

* ``scout.enable(engine)`` after ``deepspeed.initialize`` (through the entry point);
* ``scout_deepspeed.initialize(...)``, a drop-in for ``deepspeed.initialize`` that
  returns the same tuple and attaches SCOUT to the engine when the section asks.

No section, or ``"enabled": false``, attaches nothing. A bad section (unknown key,
wrong type, negative interval) raises :class:`~scout_core.errors.ConfigError`
naming the key; ``initialize`` checks a dict or JSON-file config *before* the
expensive engine construction. The session stays reachable through
:func:`session_of`; enabling twice returns the live session. With replay and
``"gate"`` on, the engine's checkpoints are gated too (:mod:`scout_deepspeed.gating`).
"""

from __future__ import annotations

import json
import logging
import os
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from scout_core.config import Config
from scout_core.errors import ConfigError, UnsupportedSetupError
from scout_core.integration.pending import object_from
from scout_core.records.evidence import Record
from scout_core.session import Session, enable_adapter
from scout_deepspeed.versions import check_version

__all__ = [
    "SECTION",
    "DeepSpeedPlugin",
    "config_for",
    "enable",
    "initialize",
    "plugin",
    "section_config",
    "session_of",
]

log = logging.getLogger("scout.deepspeed")

SECTION = "scout"
"""The top-level key of the DeepSpeed JSON config that holds SCOUT's settings."""

_sessions: weakref.WeakKeyDictionary[Any, Session] = weakref.WeakKeyDictionary()


def _is_engine(obj: object) -> bool:
    return any(
        cls.__name__ == "DeepSpeedEngine" and (cls.__module__ or "").startswith("deepspeed.")
        for cls in type(obj).__mro__
    )


def section_config(section: object, *, source: str = 'DeepSpeed config "scout" section') -> Config:
    """Validate a ``"scout"`` section and apply ``SCOUT_*`` overrides; ConfigError names the key."""
    if not isinstance(section, Mapping):
        raise ConfigError(
            f"{source}: expected an object of SCOUT config keys, got {type(section).__name__}"
        )
    return Config.from_env(Config.from_mapping(section, source=source))


def _param_dict(engine: Any) -> Mapping[str, Any]:
    params = getattr(getattr(engine, "_config", None), "_param_dict", None)
    return params if isinstance(params, Mapping) else {}


def config_for(engine: Any, config: Config | None = None) -> Config | None:
    """The config for ``engine``: ``config`` if given, else its ``"scout"`` section, else None."""
    if config is not None:
        return config
    section = _param_dict(engine).get(SECTION)
    return None if section is None else section_config(section)


def session_of(engine: Any) -> Session | None:
    """The SCOUT session attached to ``engine`` (also a disabled one), or None."""
    return _sessions.get(engine)


def enable(
    engine: Any,
    config: Config | None = None,
    *,
    callback: Callable[[Record], None] | None = None,
) -> Session:
    """Attach SCOUT to a ``DeepSpeedEngine`` / ``PipelineEngine``; collective over the job.

    Call on every rank after ``deepspeed.initialize``. Returns the live session when
    one is attached already, and a disabled session (nothing attached) when there
    is no ``"scout"`` section or it says ``"enabled": false``.
    """
    if not _is_engine(engine):
        raise UnsupportedSetupError(
            f"scout-deepspeed attaches to the engine deepspeed.initialize returns, "
            f"got {type(engine).__module__}.{type(engine).__qualname__}"
        )
    check_version()
    existing = _sessions.get(engine)
    if existing is not None and not existing.closed:
        return existing
    cfg = config_for(engine, config)
    if cfg is None or not cfg.enabled:
        why = 'no "scout" section' if cfg is None else '"enabled": false'
        log.info("scout: not attached to the DeepSpeed engine (%s)", why)
        session = Session(cfg if cfg is not None else Config(enabled=False), callback=callback)
        _sessions[engine] = session
        return session
    from scout_deepspeed.adapter import DeepSpeedAdapter
    from scout_deepspeed.gating import attach_checkpoint_gate

    adapter = DeepSpeedAdapter(engine, cfg)
    session = enable_adapter(adapter, cfg, callback=callback, key=engine)
    # The core's in-memory gate needs a model on the adapter; DeepSpeed's checkpoints
    # are the engine's own tags, gated through save_checkpoint / load_checkpoint.
    attach_checkpoint_gate(engine, session)
    _sessions[engine] = session
    return session


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
    """Drop-in for ``deepspeed.initialize``: same arguments, same return value.

    Also attaches SCOUT to the engine when its config has an enabled ``"scout"``
    section; the session is :func:`session_of` ``(engine)``. ``callback`` (the one
    extra keyword) receives every verdict record.
    """
    import deepspeed

    check_version()
    _precheck(args, kwargs)
    out = deepspeed.initialize(*args, **kwargs)
    enable(out[0], callback=callback)
    return out


class DeepSpeedPlugin:
    """The ``scout.plugins`` entry point: ``scout.enable(engine)`` reaches :func:`enable`."""

    name = "deepspeed"

    def handles(self, obj: object) -> bool:
        """Claims objects from the ``deepspeed`` package (engines; others get a clear error)."""
        return object_from(obj, ("deepspeed.",))

    def enable(
        self,
        obj: object,
        *args: Any,
        config: Config | None,
        callback: Callable[[Record], None] | None,
        **kwargs: Any,
    ) -> Session:
        if args or kwargs:
            extra = [type(a).__name__ for a in args] + sorted(kwargs)
            raise UnsupportedSetupError(
                "scout.enable(engine) takes only the DeepSpeed engine (the optimizer and groups "
                f"are read from it); unexpected: {', '.join(extra)}"
            )
        return enable(obj, config, callback=callback)


plugin = DeepSpeedPlugin()
"""The object registered under the ``scout.plugins`` entry point ``deepspeed``."""
