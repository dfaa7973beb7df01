"""A SCOUT session on a plain-PyTorch job, and ``enable_torch`` that starts one.

``enable_torch(model, optimizer, config)`` wires replay into a training loop that
stays exactly as the user wrote it. Everything attaches through public hooks:
module forward hooks capture the sampled layer's call, a step pre-hook snapshots
the optimizer slice, and a step post-hook is the *replay boundary* where due
recipes run. Verdicts go to the evidence files, to ``session.verdicts`` and to the
user's callback.

Every rank must call ``enable_torch`` at the same point (it creates SCOUT's
diagnostic Gloo groups, a collective). Calling it twice on the same model returns
the live session. ``close`` removes every hook and runs the closers other parts of
SCOUT registered (the observer, the checkpoint gate); it is idempotent.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import nn

from scout_core.checkpoint.attach import GateHandle, attach_gate, gate_catalog, model_of
from scout_core.config import Config
from scout_core.errors import UnsupportedSetupError
from scout_core.integration.adapter import FrameworkAdapter
from scout_core.integration.discovery import discover, unwrap
from scout_core.integration.torch_adapter import TorchAdapter
from scout_core.observer import ObserverHandle, checkpoint_stage, watch_dataloader
from scout_core.observer.attach import attach_observer
from scout_core.records.evidence import EvidenceWriter, Record
from scout_core.replay.driver import ReplayDriver
from scout_core.replay.runner import RoundOutcome
from scout_core.topology.mesh import MeshLayout
from scout_core.vocabulary import Failure

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from scout_core.checkpoint.recovery import Restored

__all__ = ["Session", "enable_adapter", "enable_torch"]

log = logging.getLogger("scout")
T = TypeVar("T")

_live: weakref.WeakKeyDictionary[Any, Session] = weakref.WeakKeyDictionary()


class Session:
    """What ``enable`` returns: owns SCOUT's hooks on one job until :meth:`close`."""

    def __init__(self, config: Config, *, callback: Callable[[Record], None] | None = None) -> None:
        self.config = config
        self.callback = callback
        self.verdicts: list[Record] = []
        """Every verdict this rank learned of (agreeing rounds are not recorded)."""
        self.rounds: list[RoundOutcome] = []
        """Every recipe round this rank took part in, agreeing ones included."""
        self.step = 0
        """The current iteration (0-based): completed optimizer steps."""
        self.adapter: FrameworkAdapter | None = None
        """The framework adapter (None when SCOUT is disabled)."""
        self.replay: ReplayDriver | None = None
        """The replay driver (None when SCOUT is disabled)."""
        self.observer: ObserverHandle | None = None
        """This rank's hang observer (None when ``Config.observer`` is off)."""
        self.gate: GateHandle | None = None
        """The checkpoint gate (None when ``Config.gate`` is off or nothing can be gated)."""
        self._lock = threading.Lock()
        self._closers: list[Callable[[], None]] = []
        self._closed = False

    # -- lifecycle -----------------------------------------------------------------------

    def add_closer(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on :meth:`close` (last added, first run)."""
        self._closers.append(fn)

    def close(self) -> None:
        """Detach everything; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        while self._closers:
            fn = self._closers.pop()
            try:
                fn()
            except Exception as exc:  # one failing closer must not keep the others open
                log.warning("scout: error while closing: %s", exc)

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- what users call during training --------------------------------------------------

    def watch_dataloader(self, loader: Iterable[T]) -> Iterable[T]:
        """Wrap a DataLoader (any iterable) so the observer sees each batch fetch.

        A rank still fetching after its peers moved on gets an ``input_stall``
        verdict. Returns ``loader`` unchanged when the observer is off.
        """
        if self.observer is None:
            return loader
        return watch_dataloader(loader, self.observer.publisher)

    def checkpoint_stage(self, kind: str = "write") -> AbstractContextManager[None]:
        """Context around a checkpoint write (or ``kind="read"``) for the observer.

        A rank still inside it after its peers moved on gets a ``checkpoint_stall``.
        """
        if self.observer is None:
            return contextlib.nullcontext()
        return checkpoint_stage(self.observer.publisher, kind)

    def recover(
        self, failure: Failure | str | None, *, machines_accessible: bool = True
    ) -> Restored:
        """Restore the checkpoint the gate trusts after ``failure`` (collective).

        SDC or an unreachable machine restores *verified*, a straggler *latest*; any
        other failure first replays the whole recipe catalog (paper Algorithm 3).
        Returns what was restored (step, role, reason); writes a checkpoint record.
        """
        if self.gate is None:
            raise UnsupportedSetupError(
                "session.recover needs the checkpoint gate: it is off (Config.gate) or the "
                f"{self.adapter.name if self.adapter else 'disabled'} session has nothing to gate"
            )
        found = None if failure is None else Failure(failure)
        return self.gate.recover(found, machines_accessible=machines_accessible)

    def emit(self, record: Record, writer: EvidenceWriter | None) -> None:
        """Deliver one verdict: evidence file (group's lowest rank), list, callback.

        The observer delivers its verdicts from a listener thread, hence the lock.
        """
        with self._lock:
            self._emit(record, writer)

    def _emit(self, record: Record, writer: EvidenceWriter | None) -> None:
        self.verdicts.append(record)
        if writer is not None and (not record.group or writer.rank in record.group):
            # A group's record is written once, by its lowest rank; a record about
            # another group (a slow shard group seen from a replica group) is written
            # by that group's members.
            writer.write_group(record) if record.group else writer.write(record)
        if self.callback is not None:
            self.callback(record)


def _forget(key: object) -> None:
    _live.pop(key, None)


def enable_adapter(
    adapter: FrameworkAdapter,
    config: Config,
    *,
    callback: Callable[[Record], None] | None = None,
    key: object | None = None,
) -> Session:
    """Start a session on any :class:`~scout_core.integration.adapter.FrameworkAdapter`.

    Plugins call this after building their adapter; :func:`enable_torch` is the
    plain-PyTorch caller. Collective over the job. ``key`` (the user's model or
    engine) makes enabling twice return the live session instead of attaching twice.
    """
    if key is not None:
        existing = _live.get(key)
        if existing is not None and not existing.closed:
            adapter.close()
            return existing
    session = Session(config, callback=callback)
    if not config.enabled:
        adapter.close()
        return session
    writer = EvidenceWriter(config.report_dir, adapter.rank(), run_id=config.resolved_run_id())
    replay = ReplayDriver(session, adapter, config, writer)
    session.adapter = adapter
    session.replay = replay
    session.add_closer(writer.close)
    session.add_closer(replay.close)
    if config.gate and gate_catalog(replay):
        if getattr(adapter, "gates_checkpoints", False):
            # The plugin certifies the framework's own checkpoints (DeepSpeed wraps the
            # engine's save/load_checkpoint) instead of keeping in-memory copies.
            log.info("scout: the %s plugin gates its own checkpoints", adapter.name)
        elif model_of(adapter) is None:
            log.warning(
                "scout: the %s adapter exposes no model, so the checkpoint gate is off",
                adapter.name,
            )
        else:
            session.gate = attach_gate(session, replay, writer=writer)
    if config.observer:
        session.observer = attach_observer(
            adapter,
            config,
            on_verdict=lambda record: session.emit(record, None),
            add_closer=session.add_closer,
        )
    if key is not None:
        _live[key] = session
        session.add_closer(lambda: _forget(key))
    return session


def enable_torch(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    config: Config | None = None,
    *,
    callback: Callable[[Record], None] | None = None,
    mesh: DeviceMesh | MeshLayout | None = None,
) -> Session:
    """Attach SCOUT to a plain-PyTorch job (DDP, FSDP2, HSDP, DeviceMesh layouts).

    Collective over the job: every rank calls it at the same point. Raises
    :class:`~scout_core.errors.ConfigError` for a configured module path that does
    not exist and :class:`~scout_core.errors.UnsupportedSetupError` for a setup it
    cannot watch, before attaching anything.
    """
    config = Config() if config is None else config
    root = unwrap(model)
    existing = _live.get(root)
    if existing is not None and not existing.closed:
        return existing
    if not config.enabled:
        return Session(config, callback=callback)
    found = discover(root, layers=config.layers, embedding=config.embedding, lm_head=config.lm_head)
    adapter = TorchAdapter(model, optimizer, found, mesh=mesh)
    return enable_adapter(adapter, config, callback=callback, key=root)
