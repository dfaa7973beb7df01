"""SCOUT: symmetric consensus outlier detection for distributed LLM training.

The public API: everything outside ``__all__`` is private, but for ``scout_core.plugin_api``,
``scout_core.testing`` and ``scout_core.moe`` (docs/moe.md), each with its own ``__all__``::

    import scout_core as scout
    session = scout.enable(model, optimizer, config=scout.Config(report_dir="runs/scout"))
    ...            # the training loop, unchanged
    session.close()
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from scout_core.config import Config
from scout_core.decision.c3 import C3Result, Surface, exchange
from scout_core.errors import (
    CheckpointError,
    ConfigError,
    EvidenceError,
    PluginNotReadyError,
    ProtocolError,
    ScoutError,
    UnsupportedSetupError,
)
from scout_core.records.evidence import EvidenceWriter, Report, load_report
from scout_core.records.record import Record
from scout_core.topology.mesh import Axis, MeshAddress, MeshLayout
from scout_core.vocabulary import Failure, Mode, Scope, Status

if TYPE_CHECKING:
    from scout_core.checkpoint import attach_gate, restore_from_disk

__all__ = [
    "enable",
    "Config",
    "C3Result",
    "Surface",
    "exchange",
    "Record",
    "Report",
    "EvidenceWriter",
    "load_report",
    # the checkpoint gate (docs/checkpoint_gate.md), imported on first use
    "attach_gate",
    "restore_from_disk",
    "Axis",
    "MeshAddress",
    "MeshLayout",
    "Failure",
    "Mode",
    "Scope",
    "Status",
    "ScoutError",
    "ConfigError",
    "UnsupportedSetupError",
    "PluginNotReadyError",
    "EvidenceError",
    "ProtocolError",
    "CheckpointError",
]

__version__ = "0.1.0"

_LAZY = {"attach_gate", "restore_from_disk"}
"""Imported on first use: ``import scout_core`` stays light, and the gate's modules (which
import the session) load after this package."""


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from scout_core import checkpoint

        return getattr(checkpoint, name)
    raise AttributeError(f"module 'scout_core' has no attribute {name!r}")


def _resolve_config(config: Config | Mapping[str, Any] | str | os.PathLike[str]) -> Config:
    if isinstance(config, Config):
        return config
    if isinstance(config, Mapping):
        return Config.from_env(Config.from_mapping(config, source="scout.enable(config={...})"))
    if isinstance(config, str | os.PathLike):
        return Config.from_file(config)
    raise ConfigError(
        "scout.enable(config=...) takes a scout_core.Config, a mapping of its keys "
        "(e.g. {'replay_interval': 20}), or the path of a TOML/JSON file; got "
        f"{type(config).__name__}"
    )


def enable(
    obj: Any,
    optimizer: Any = None,
    *,
    config: Config | Mapping[str, Any] | str | os.PathLike[str] | None = None,
    callback: Callable[[Record], None] | None = None,
    **kwargs: Any,
) -> Any:
    """Attach SCOUT to a training job and return its session (collective; enabling the same
    object twice returns the live session). ``obj``: a plain ``torch.nn.Module`` (with
    ``optimizer``, one or a list, and optionally ``mesh=``) or a framework object an installed
    plugin handles. ``config``: a :class:`Config`, a mapping of its keys, a TOML/JSON path, or
    None (the framework's SCOUT section, ``SCOUT_CONFIG``, ``SCOUT_*`` variables, defaults).
    ``callback`` receives every verdict record. Bad configuration raises :class:`ConfigError`
    before anything is attached."""
    from scout_core.integration.registry import describe_unsupported, select_plugin

    cfg = None if config is None else _resolve_config(config)
    loaded = select_plugin(obj)
    if loaded is not None:
        args = () if optimizer is None else (optimizer,)
        return loaded.plugin.enable(obj, *args, config=cfg, callback=callback, **kwargs)
    import torch

    if isinstance(obj, torch.nn.Module):
        from scout_core.plugin.torch_plugin import check_optimizers, plugin

        check_optimizers(optimizer)
        return plugin.enable(obj, optimizer, config=cfg, callback=callback, **kwargs)
    raise describe_unsupported(obj)
