"""The diagnosis round: every observer compares notes with its equivalent ranks when the bell rings.

Contract: a round ``n`` is job-wide (one round signal) and its comparisons are per peer group
(one C3 AllGather); absent observers are never named for absence alone; every observer
merges the groups' results and escalates them. Traffic per observer is O(peer group), never
O(world). Docs: docs/observer.md, "Inside one observer".
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from scout_core.decision.c3 import Surface, exchange
from scout_core.observer import spawn
from scout_core.observer.core import ObserverBase
from scout_core.observer.escalation import VERDICT_MARGIN_S, escalate
from scout_core.observer.progress import ROUNDS, Snapshot, Stage
from scout_core.observer.resolve import GroupResult, merge, resolve
from scout_core.observer.roles import collective_members
from scout_core.observer.store_host import SHUTDOWN, first_unrung_bell
from scout_core.observer.verdict import RankEvidence, Verdict, decide_round
from scout_core.vocabulary import Failure, Mode, Scope, Status

__all__ = ["DiagnosisRound"]

_BELL_WAIT = timedelta(hours=1)
_HISTORY_SLOTS = 4  # lagging op ids checked against the peers' rings, per round
_STUCK = frozenset({Failure.GROUP_STALL, Failure.INPUT_STALL, Failure.CHECKPOINT_STALL})
_NO_TEMPLATE = (0, 0, 0)  # a real fingerprint's first word carries its op code, never 0


class DiagnosisRound(ObserverBase):
    """The round listener thread and the round it runs."""

    def listen_for_rounds(self) -> None:
        n = 1 if self.spec.incarnation == 0 else first_unrung_bell(self.ops)
        with self.lock:
            self.next_round = n
        if n > 1:
            self._catch_up(n - 1)
        while True:
            key = f"bell/{n}"
            try:
                self.bell.wait([key], _BELL_WAIT)
                value = self.bell.get(key).decode()
            except dist.DistStoreError:
                continue  # the hour-long wait timed out: post it again
            except (RuntimeError, OSError):
                self._store_lost()
                return
            if value == SHUTDOWN:  # the store host is closing: diagnosis is over
                with self.lock:
                    self.over = True
                return
            with self.lock:
                self.in_round = True
            try:
                self._round(n)
            except (RuntimeError, OSError, ValueError) as exc:
                print(f"scout observer {self.spec.rank}: round {n} failed: {exc}", file=sys.stderr)
            finally:
                n += 1
                with self.lock:
                    self.in_round = False
                    self.next_round = n
                self.rounds += 1
                self.rec.set_observer_word(ROUNDS, self.rounds)

    def _catch_up(self, n: int) -> None:
        """A restarted observer came up while round ``n`` may still run without it.

        It waits for that round to end and hands its verdicts, if any, to its trainer; it
        does not ring again until its rank progresses, as a second round on the same silence
        would only repeat it. A round completed before the restart is left alone."""
        with contextlib.suppress(RuntimeError, OSError):
            if self.ops.check([f"r/{n}/complete"]):
                return
            with self.lock:
                self.in_round = True  # no ringing while the round is still open
            try:
                wait = self.spec.join_timeout_s + VERDICT_MARGIN_S
                with contextlib.suppress(dist.DistStoreError, RuntimeError):
                    self.ops.wait([f"r/{n}/complete"], timedelta(seconds=wait))
                if not self.ops.check([f"r/{n}/out"]):
                    return
                lines = self.ops.get(f"r/{n}/out").decode().splitlines()
                results = [GroupResult.from_json(json.loads(ln)) for ln in sorted(lines) if ln]
                decided = merge(results, job=self.observed_ranks(), layout=self.layout)
                if decided:
                    with self.lock:
                        self.last_op = self.rec.read().op_id
                        self.episode_verdict = True
                    escalate(self, decided)  # its records were written by present members
            finally:
                with self.lock:
                    self.in_round = False

    def _round(self, n: int) -> None:
        s = self.spec
        started = time.monotonic()
        deadline = started + s.join_timeout_s
        snap = self.rec.read()
        with self.lock:
            quiet = 0.0 if snap.op_id != self.last_op else started - self.quiet_since
        mine = RankEvidence(
            s.rank,
            snap.step,
            snap.op_id,
            int(snap.stage),
            snap.fingerprint,
            quiet,
            snap.peer,
            self.rec.template(snap),
        )
        self.ops.set(f"r/{n}/ev/{s.rank}", json.dumps(mine.to_json()))
        members = self.register(f"r/{n}/{self.gid}", deadline)
        present = tuple(r for r, _ in members)
        if s.rank not in present:
            return  # registered too late: this round went on without us
        self.ensure_group(members, f"r{n}")
        evidence = self._exchange(mine, present)
        absent = tuple(r for r in self.peers if r not in present)
        verdicts = decide_round(evidence, min_quiet_s=self.min_quiet_s, world_size=s.world_size)
        verdicts = self._absent(verdicts, evidence, absent, started, n)
        history = self._history(verdicts, evidence, snap, present)
        result = resolve(
            self.peers,
            min(present),
            evidence,
            verdicts,
            history=history,
            members_of=self._members_of,
            lookup=lambda r: self._lookup(n, r, deadline),
            min_quiet_s=self.min_quiet_s,
        )
        decided = self._gather_results(n, result, started)
        if decided:
            with self.lock:
                self.episode_verdict = True
            escalate(self, decided)

    def _exchange(self, mine: RankEvidence, present: Sequence[int]) -> list[RankEvidence]:
        """One C3 AllGather of every present member's evidence (member order)."""
        assert self.group is not None
        results = exchange(
            [
                Surface("progress", Mode.EXACT, (mine.step, mine.op_id), width=2),
                Surface("collective", Mode.EXACT, mine.fingerprint, width=3),
                Surface("stage", Mode.EXACT, mine.stage),
                Surface("peer", Mode.EXACT, 0 if mine.peer is None else mine.peer + 1),
                Surface("quiet", Mode.STATISTICAL, mine.quiet_s),
                Surface("template", Mode.EXACT, mine.template or _NO_TEMPLATE, width=3),
            ],
            group=self.group,
            ranks=list(range(len(present))),
        )
        out = []
        for i, r in enumerate(present):
            coord = results["progress"].evidence[i]
            fp = results["collective"].evidence[i]
            stage = results["stage"].evidence[i]
            peer = results["peer"].evidence[i]
            q = results["quiet"].evidence[i]
            t = results["template"].evidence[i]
            assert isinstance(coord, tuple) and isinstance(fp, tuple) and isinstance(t, tuple)
            assert isinstance(stage, int) and isinstance(peer, int) and isinstance(q, float)
            out.append(
                RankEvidence(
                    r,
                    coord[0],
                    coord[1],
                    stage,
                    (fp[0], fp[1], fp[2]),
                    q,
                    peer - 1 if peer else None,
                    None if t == _NO_TEMPLATE else (t[0], t[1], t[2]),
                )
            )
        return out

    def _absent(
        self,
        verdicts: list[Verdict],
        evidence: Sequence[RankEvidence],
        absent: tuple[int, ...],
        started: float,
        n: int,
    ) -> list[Verdict]:
        """Absent peers are named only when every present one is stuck, waiting on them."""
        if not absent or not verdicts:
            return verdicts
        if not all(v.failure in _STUCK and v.status is Status.AGREE for v in verdicts):
            return [replace(v, detail={**v.detail, "absent": list(absent)}) for v in verdicts]
        waited = [self._members_of(e) for e in evidence]
        if any(m is not None and not set(m) & set(absent) for m in waited):
            return verdicts  # they wait for someone present: a stall, not the absent one
        steps = sorted(e.step for e in evidence)
        return [
            Verdict(
                Failure.HANG,
                "observer",
                Status.ATTRIBUTED,
                absent,
                Scope.RANK,
                steps[len(steps) // 2],
                {
                    **verdicts[0].detail,
                    "reason": f"the observers of ranks {list(absent)} did not answer round "
                    f"{n} within {time.monotonic() - started:.1f} s while every other rank "
                    "of their group waited: their trainer or host is gone or unreachable",
                    "present": [e.rank for e in evidence],
                },
            )
        ]

    def _history(
        self,
        verdicts: Sequence[Verdict],
        evidence: Sequence[RankEvidence],
        snap: Snapshot,
        present: Sequence[int],
    ) -> dict[int, tuple[Status, tuple[int, int, int] | None]]:
        """Exact C3 of each lagging rank's pending collective against the peers' rings."""
        behind = sorted(
            (e.op_id, e.rank)
            for v in verdicts
            if v.status is Status.ATTRIBUTED and v.failure is Failure.HANG
            for e in evidence
            if e.rank in v.outliers
            and e.stage == Stage.COLLECTIVE
            and v.detail.get("position", {}).get(str(e.rank)) == "behind"
        )
        ops = sorted({op for op, _ in behind})[:_HISTORY_SLOTS]
        if not ops or len(present) < 3:
            return {}
        ring = self.rec.history()
        assert self.group is not None
        found = exchange(
            [
                Surface(
                    f"at/{i}",
                    Mode.EXACT,
                    snap.fingerprint if op == snap.op_id else ring.get(op),
                    width=3,
                )
                for i, op in enumerate(ops)
            ],
            group=self.group,
            ranks=list(range(len(present))),
        )
        out: dict[int, tuple[Status, tuple[int, int, int] | None]] = {}
        for op, r in behind:
            if op not in ops:
                continue
            res = found[f"at/{ops.index(op)}"]
            i = list(present).index(r)
            expected = next((res.evidence[j] for j, bit in enumerate(res.bitmap) if not bit), None)
            status = res.status
            if status is Status.ATTRIBUTED and not res.bitmap[i]:
                status = Status.INCONCLUSIVE  # a peer deviates, not this rank
            fp = expected if isinstance(expected, tuple) else None
            out[r] = (status, None if fp is None else (fp[0], fp[1], fp[2]))
        return out

    def _members_of(self, e: RankEvidence) -> tuple[int, ...] | None:
        if self.layout is None or e.stage != Stage.COLLECTIVE:
            return None
        return collective_members(self.layout, e.rank, e.fingerprint[1], e.peer)

    def _lookup(self, n: int, rank: int, deadline: float) -> RankEvidence | None:
        """The evidence rank ``rank``'s observer posted for round ``n`` (None: absent)."""
        key = f"r/{n}/ev/{rank}"
        left = max(deadline - time.monotonic(), 0.01)
        try:
            self.ops.wait([key], timedelta(seconds=left))
        except (dist.DistStoreError, RuntimeError):
            return None
        data: Any = json.loads(self.ops.get(key).decode())
        return RankEvidence.from_json(data)

    def _gather_results(
        self, n: int, result: GroupResult, started: float
    ) -> list[tuple[Verdict, int]]:
        """Post this group's result (its lead does), wait for every group's, merge them."""
        s = self.spec
        if s.rank == result.lead:
            self.ops.append(f"r/{n}/out", json.dumps(result.to_json()) + "\n")
            if self.ops.add(f"r/{n}/posted", 1) >= s.groups:
                self.ops.set(f"r/{n}/complete", "1")
        left = started + s.join_timeout_s + VERDICT_MARGIN_S / 2 - time.monotonic()
        with contextlib.suppress(dist.DistStoreError, RuntimeError):
            self.ops.wait([f"r/{n}/complete"], timedelta(seconds=max(left, 0.01)))
        if not self.ops.check([f"r/{n}/out"]):
            return []
        lines = self.ops.get(f"r/{n}/out").decode().splitlines()
        results = [GroupResult.from_json(json.loads(line)) for line in sorted(lines) if line]
        return merge(results, job=self.observed_ranks(), layout=self.layout)

    def _store_lost(self) -> None:
        if self.rec.read().closing:
            return
        s = self.spec
        time.sleep(1.0)  # a job torn down at once takes this observer's trainer too
        if not spawn.parent_alive(s.trainer_pid):
            os._exit(0)
        with self.lock:
            under_verdict = self.episode_verdict
            self.over = under_verdict
            self.store_lost_at = time.monotonic()
        if under_verdict:
            print(
                f"scout observer {s.rank}: the observers' store went away after a verdict "
                "(the job is being torn down); no new attribution",
                file=sys.stderr,
            )
            return
        print(f"scout observer {s.rank}: lost the observers' store", file=sys.stderr)
