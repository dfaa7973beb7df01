"""SCOUT plugin for Megatron-Core (distribution ``scout-megatron``).

Three ways to switch SCOUT on: Megatron-Bridge's ``callbacks=scout_megatron.callbacks_from(cfg)``,
Megatron-LM's ``extra_args_provider=scout_megatron.add_args`` with :func:`attach`, or
:func:`attach` from a script that calls megatron-core directly. Checkpoints saved through
:func:`save_checkpoint` are certified by the checkpoint gate (:func:`load_checkpoint`,
:func:`recover`). Docs: docs/megatron.md.
"""

from __future__ import annotations

from typing import Any

from scout_megatron.args import add_args, config_from_args
from scout_megatron.checkpoint import MegatronCheckpointIO
from scout_megatron.gating import gate_of, load_checkpoint, recover, save_checkpoint
from scout_megatron.plugin import MegatronPlugin, attach, plugin, session_of
from scout_megatron.versions import SUPPORTED, check_version

__all__ = [
    "plugin",
    "attach",
    "session_of",
    "ScoutCallback",
    "callbacks_from",
    "add_args",
    "config_from_args",
    "MegatronCheckpointIO",
    "save_checkpoint",
    "load_checkpoint",
    "recover",
    "gate_of",
    "MegatronPlugin",
    "SUPPORTED",
    "check_version",
]

_LAZY = ("ScoutCallback", "callbacks_from")
"""Loaded on first use: defining ScoutCallback loads Bridge's callbacks module."""


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from scout_megatron import callback

        return getattr(callback, name)
    raise AttributeError(f"module 'scout_megatron' has no attribute {name!r}")
