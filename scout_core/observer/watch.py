"""The silence watch: signal a diagnosis round when this rank stops making progress.

Contract: the watch rings ``bell/<n>`` once its rank stays silent past ``hang_timeout_s``
(``stage_timeout_s`` in the DataLoader or checkpoint I/O), counted from the trainer's first
publish, and not again after a verdict until its rank progresses. An observer that loses
the store names the store host's rank only when its own trainer then stays silent too.
Docs: docs/observer.md, "How silent observers meet (the round signal)".
"""

from __future__ import annotations

import contextlib
import time

from scout_core.observer.core import ObserverBase
from scout_core.observer.escalation import escalate
from scout_core.observer.progress import Snapshot, Stage
from scout_core.observer.store_host import ring
from scout_core.observer.verdict import Verdict
from scout_core.vocabulary import Failure, Scope, Status

__all__ = ["SilenceWatch"]

_STALL_STAGES = frozenset({Stage.DATALOADER, Stage.CHECKPOINT_READ, Stage.CHECKPOINT_WRITE})


class SilenceWatch(ObserverBase):
    """The watch loop: the observer process's main thread."""

    def _starting(self, snap: Snapshot) -> bool:
        """Still in the step this rank first published, outside a collective and I/O.

        Idle or computing there, the job is still starting up (lazy initialisation,
        compilation): never rung for. A rank stuck there is still named through a peer that
        waits for it in a collective (docs/observer.md, "Limits", "Start-up")."""
        if self.start_step is None:
            self.start_step = snap.step
        if snap.step != self.start_step:
            return False
        return snap.stage != Stage.COLLECTIVE and snap.stage not in _STALL_STAGES

    def watch(self) -> None:
        s = self.spec
        woke_at: float | None = None
        while True:
            snap = self.rec.read()
            now = time.monotonic()
            if snap.closing:
                return
            with self.lock:
                if snap.op_id != self.last_op:
                    # We woke at or before the last publish: counting from then, a stated
                    # silence is never shorter than the real one.
                    since = now if woke_at is None else min(woke_at, now)
                    self.last_op, self.quiet_since = snap.op_id, since
                    self.rang_at, self.episode_verdict = None, False
                quiet_since = self.quiet_since
            woke_at = None
            threshold = s.stage_timeout_s if snap.stage in _STALL_STAGES else s.hang_timeout_s
            due = quiet_since + threshold
            if snap.op_id == 0 or self._starting(snap):
                # Start-up may take any time: the clock starts at first progress (see
                # _starting).
                self.rec.wait_for_progress(threshold)
                continue
            if now >= due:
                self._maybe_ring(now, threshold, snap.step)
                timeout = min(threshold, 0.5)
            else:
                timeout = due - now
            if self.rec.wait_for_progress(timeout):
                woke_at = time.monotonic()
                time.sleep(min(0.1, threshold / 20))  # bound the trainer's wake-ups

    def _maybe_ring(self, now: float, threshold: float, step: int) -> None:
        with self.lock:
            if self.in_round or self.episode_verdict or self.over:
                return
            if self.rang_at is not None and now - self.rang_at < threshold:
                return
            self.rang_at = now
            n = self.next_round
            lost = self.store_lost_at
        if lost is not None:
            self._store_gone_verdict(now, lost, step)
            return
        with contextlib.suppress(RuntimeError, OSError):  # the round listener reports a lost store
            ring(self.ops, n, str(self.spec.rank))

    def _store_gone_verdict(self, now: float, lost_at: float, step: int) -> None:
        """Silent after the store went away: name the store host's rank, once."""
        with self.lock:
            self.episode_verdict = True
            quiet = now - self.quiet_since
        s = self.spec
        observed = self.observed_ranks()
        host, speaker = observed[0], observed[1] if len(observed) > 1 else observed[0]
        verdict = Verdict(
            Failure.HANG,
            "observer",
            Status.ATTRIBUTED,
            (host,),
            Scope.RANK,
            step,
            {
                "reason": f"the observers' store, which lives beside rank {host}'s trainer, went "
                f"away {now - lost_at:.1f} s ago and rank {s.rank} has been silent for "
                f"{quiet:.1f} s: rank {host}'s trainer or host is gone",
            },
            group=tuple(sorted({host, *self.peers})),
        )
        escalate(self, [(verdict, speaker)])
