"""Wiring the checkpoint gate to a live replay session: :func:`attach_gate`.

The gate (:mod:`scout_core.decision.gate`) and the checkpoint coordinator
(:mod:`.coordinator`) know nothing about replay; the replay driver
(:mod:`scout_core.replay.driver`) knows nothing about checkpoints. This module
connects them from the outside, through the same public seam replay itself uses:
an optimizer step post-hook registered *after* the driver's, so it fires at the
replay boundary right after the driver has appended this step's recipe rounds to
``session.rounds``. Per boundary it

1. takes the rounds of the recipes due at this step and maps each to a gate
   outcome (:func:`round_outcome`): not ready → inconclusive; an attributed *exact*
   surface → SDC; an inconclusive exact surface → inconclusive; otherwise clean
   (timing-only attribution is a straggler, which is clean for the gate). A due
   recipe without a round on this rank is *missing*;
2. maps each due recipe to its index in the gate's catalog by ``(kind, path)``
   (the optimizer recipe's own ``index`` is a slice number, not a catalog entry);
3. calls :meth:`~.coordinator.CheckpointCoordinator.on_boundary` with the worst
   outcome, on every rank, at every boundary where a catalog recipe was due.

[The gate's catalog]
It is the replay schedule's catalog minus the recipes this job can never run: the
optimizer recipe needs replicated optimizer state, so under pure FSDP it is left
out (otherwise no cycle could ever close). ``Config.catalog_size`` overrides ``K``;
the catalog is then folded onto ``K`` slots (index modulo ``K``), so ``K = 1``
means any accepted check closes a cycle, the explicit "one check covers all state"
configuration. A ``K`` larger than the catalog is refused: no cycle could close.

[After a retrieval]
An SDC at a boundary makes the gate select a generation; from then on the handle
feeds no boundary to the gate (nothing captured after the fault is trusted) until
:meth:`GateHandle.recover` restores a generation. Every rank reaches that state at
the same boundary, because the decision is job-wide.

[The full-catalog sweep]
Retrieval after a failure that is neither SDC nor slowness (a hang, a protocol
mismatch) runs every catalog recipe *now* (:meth:`GateHandle.sweep`). Layer recipes
replay on the most recent captured inputs of each layer: the handle keeps the last
complete capture the driver took for each layer (one capture per catalog layer of
memory, the tensors the driver already cloned) and hands them to the driver's
layer runner, stamped with the sweep's step so every peer agrees on readiness. A
layer never captured yet reads inconclusive (fail closed). The optimizer recipe
cannot be replayed without a pre-step snapshot, so the sweep compares the full
local optimizer state and parameters across replica peers instead (exact surface
``optimizer/state``): a corrupted moment or parameter on one replica shows there.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import deque
from collections.abc import Callable, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from scout_core.checkpoint.coordinator import BoundaryResult, CheckpointCoordinator
from scout_core.decision.c3 import Surface, exchange
from scout_core.decision.gate import Outcome, Retrieval, worst
from scout_core.decision.signature import signature_many
from scout_core.errors import ConfigError, UnsupportedSetupError
from scout_core.records.evidence import EvidenceWriter
from scout_core.replay.capture import Capture
from scout_core.replay.driver import ReplayDriver
from scout_core.replay.runner import RoundOutcome
from scout_core.replay.schedule import OPTIMIZER, Recipe
from scout_core.vocabulary import Failure, Mode, Status

if TYPE_CHECKING:
    from scout_core.checkpoint.recovery import Restored
    from scout_core.session import Session

__all__ = ["model_of", "GateHandle", "attach_gate", "gate_catalog", "round_outcome"]

log = logging.getLogger("scout")

ExtraState = Callable[[], Mapping[str, Any]]
RestoreExtra = Callable[[dict[str, Any]], None]

_HISTORY = 256  # boundary results kept on the handle (a long run must not grow without bound)


def round_outcome(round_: RoundOutcome) -> Outcome:
    """The gate outcome of one recipe round on this rank.

    Not ready → inconclusive; any exact surface attributed → SDC; any exact surface
    inconclusive → inconclusive; otherwise clean. Statistical surfaces (timings)
    never make a round unclean: slowness is reported by replay, not gated.
    """
    if not round_.ready:
        return Outcome.INCONCLUSIVE
    exact = [r for r in round_.results.values() if r.mode is Mode.EXACT]
    if any(r.status is Status.ATTRIBUTED for r in exact):
        return Outcome.SDC
    if any(r.status is Status.INCONCLUSIVE for r in exact):
        return Outcome.INCONCLUSIVE
    return Outcome.CLEAN


def _key(recipe: Recipe) -> tuple[str, str | None]:
    return (recipe.kind, recipe.path)


def gate_catalog(driver: ReplayDriver) -> tuple[Recipe, ...]:
    """The replay catalog this job can actually run (see the module docstring)."""
    catalog = driver.schedule.catalog
    if not driver.opt.supported:
        catalog = tuple(r for r in catalog if r.kind != OPTIMIZER)
    return catalog


def _find_driver(session: Session) -> ReplayDriver:
    """The session's replay driver: ``session.replay`` when the session exposes it, else
    the driver whose ``close`` the session registered as a closer."""
    found = getattr(session, "replay", None)
    if isinstance(found, ReplayDriver):
        return found
    for fn in getattr(session, "_closers", ()):
        owner = getattr(fn, "__self__", None)
        if isinstance(owner, ReplayDriver):
            return owner
    raise UnsupportedSetupError(
        "attach_gate needs a session with replay running (scout.enable with replay on)"
    )


def model_of(adapter: Any) -> torch.nn.Module | None:
    """The model whose state the gate checkpoints: the adapter's ``root``, ``module`` or
    ``model`` attribute, or None when the adapter exposes none."""
    for name in ("root", "module", "model"):
        found = getattr(adapter, name, None)
        if isinstance(found, torch.nn.Module):
            return found
    return None


def _model_of(adapter: Any) -> torch.nn.Module:
    found = model_of(adapter)
    if found is not None:
        return found
    raise UnsupportedSetupError(
        f"the {getattr(adapter, 'name', type(adapter).__name__)} adapter exposes no model "
        "(root, module or model); pass model= to attach_gate"
    )


def _local(t: torch.Tensor) -> torch.Tensor:
    to_local = getattr(t, "to_local", None)
    if callable(to_local):
        out = to_local()
        assert isinstance(out, torch.Tensor)
        return out
    return t


class GateHandle:
    """The checkpoint gate attached to one session; one per rank."""

    def __init__(
        self,
        session: Session,
        driver: ReplayDriver,
        *,
        model: torch.nn.Module,
        writer: EvidenceWriter | None,
        extra_state: ExtraState | None,
        restore_extra: RestoreExtra | None,
    ) -> None:
        config = session.config
        self.session = session
        self.driver = driver
        self.extra_state = extra_state
        self.restore_extra = restore_extra
        self.catalog = gate_catalog(driver)
        if not self.catalog:
            raise UnsupportedSetupError("the checkpoint gate needs at least one replay recipe")
        size = config.catalog_size if config.catalog_size is not None else len(self.catalog)
        if size > len(self.catalog):
            raise ConfigError(
                f"catalog_size K={size} exceeds the {len(self.catalog)} checks this job's "
                "replay can run; no recipe cycle could ever close"
            )
        self._index = {_key(r): i % size for i, r in enumerate(self.catalog)}
        ranks = list(range(dist.get_world_size()))
        self.coordinator = CheckpointCoordinator(
            model,
            list(driver.adapter.optimizers()),
            rng_streams=driver.adapter.rng_streams(),
            catalog_size=size,
            group=dist.new_group(ranks, backend="gloo"),
            ranks=ranks,
            run_id=config.resolved_run_id(),
            writer=writer,
            checkpoint_dir=config.checkpoint_dir,
            peer_replication=config.peer_replication,
            sweep=self.sweep,
        )
        self.history: deque[BoundaryResult] = deque(maxlen=_HISTORY)
        """The most recent boundary results, oldest first."""
        self.pending: Retrieval | None = None
        """The selection an SDC at a boundary made; set until :meth:`recover` runs."""
        self.sweep_rounds: list[RoundOutcome] = []
        """The rounds of the most recent full-catalog sweep."""
        self._seen = len(session.rounds)
        self._last: dict[str, Capture] = {}
        self._feed: dict[str, Capture] | None = None
        self._warned = False
        self._closed = False
        capturer = driver.capturer
        self._take = capturer.take
        # The driver pops each capture as it replays it; keep the last one of each
        # layer for the sweep. An instance attribute shadows the method until close().
        setattr(capturer, "take", self._keep_take)  # noqa: B010  # shadowing a bound method
        # Registered after the driver's post-hook: hooks fire in registration order.
        self._hook = driver.optimizer.register_step_post_hook(self._post_step)
        if driver.peer_size < 2:
            log.warning("scout: replay has no peers here; the checkpoint gate never certifies")

    def set_extra_state(
        self, extra_state: ExtraState | None, restore_extra: RestoreExtra | None = None
    ) -> None:
        """Capture ``extra_state()`` (caller-owned state) with each checkpoint from now
        on; ``restore_extra`` receives it back on recovery. The same on every rank."""
        self.extra_state = extra_state
        self.restore_extra = restore_extra

    # -- the boundary --------------------------------------------------------------------

    def _keep_take(self, path: str) -> Capture | None:
        if self._feed is not None:  # a sweep is running: serve the kept capture
            return self._feed.pop(path, None)
        cap = self._take(path)
        if cap is not None:
            self._last[path] = cap
        return cap

    def _post_step(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        # The driver's hook already ran for this iteration and advanced session.step.
        step = self.session.step - 1
        fresh = self.session.rounds[self._seen :]
        self._seen = len(self.session.rounds)
        schedule = self.driver.schedule
        if not schedule.any_due(step):
            return
        due = [
            r
            for r in schedule.due(step, optimizer_slices=self.driver.opt.slices())
            if _key(r) in self._index
        ]
        if not due:
            return
        if self.pending is not None:
            if not self._warned:
                log.warning(
                    "scout: the gate selected %s step %s; nothing is captured until recover()",
                    self.pending.selected.value,
                    self.pending.step,
                )
                self._warned = True
            return
        outcomes: list[Outcome] = []
        for recipe in due:
            mine = [o for o in fresh if o.step == step and _key(o.recipe) == _key(recipe)]
            outcomes.append(worst(round_outcome(o) for o in mine))  # none → MISSING
        extra = None if self.extra_state is None else self.extra_state()
        result = self.coordinator.on_boundary(
            step, worst(outcomes), [self._index[_key(r)] for r in due], extra=extra
        )
        self.history.append(result)
        if result.retrieval is not None:
            self.pending = result.retrieval
            self._warned = False
            log.warning(
                "scout: %s at step %d; the gate selects %s step %s (%s)",
                result.decision.failure.value if result.decision.failure else "failure",
                step,
                result.retrieval.selected.value,
                result.retrieval.step,
                result.retrieval.reason,
            )

    # -- the full-catalog sweep ----------------------------------------------------------

    def sweep(self) -> Outcome:
        """Run every catalog recipe now and return this rank's outcome. Collective over
        the job (every rank runs the same recipes in the same order)."""
        driver = self.driver
        if driver.peer_size < 2:
            return Outcome.MISSING
        step = self.session.step
        rounds: list[RoundOutcome] = []
        for recipe in self.catalog:
            if recipe.kind == OPTIMIZER:
                rounds.append(self._optimizer_state_round(recipe, step))
                continue
            assert recipe.path is not None
            kept = self._last.get(recipe.path)
            # Restamped with the sweep's step: every peer kept the same capture step
            # for this layer (the schedule is global), so readiness still agrees.
            self._feed = {} if kept is None else {recipe.path: dataclasses.replace(kept, step=step)}
            try:
                rounds.append(driver.runner.run(recipe, step))
            finally:
                self._feed = None
        self.sweep_rounds = rounds
        return worst(round_outcome(r) for r in rounds)

    def _optimizer_state_round(self, recipe: Recipe, step: int) -> RoundOutcome:
        """Exact C3 of the whole local optimizer state and parameters across replica peers."""
        peers = self.driver.peers
        opt = self.driver.optimizer
        held = [p for g in opt.param_groups for p in g["params"]]
        tensors: list[torch.Tensor] = [_local(p.detach()) for p in held]
        for p in held:
            state = opt.state.get(p, {})
            for key in sorted(state):
                value = state[key]
                if isinstance(value, torch.Tensor):
                    tensors.append(_local(value.detach()))
        sig = signature_many(tensors)
        surface = Surface("optimizer/state", Mode.EXACT, sig)
        results = exchange(
            [surface], group=peers.pg, ranks=peers.ranks, kappa=self.session.config.kappa
        )
        return RoundOutcome(recipe, step, peers.ranks, True, results)

    # -- recovery ------------------------------------------------------------------------

    def recover(self, failure: Failure | None, *, machines_accessible: bool = True) -> Restored:
        """Select and restore the generation the gate trusts for ``failure``. Collective.

        Model, optimizer, RNG streams and the caller state are restored bitwise;
        ``extra_state()``'s mapping is updated in place (its tensors copied into)
        and ``restore_extra`` receives the restored caller state. Replay resumes at
        the iteration after the restored step (``session.step``).
        """
        target: MutableMapping[str, Any] | None = None
        if self.extra_state is not None:
            live = self.extra_state()
            target = live if isinstance(live, MutableMapping) else dict(live)
        at = max(self.session.step - 1, 0)
        restored = self.coordinator.recover(
            failure, step=at, machines_accessible=machines_accessible, extra=target
        )
        if self.restore_extra is not None:
            self.restore_extra(dict(restored.extra))
        self.pending = None
        self._warned = False
        # Replay's schedule follows the training iteration, which resumes after the
        # restored step; the captures armed for the abandoned iteration are useless.
        resume = restored.step + 1
        if resume != self.session.step:
            self.session.step = resume
            schedule = self.driver.schedule
            self.driver.capturer.arm(
                resume, schedule.modules_due(resume) if schedule.any_due(resume) else ()
            )
        return restored

    def close(self) -> None:
        """Remove the hook, give the capturer its method back, detach the coordinator."""
        if self._closed:
            return
        self._closed = True
        self._hook.remove()
        self.driver.capturer.__dict__.pop("take", None)
        self._last.clear()
        self.coordinator.close()


def attach_gate(
    session: Session,
    driver: ReplayDriver | None = None,
    *,
    model: torch.nn.Module | None = None,
    writer: EvidenceWriter | None = None,
    extra_state: ExtraState | None = None,
    restore_extra: RestoreExtra | None = None,
) -> GateHandle:
    """Attach the checkpoint gate to a live replay ``session``. Collective over the job.

    Every rank calls it at the same point, after replay started (``scout.enable``).
    ``driver`` defaults to the session's replay driver, ``model`` to the adapter's
    unwrapped model, ``writer`` to replay's evidence writer. ``extra_state``
    returns the caller-owned state to capture with each checkpoint (a dict of
    tensors and JSON-safe values: step counter, data-loader position);
    ``restore_extra`` receives it back on recovery. Configured by the session's
    ``Config`` (``checkpoint_dir``, ``catalog_size``, ``peer_replication``). The
    handle is closed with the session.
    """
    if session.closed or session.adapter is None:
        raise UnsupportedSetupError("attach_gate needs an enabled, open SCOUT session")
    existing = getattr(session, "gate", None)
    if isinstance(existing, GateHandle):  # scout.enable attached one: attaching is idempotent
        if extra_state is not None or restore_extra is not None:
            existing.set_extra_state(extra_state, restore_extra)
        return existing
    driver = _find_driver(session) if driver is None else driver
    handle = GateHandle(
        session,
        driver,
        model=_model_of(driver.adapter) if model is None else model,
        writer=driver.writer if writer is None else writer,
        extra_state=extra_state,
        restore_extra=restore_extra,
    )
    session.add_closer(handle.close)
    return handle
