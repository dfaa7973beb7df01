"""SCOUT as a Megatron-Bridge callback: :class:`ScoutCallback` and :func:`callbacks_from`.

The user's whole change is one argument::

    pretrain(cfg, forward_step, callbacks=scout_megatron.callbacks_from(cfg))

Contract: :func:`callbacks_from` gives ``[ScoutCallback(...)]`` when SCOUT is on (explicit config
or path, ``SCOUT_*`` variables, or the config's ``env_vars``), else ``[]``. The callback attaches
on ``on_train_start`` (collective), keeps Bridge's iteration and SCOUT's step comparable
(``offset``) and closes on ``on_train_end``. Events: docs/megatron.md, "Switching it on".
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

from scout_core import Config, Record, UnsupportedSetupError
from scout_core.plugin_api import Session
from scout_megatron.bridge import bridge_callbacks
from scout_megatron.layout import DEFAULT_ORDER
from scout_megatron.plugin import ConfigLike, attach, plugin, resolve

__all__ = ["ScoutCallback", "callbacks_from", "config_for"]

log = logging.getLogger(__name__)


def _callback_base() -> type:
    """Bridge's ``Callback`` (its own module when imported, else the installed file), or
    ``object`` without Bridge: ``CallbackManager.add`` registers by method either way."""
    try:
        base: type = bridge_callbacks().Callback
    except UnsupportedSetupError:
        return object
    return base


class ScoutCallback(_callback_base()):  # type: ignore[misc]  # Bridge's Callback, found at import
    """A Megatron-Bridge ``Callback`` that runs SCOUT on the job. ``config`` as for
    :func:`scout_megatron.attach` (None: the environment decides at ``on_train_start``);
    ``order`` is Megatron's rank order; ``callback`` receives every verdict record."""

    def __init__(
        self,
        config: ConfigLike = None,
        *,
        order: str = DEFAULT_ORDER,
        callback: Callable[[Record], None] | None = None,
    ) -> None:
        self.config = config
        self.order = order
        self.callback = callback
        self.session: Session | None = None
        self.iteration: int | None = None
        """Bridge's iteration in progress (``state.train_state.step`` at its start)."""
        self.offset = 0
        """Bridge's iteration minus SCOUT's step at the same boundary."""

    def on_train_start(self, context: Any) -> None:
        self.session = attach(
            context.model, context.optimizer, self.config, order=self.order, callback=self.callback
        )
        context.user_state["scout"] = self.session
        self.offset = _bridge_step(context) - self.session.step

    def on_train_step_start(self, context: Any) -> None:
        self.iteration = _bridge_step(context)
        if self.session is not None and self.session.enabled:
            self._check(self.iteration, "starts")

    def on_train_step_end(self, context: Any) -> None:
        if self.session is None or not self.session.enabled:
            return
        if context.skipped_iter:
            # No optimizer step: SCOUT's clock stays where it is, Bridge's moves on.
            self.offset += 1
            log.info(
                "Megatron skipped iteration %d without an optimizer step; SCOUT's step stays %d",
                _bridge_step(context),
                self.session.step,
            )
            return
        self._check(_bridge_step(context) + 1, "ended")

    def on_train_end(self, context: Any) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None

    def on_checkpoint_save(self, context: Any) -> None:
        """Record the checkpoint Bridge has just written (Bridge 0.5 on fire this)."""
        if self.session is None or not self.session.enabled:
            return
        from scout_megatron.checkpoint import MegatronCheckpointIO
        from scout_megatron.gating import record_save

        directory = context.state.cfg.checkpoint.save
        io = MegatronCheckpointIO(directory, context.model, context.optimizer)
        if not record_save(io, _bridge_step(context)):
            log.warning(
                "Bridge's checkpoint of iteration %d in %s is not certified by SCOUT",
                _bridge_step(context),
                directory,
            )

    def _check(self, iteration: int, when: str) -> None:
        """Log once when SCOUT's step and Bridge's iteration part (they should not)."""
        assert self.session is not None
        expected = iteration - self.offset
        if self.session.step != expected:
            log.warning(
                "Bridge's iteration %d %s at SCOUT step %d (expected %d); an optimizer "
                "step happened outside Bridge's loop",
                iteration,
                when,
                self.session.step,
                expected,
            )
            self.offset = iteration - self.session.step


def _bridge_step(context: Any) -> int:
    return int(context.state.train_state.step)


def config_for(config: Any = None) -> Config:
    """The SCOUT config :func:`callbacks_from` resolves (see the module doc)."""
    env_vars = getattr(config, "env_vars", None)
    if isinstance(env_vars, Mapping):
        for key, value in env_vars.items():
            if str(key).startswith("SCOUT_"):
                os.environ.setdefault(str(key), str(value))  # as Bridge applies env_vars
        return plugin.resolve_config(None, None)
    if config is not None and not isinstance(config, (Config, str, os.PathLike)):
        raise UnsupportedSetupError(
            "callbacks_from takes a scout_core.Config, a TOML/JSON path, a Bridge config with "
            f"env_vars, or None; got {type(config).__name__}"
        )
    return plugin.resolve_config(None, resolve(config))


def callbacks_from(
    config: Config | str | os.PathLike[str] | Any = None,
    *,
    order: str = DEFAULT_ORDER,
    callback: Callable[[Record], None] | None = None,
) -> list[Any]:
    """``[ScoutCallback]`` to pass as ``pretrain(..., callbacks=...)`` when SCOUT is on, else
    ``[]``. A bad config raises ``ConfigError`` here, before training starts."""
    resolved = config_for(config)
    if not resolved.enabled:
        return []
    return [ScoutCallback(resolved, order=order, callback=callback)]
