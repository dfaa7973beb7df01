"""The silence watch: ring the doorbell when this rank stops making progress.

[How silent observers meet: the doorbell]
Healthy training must cost the network nothing, yet every observer must join a
round within milliseconds once any of them suspects a hang. Each observer keeps
one blocking ``store.wait(["bell/<n>"])`` posted on a dedicated store connection
(:mod:`.diagnosis_round`). An observer whose rank stays silent past
``hang_timeout_s`` (``stage_timeout_s`` inside the DataLoader or checkpoint I/O)
sets ``bell/<n>``; every waiter wakes, and the round runs.

An observer's clock starts at its trainer's first publish: setting up a model and
its groups may legitimately take longer than any hang timeout. The observer that
rang may ring again one timeout later; after a verdict nobody rings again until its
rank makes progress. Without a group to compare with (its peers never joined, or
the store is gone) it says so in one record per silent episode.
"""

from __future__ import annotations

import contextlib
import time

from scout_core.observer.core import ObserverBase
from scout_core.observer.record import Stage
from scout_core.records.evidence import VERDICT_SCHEMA, Record
from scout_core.vocabulary import Failure, Mode, Scope, Status

__all__ = ["SilenceWatch"]

_STALL_STAGES = frozenset({Stage.DATALOADER, Stage.CHECKPOINT_READ, Stage.CHECKPOINT_WRITE})


class SilenceWatch(ObserverBase):
    """The watch loop: the observer process's main thread."""

    def watch(self) -> None:
        s = self.spec
        while True:
            snap = self.rec.read()
            now = time.monotonic()
            if snap.closing:
                return
            with self.lock:
                if snap.op_id != self.last_op:
                    self.last_op, self.quiet_since = snap.op_id, now
                    self.rang_at, self.episode_verdict = None, False
                quiet_since = self.quiet_since
            threshold = s.stage_timeout_s if snap.stage in _STALL_STAGES else s.hang_timeout_s
            due = quiet_since + threshold
            if snap.op_id == 0:
                # Nothing published yet: the trainer is still building its model and
                # groups, which may take any time. The clock starts at first progress
                # (a peer that did publish still rings for a rank stuck before it).
                self.rec.wait_for_progress(threshold)
                continue
            if now >= due:
                self._maybe_ring(now, threshold, snap.step)
                timeout = min(threshold, 0.5)
            else:
                timeout = due - now
            if self.rec.wait_for_progress(timeout):
                time.sleep(min(0.1, threshold / 20))  # bound the trainer's wake-ups

    def _maybe_ring(self, now: float, threshold: float, step: int) -> None:
        with self.lock:
            if self.in_round or self.episode_verdict or self.over:
                return
            if self.rang_at is not None and now - self.rang_at < threshold:
                return
            self.rang_at = now
            n = self.next_round
        if self.group is None:
            self._local_verdict(step)
            return
        with contextlib.suppress(RuntimeError, OSError):  # the doorbell reports a lost store
            self.ops.set(f"bell/{n}", str(self.spec.rank))

    def _local_verdict(self, step: int) -> None:
        """No group to compare with: say so, once per silent episode."""
        with self.lock:
            self.episode_verdict = True
        s = self.spec
        reason = (
            f"observers of ranks {list(self.unresponsive)} unresponsive"
            if self.unresponsive
            else "this observer could not reach its store"
        )
        self.writer.write(
            Record(
                schema=VERDICT_SCHEMA,
                run_id=s.run_id,
                step=step,
                surface="progress",
                mode=Mode.EXACT,
                status=Status.INCONCLUSIVE,
                failure=Failure.HANG,
                group=(s.rank,),
                scope=Scope.RANK,
                detail={
                    "reason": f"rank {s.rank} silent past its timeout; cannot compare: {reason}"
                },
            )
        )

    # -- doorbell and rounds -----------------------------------------------------------
