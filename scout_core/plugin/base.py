"""The framework plugin base class: the lifecycle every plugin shares, written once.

Contract: :class:`FrameworkPlugin` owns everything about switching SCOUT on that does not
depend on the framework (version check, config, the collective, idempotent ``enable``);
a plugin writes only framework facts. Docs: docs/plugins.md, "The plugin class".
"""

from __future__ import annotations

import logging
import os
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import torch.distributed as dist

from scout_core.checkpoint.framework_gate import FrameworkGate
from scout_core.checkpoint.io import CheckpointIO, Recovered
from scout_core.config import Config
from scout_core.decision.agreement import any_flag
from scout_core.errors import ConfigError, UnsupportedSetupError
from scout_core.integration.adapter import FrameworkAdapter
from scout_core.integration.pending import object_from
from scout_core.integration.versions import check_version, installed_version
from scout_core.records.record import Record
from scout_core.session import Session, compose
from scout_core.topology.groups import diagnostic_group
from scout_core.vocabulary import Failure

__all__ = ["FrameworkPlugin", "agree_or_raise", "gate_of", "recover", "shadow_methods"]

log = logging.getLogger(__name__)


class FrameworkPlugin(ABC):
    """Base of every framework plugin (see the module doc); one instance per plugin."""

    name: ClassVar[str]
    """Entry-point name, e.g. ``"megatron"``."""
    distribution: ClassVar[str]
    """The plugin's distribution, e.g. ``"scout-megatron"``."""
    framework: ClassVar[str]
    """The framework distribution whose version is checked, e.g. ``"megatron-core"``."""
    supported: ClassVar[str]
    """The framework versions this plugin supports, e.g. ``">=0.16,<0.17"``."""
    prefixes: ClassVar[tuple[str, ...]]
    """Module prefixes of the objects it handles, e.g. ``("megatron.",)``."""
    section_name: ClassVar[str]
    """How config errors name the framework's SCOUT section."""
    gates_checkpoints: ClassVar[bool] = False
    """True when the plugin routes the framework's own checkpoint saves and loads through
    the core's :class:`FrameworkGate` (the core then keeps no in-memory gate copies)."""
    enabled_by_default: ClassVar[bool] = False
    """Whether SCOUT is on when nothing configures it (the explicit plain-PyTorch
    ``scout.enable(model, optimizer)`` call is itself the request)."""

    def __init__(self) -> None:
        self._sessions: weakref.WeakKeyDictionary[Any, Session] = weakref.WeakKeyDictionary()
        self._by_id: dict[int, Session] = {}  # for keys that cannot be weakly referenced
        self._gates: weakref.WeakKeyDictionary[Session, FrameworkGate] = weakref.WeakKeyDictionary()
        self._adapters: weakref.WeakKeyDictionary[Session, FrameworkAdapter] = (
            weakref.WeakKeyDictionary()
        )
        _PLUGINS.add(self)

    # -- what a plugin writes ------------------------------------------------------------

    @abstractmethod
    def build_adapter(
        self, obj: Any, config: Config, *args: Any, **kwargs: Any
    ) -> FrameworkAdapter:
        """The adapter for ``obj`` (framework facts); raise ``UnsupportedSetupError`` with a
        clear message for objects or setups the plugin cannot watch. Collective."""

    def config_section(self, obj: Any) -> Mapping[str, Any] | None:
        """The SCOUT section of the framework's own config for ``obj``, if any."""
        return None

    def framework_version(self) -> str | None:
        """The installed framework's version (default: ``framework``'s metadata), or None;
        overridden where the framework imports without metadata (a Megatron-LM checkout)."""
        return installed_version(self.framework)

    def key(self, obj: Any) -> object:
        """What sessions are keyed by (enabling the same key twice returns the live one)."""
        return obj

    def wire_checkpoints(self, obj: Any, gate: FrameworkGate) -> Callable[[], None]:
        """Route the framework's checkpoint saves through ``gate.save(io, tag)`` and loads
        through ``gate.load(io, tag)``; return the undo. Only with ``gates_checkpoints``."""
        raise NotImplementedError(
            f"the {self.name} plugin sets gates_checkpoints but does not wire_checkpoints"
        )

    # -- what the base owns --------------------------------------------------------------

    def handles(self, obj: object) -> bool:
        """Whether ``obj`` (or a list of chunks' first item) comes from the framework."""
        return object_from(obj, self.prefixes)

    def check_version(self, version: str | None = None) -> str:
        """The installed (or given) framework version, if supported; else
        :class:`~scout_core.errors.UnsupportedSetupError` naming both."""
        found = self.framework_version() if version is None else version
        return check_version(
            self.framework, self.supported, plugin=self.distribution, version=found
        )

    def gate_of(self, obj: Any) -> FrameworkGate | None:
        """The gate of the framework's own checkpoints on ``obj``'s open session, or None."""
        session = self.session_of(obj)
        return None if session is None else self._gates.get(session)

    def adapter_of(self, obj: Any) -> FrameworkAdapter | None:
        """The adapter this plugin built for ``obj``'s open session, or None."""
        session = self.session_of(obj)
        return None if session is None else self._adapters.get(session)

    def session_of(self, obj: Any) -> Session | None:
        """The session enabled on ``obj`` (also a disabled one) while it is open, or None."""
        key = self.key(obj)
        try:
            found = self._sessions.get(key)
        except TypeError:
            found = self._by_id.get(id(key))
        return None if found is None or found.closed else found

    def _register(self, obj: Any, session: Session) -> None:
        key = self.key(obj)
        try:
            self._sessions[key] = session
        except TypeError:  # a list of model chunks: neither hashable nor weakly referable
            self._by_id[id(key)] = session

        def forget() -> None:
            try:
                self._sessions.pop(key, None)
            except TypeError:
                self._by_id.pop(id(key), None)

        session.add_closer(forget)

    def resolve_config(self, obj: Any, config: Config | None) -> Config:
        """The config for ``obj`` (order: docs/plugins.md, "What the base owns"); a bad section
        raises :class:`ConfigError` naming the key."""
        if config is not None:
            return config
        section = self.config_section(obj)
        if section is not None:
            if not isinstance(section, Mapping):
                raise ConfigError(
                    f"{self.section_name}: expected an object of SCOUT config keys, "
                    f"got {type(section).__name__}"
                )
            return Config.from_env(Config.from_mapping(section, source=self.section_name))
        path = os.environ.get("SCOUT_CONFIG")
        if path:
            return Config.from_file(Path(path))
        return Config.from_env(Config(enabled=self.enabled_by_default))

    def enable(
        self,
        obj: Any,
        *args: Any,
        config: Config | None = None,
        callback: Callable[[Record], None] | None = None,
        **kwargs: Any,
    ) -> Session:
        """Attach SCOUT to ``obj`` and return its session. Collective over the job."""
        self.check_version()
        live = self.session_of(obj)
        if live is not None and live.enabled:
            return live
        cfg = self.resolve_config(obj, config)
        if not cfg.enabled:
            if live is not None:
                return live
            log.info("not attached to %s (SCOUT is disabled)", type(obj).__name__)
            session = Session(cfg, callback=callback)
            self._register(obj, session)
            return session
        adapter = self.build_adapter(obj, cfg, *args, **kwargs)
        wired: list[FrameworkGate] = []

        def wire(gate: FrameworkGate) -> Callable[[], None]:
            wired.append(gate)
            return self.wire_checkpoints(obj, gate)

        gated = wire if self.gates_checkpoints else None
        session = compose(adapter, cfg, callback=callback, wire_checkpoints=gated)
        if wired:
            self._gates[session] = wired[0]
        if session.enabled:
            self._adapters[session] = adapter
        self._register(obj, session)
        return session


