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
rank makes progress (a job under a verdict is being handled or torn down, and must
not produce new attributions meanwhile).

[When the store is gone]
The store host lives beside the lowest observed rank and dies with that rank's
trainer. An observer that loses the store (and whose own trainer is alive, and which
has no verdict yet) keeps watching; if its trainer then stays silent past the
timeout, that silence corroborates the loss, and the observers name the store host's
rank in one record (written by the second-lowest observed rank, handed to every
trainer through the verdict path), with the real times elapsed.
"""

from __future__ import annotations

import contextlib
import time

from scout_core.observer.core import ObserverBase
from scout_core.observer.escalation import escalate
from scout_core.observer.record import Stage
from scout_core.observer.store_host import ring
from scout_core.observer.verdict import Verdict
from scout_core.vocabulary import Failure, Scope, Status

__all__ = ["SilenceWatch"]

_STALL_STAGES = frozenset({Stage.DATALOADER, Stage.CHECKPOINT_READ, Stage.CHECKPOINT_WRITE})


class SilenceWatch(ObserverBase):
    """The watch loop: the observer process's main thread."""

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
                    # The trainer's signal woke us at or before its last publish: count
                    # the silence from then, so a stated silence is never shorter than
                    # the real one (longer by at most the wake-up pause below).
                    since = now if woke_at is None else min(woke_at, now)
                    self.last_op, self.quiet_since = snap.op_id, since
                    self.rang_at, self.episode_verdict = None, False
                quiet_since = self.quiet_since
            woke_at = None
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
        with contextlib.suppress(RuntimeError, OSError):  # the doorbell reports a lost store
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
