"""Switching SCOUT on for a Megatron job: the plugin, :func:`attach`, :func:`session_of`.

Contract: :class:`MegatronPlugin` states the Megatron facts (which objects are Megatron's, the
installed version and probes, the adapter from chunks, ``MegatronOptimizer`` and rank ``order``,
``gates_checkpoints``); the core owns the version check, idempotence, config resolution and
the session registry. ``scout.enable`` does not recognise chunks wrapped in torch DDP:
:func:`attach` takes them. Nothing is patched; saves and loads reach the gate through
:mod:`scout_megatron.gating`. Docs: docs/megatron.md, "Switching it on".
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any, ClassVar

from scout_core import Config, Record, UnsupportedSetupError
from scout_core.plugin_api import FrameworkAdapter, FrameworkGate, FrameworkPlugin, Session
from scout_megatron import versions
from scout_megatron.layout import DEFAULT_ORDER

__all__ = ["MegatronPlugin", "attach", "plugin", "resolve", "session_of"]

ConfigLike = Config | str | os.PathLike[str] | argparse.Namespace | None
"""What :func:`attach` accepts as its config (see :func:`resolve`)."""


class MegatronPlugin(FrameworkPlugin):
    """The ``scout.plugins`` entry point ``megatron``: Megatron facts only."""

    name: ClassVar[str] = "megatron"
    distribution: ClassVar[str] = "scout-megatron"
    framework: ClassVar[str] = "megatron-core"
    supported: ClassVar[str] = versions.SUPPORTED
    prefixes: ClassVar[tuple[str, ...]] = ("megatron.",)
    section_name: ClassVar[str] = "Megatron SCOUT settings"
    gates_checkpoints: ClassVar[bool] = True

    def framework_version(self) -> str | None:
        """megatron-core's metadata, else a source checkout's ``package_info.py``."""
        try:
            return versions.installed_version()
        except UnsupportedSetupError:
            return None

    def key(self, obj: Any) -> object:
        """Sessions are keyed by the first model chunk (a list cannot be)."""
        if isinstance(obj, (list, tuple)) and obj:
            return obj[0]
        return obj

    def build_adapter(
        self,
        obj: Any,
        config: Config,
        *args: Any,
        order: str = DEFAULT_ORDER,
        **kwargs: Any,
    ) -> FrameworkAdapter:
        if len(args) != 1 or kwargs:
            extra = sorted(kwargs)
            raise UnsupportedSetupError(
                "scout.enable(model_chunks, optimizer) takes the Megatron model chunks and "
                "their MegatronOptimizer (and order=, Megatron's rank order); got "
                f"{len(args)} positional argument(s) after the chunks"
                + (f" and {', '.join(extra)}" if extra else "")
            )
        from scout_megatron.adapter import MegatronAdapter
        from scout_megatron.probes import require

        require()  # every megatron-core internal the plugin uses, before anything is hooked
        return MegatronAdapter(obj, args[0], config, order=order)

    def wire_checkpoints(self, obj: Any, gate: FrameworkGate) -> Callable[[], None]:
        """Nothing to patch: :mod:`scout_megatron.gating` routes saves and loads."""
        return _nothing


def _nothing() -> None:
    return None


plugin = MegatronPlugin()


def resolve(config: ConfigLike, environ: Any = None) -> Config | None:
    """An explicit config from what :func:`attach` was given, or None (the environment): a
    ``Config`` as is, a path via ``Config.from_file`` (then ``SCOUT_*`` overrides), or a
    Megatron-LM ``args`` namespace's ``--scout-*`` flags (None without any)."""
    if config is None or isinstance(config, Config):
        return config
    if isinstance(config, argparse.Namespace):
        from scout_megatron.args import config_from_args

        return config_from_args(config, environ)
    return Config.from_file(config, environ=environ)


def attach(
    model: Any,
    optimizer: Any,
    config: ConfigLike = None,
    *,
    order: str = DEFAULT_ORDER,
    callback: Callable[[Record], None] | None = None,
) -> Session:
    """Attach SCOUT to Megatron model chunks (or one, wrapped or not) and their
    ``MegatronOptimizer`` (or a torch optimizer); returns the session. For scripts that call
    megatron-core directly. Collective: call on every rank after ``initialize_model_parallel`` and
    the optimizer. ``config``: see :func:`resolve` (None: ``SCOUT_*`` variables decide, off by
    default); ``order``: Megatron's rank order (``"tp-cp-ep-pp-dp"`` under
    ``--use-tp-pp-dp-mapping``). Attaching twice returns the live session."""
    from scout_megatron.adapter import as_chunks

    chunks = as_chunks(model)
    return plugin.enable(chunks, optimizer, config=resolve(config), callback=callback, order=order)


def session_of(model: Any) -> Session | None:
    """The SCOUT session attached to these model chunks (also a disabled one), or None."""
    return plugin.session_of(model)