_PLUGINS: weakref.WeakSet[FrameworkPlugin] = weakref.WeakSet()


def gate_of(obj: Any) -> FrameworkGate | None:
    """The gate of the framework's own checkpoints on the open session of ``obj`` (an
    engine, model chunks, a trainer), whichever plugin enabled it; or None."""
    for plugin in list(_PLUGINS):
        gate = plugin.gate_of(obj)
        if gate is not None:
            return gate
    return None


def recover(obj: Any, failure: Failure | str | None, io: CheckpointIO, *, what: str) -> Recovered:
    """Load the checkpoint the gate on ``obj`` trusts after ``failure``, through ``io``.
    Collective; writes a retrieve record; :class:`UnsupportedSetupError` if there is no gate."""
    gate = gate_of(obj)
    if gate is None:
        raise UnsupportedSetupError(
            f"recover needs SCOUT's checkpoint gate on this {what} (SCOUT enabled with "
            "replay and the gate on, the framework's checkpointing on)"
        )
    gate.target(io)
    return gate.recover(failure)


def shadow_methods(obj: Any, **methods: Callable[..., Any]) -> Callable[[], None]:
    """Shadow ``obj``'s methods with instance attributes (the class stays untouched; ``nn.Module``
    keeps plain callables in ``__dict__``); the undo removes each one still set here."""
    for name, fn in methods.items():
        setattr(obj, name, fn)

    def undo() -> None:
        for name, fn in methods.items():
            if vars(obj).get(name) is fn:
                delattr(obj, name)

    return undo


@contextmanager
def swapped_attributes(
    changes: Iterable[tuple[Any, str, Any]], *, keep: Iterable[tuple[Any, str]] = ()
) -> Iterator[None]:
    """Inside: each ``(obj, name, value)`` of ``changes`` is set in ``obj.__dict__`` (a
    process group swapped for SCOUT's during a replayed call, say), and each ``(obj, name)``
    of ``keep`` that ``obj.__dict__`` holds is saved as it is (state the call overwrites).
    On exit, also on error, everything is put back in reverse order. ``changes`` is read
    inside the block, so a generator that fails still restores what it had set."""
    saved: list[tuple[Any, str, Any]] = []
    try:
        for obj, name in keep:
            if name in obj.__dict__:
                saved.append((obj, name, obj.__dict__[name]))
        for obj, name, value in changes:
            saved.append((obj, name, obj.__dict__[name]))
            obj.__dict__[name] = value
        yield
    finally:
        for obj, name, value in reversed(saved):
            obj.__dict__[name] = value


def agree_or_raise(problem: str | None, *, plugin: str, what: str) -> None:
    """Raise :class:`~scout_core.errors.UnsupportedSetupError` on every rank if any rank found
    ``problem`` (one flag on a SCOUT group), so no rank goes on alone into a collective the
    others left. Collective (local in a job of one)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        found = any_flag(problem is not None, diagnostic_group(range(dist.get_world_size())))
    else:
        found = problem is not None
    if problem is not None:
        raise UnsupportedSetupError(f"{plugin}: {problem}")
    if found:
        raise UnsupportedSetupError(f"{plugin}: another rank found that {what} (see its error)")
