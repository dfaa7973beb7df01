"""Referee replay: a third rank decides which of two disagreeing copies computed wrong.

Contract: a pair whose inputs and parameters agree but whose computed surfaces differ
(:func:`wants_referee`, read identically by both members) asks a referee that every
rank chooses alike without talking (:func:`choose_referee`); the pair's source ships it
the round's state (:mod:`.referee_wire`), it recomputes and answers both members, and
:func:`decide` names the copy it does not match, or leaves a group-scope verdict with
the reason (no referee, a refusal, a timeout), never a hang. A healthy round adds no
collective. After a failed exchange a rank never uses the referee group again. The
mechanism, its bytes and its limits: docs/replay.md, "Referee replay".
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol

import torch
import torch.distributed as dist

from scout_core.decision.c3 import C3Result
from scout_core.replay import taps
from scout_core.replay.referee_wire import (
    COMPUTED,
    DRAIN_CAP,
    HEADER_WORDS,
    RESULT_WORDS,
    Expected,
    Plan,
    Refusal,
    Shipment,
    announced_bytes,
    check_payload,
    make_header,
    payload_cap,
    read_header,
    read_result,
    refusal_text,
    result_words,
)
from scout_core.vocabulary import Status

__all__ = [
    "NO_CANDIDATE",
    "NO_THIRD",
    "Finding",
    "RefereePhase",
    "RefereeLink",
    "Recomputer",
    "apply_finding",
    "choose_referee",
    "decide",
    "wants_referee",
]

log = logging.getLogger(__name__)


def wants_referee(name: str, results: Mapping[str, C3Result], ready: bool) -> tuple[str, ...]:
    """The computed surfaces on which a pair disagrees with equal inputs and parameters: empty
    unless the round of recipe ``name`` was ready, its group has two members, ``received``,
    ``params`` (and ``shard``) agree, no peer lacks evidence (``gap`` agrees on 0) and one of
    :data:`COMPUTED` holds two values. The same on both members: they read the same C3 results."""
    if not ready:
        return ()
    for leaf in ("received", "params", "shard"):
        result = results.get(f"{name}/{leaf}")
        if result is not None and result.status is not Status.AGREE:
            return ()
    gap = results.get(f"{name}/gap")
    if gap is None or gap.status is not Status.AGREE or any(gap.evidence):
        return ()
    differing: list[str] = []
    for leaf in COMPUTED:
        result = results.get(f"{name}/{leaf}")
        if result is None or len(result.ranks) != 2:
            continue
        if any(e is None for e in result.evidence):
            return ()
        if result.evidence[0] != result.evidence[1]:
            differing.append(leaf)
    return tuple(differing)


def choose_referee(
    groups: Sequence[Sequence[int]],
    pair: Sequence[int],
    source: int,
    keys: Mapping[int, int | None],
    asking: Mapping[int, bool],
) -> int | None:
    """The referee of ``pair`` (docs/replay.md), or None when no rank qualifies. ``groups``: the
    pool's peer groups by lowest rank; ``source``: the pair's source this round; ``keys``: each
    pool member's work key (None: replayed nothing); ``asking``: each member's referee flag. A
    candidate must hold the pair's work key in a group none of whose members asked."""
    pair = tuple(pair)
    ordered = [tuple(g) for g in groups]
    if pair not in ordered or source not in pair:
        return None
    want = {keys.get(r) for r in pair}
    if len(want) != 1 or None in want:
        return None
    key = want.pop()
    at, pos = ordered.index(pair), pair.index(source)
    for k in range(1, len(ordered)):
        group = ordered[(at + k) % len(ordered)]
        if any(asking.get(r, False) for r in group):
            continue
        for j in range(len(group)):
            candidate = group[(pos + j) % len(group)]
            if keys.get(candidate) == key:
                return candidate
    return None


@dataclass(frozen=True)
class Finding:
    """What a pair's referee phase concluded, the same on both members."""

    pair: tuple[int, ...]
    surfaces: tuple[str, ...]
    """The computed surfaces (leaf names) on which the pair differs."""
    referee: int | None
    culprit: int | None
    reason: str
    signatures: Mapping[int, Mapping[str, int | None]] = field(default_factory=dict)
    """Each of the three ranks' signature per computed surface (the referee's if it answered)."""

    @property
    def healthy(self) -> int | None:
        if self.culprit is None:
            return None
        return next(r for r in self.pair if r != self.culprit)


def decide(
    pair: Sequence[int],
    surfaces: Sequence[str],
    pair_values: Mapping[str, Sequence[int | None]],
    referee: int | None,
    answer: Mapping[str, int | None] | str,
) -> Finding:
    """The pair's verdict from the referee's ``answer`` (its signatures, or why it has
    none). The copy the referee matches on *every* computed surface the pair compared is
    healthy and the other copy is named; matching neither (or both) names no one."""
    pair = tuple(pair)
    sigs: dict[int, dict[str, int | None]] = {r: {} for r in pair}
    for leaf, values in pair_values.items():
        for r, v in zip(pair, values, strict=True):
            sigs[r][leaf] = v
    if referee is None or isinstance(answer, str):
        reason = answer if isinstance(answer, str) else "no referee"
        return Finding(pair, tuple(surfaces), referee, None, reason, sigs)
    sigs[referee] = {leaf: answer.get(leaf) for leaf in pair_values}
    matches = [r for r in pair if all(answer.get(leaf) == sigs[r][leaf] for leaf in pair_values)]
    if len(matches) == 1:
        healthy = matches[0]
        culprit = next(r for r in pair if r != healthy)
        reason = f"referee rank {referee} recomputed rank {healthy}'s result"
        return Finding(pair, tuple(surfaces), referee, culprit, reason, sigs)
    reason = f"referee rank {referee} matches neither copy"
    return Finding(pair, tuple(surfaces), referee, None, reason, sigs)


@dataclass
class RefereeLink:
    """SCOUT's referee group of one pool: point-to-point, with a bounded wait."""

    pg: dist.ProcessGroup
    timeout_s: float
    broken: str | None = None
    """Why this rank stopped using the group (a failed exchange), or None."""
    _held: list[torch.Tensor] = field(default_factory=list)

    def _wait(self, work: Any, what: str) -> None:
        ok = work.wait(timeout=timedelta(seconds=self.timeout_s))
        if ok is False:
            raise RuntimeError(f"{what} did not complete")

    def send(self, t: torch.Tensor, dst: int, what: str) -> None:
        self._held.append(t)  # a send that failed must not free what Gloo may still read
        self._wait(dist.isend(t, dst=dst, group=self.pg), what)
        self._held.remove(t)

    def recv(self, t: torch.Tensor, src: int, what: str) -> None:
        self._held.append(t)
        self._wait(dist.irecv(t, src=src, group=self.pg), what)
        self._held.remove(t)

    def fail(self, exc: BaseException) -> str:
        """Stop using the group on this rank; the reason text for the verdict."""
        self.broken = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
        log.warning("referee exchange failed on this rank; referee replay is off: %s", exc)
        return self.broken


class Recomputer(Protocol):
    """The layer runner's part in a referee phase (:class:`~.runner.LayerRunner`)."""

    def shipment(self, step: int) -> Shipment | None: ...

    def expected(self, step: int) -> Expected | None: ...

    def recompute(
        self,
        params: dict[str, torch.Tensor],
        inputs: Sequence[torch.Tensor],
        grads: Sequence[torch.Tensor],
        rng: dict[str, torch.Tensor],
        threads: int,
    ) -> dict[str, Any] | Refusal: ...


NO_THIRD = "no referee: no rank outside the pair replays this work"
"""The reason a pair gets where its peer group is its whole timing pool (DDP x 2)."""
NO_CANDIDATE = (
    "no referee: no rank outside the pair replayed the same work with its own group agreeing"
)


class RefereePhase:
    """One rank's part in a layer round's referee phase (docs/replay.md). ``peer_groups``: every
    peer group of the layout (ascending); ``links``: the referee group per pooled recipe kind."""

    def __init__(
        self,
        rank: int,
        peer_groups: Sequence[Sequence[int]],
        links: Mapping[str, RefereeLink],
    ) -> None:
        self.rank = rank
        self.peer_groups = [tuple(g) for g in peer_groups]
        self.links = dict(links)

    def settle(self, outcome: Any, asks: Sequence[str], runner: Recomputer) -> Finding | None:
        """This round's referee phase; this rank's pair's :class:`Finding` when its pair asked,
        else None. Runs only where some member of the round's pool asked; collective over the
        asking pairs and their referees, point to point, never over a healthy pair."""
        kind, name, step = outcome.recipe.kind, outcome.recipe.name, outcome.step
        pool = outcome.pool
        if pool is None:
            return self._alone(name, outcome, asks)
        if not any(pool.asking):
            return None
        asking = dict(zip(pool.ranks, pool.asking, strict=True))
        keys = dict(zip(pool.ranks, pool.keys, strict=True))
        members = set(pool.ranks)
        groups = [g for g in self.peer_groups if set(g) <= members]
        link = self.links.get(kind)
        mine: Finding | None = None
        for pair in groups:
            if len(pair) != 2 or not all(asking[r] for r in pair):
                continue
            source = pair[step % len(pair)]
            referee = choose_referee(groups, pair, source, keys, asking)
            involved = self.rank in pair or self.rank == referee
            if not involved:
                continue
            answer: Mapping[str, int | None] | str
            if referee is None:
                answer = NO_CANDIDATE
            elif link is None:
                answer = "no referee group"
            elif link.broken is not None:
                answer = f"the referee group failed earlier on this rank ({link.broken})"
            else:
                answer = self._exchange(
                    link, runner, step=step, pair=pair, source=source, referee=referee
                )
            if self.rank in pair:
                values = {
                    leaf: _pair_values(outcome.results.get(f"{name}/{leaf}"))
                    for leaf in COMPUTED
                    if f"{name}/{leaf}" in outcome.results
                }
                mine = decide(pair, asks, values, referee, answer)
        return mine

    def _alone(self, name: str, outcome: Any, asks: Sequence[str]) -> Finding | None:
        if not asks:
            return None
        values = {
            leaf: _pair_values(outcome.results.get(f"{name}/{leaf}"))
            for leaf in COMPUTED
            if f"{name}/{leaf}" in outcome.results
        }
        return decide(outcome.group, asks, values, None, NO_THIRD)

    def _exchange(
        self,
        link: RefereeLink,
        runner: Recomputer,
        *,
        step: int,
        pair: tuple[int, ...],
        source: int,
        referee: int,
    ) -> Mapping[str, int | None] | str:
        """This rank's roles for one pair (source, referee, member, in that order); the
        referee's decoded answer on a pair member, else an empty mapping."""
        try:
            if self.rank == source:
                self._ship(link, step, referee, runner)
            if self.rank == referee:
                self._referee(link, step, pair, source, runner)
            if self.rank in pair:
                got = torch.zeros(RESULT_WORDS, dtype=torch.int64)
                link.recv(got, referee, "the referee's answer")
                return read_result(got.tolist())
        except Exception as exc:  # a dead or late referee: a reason, never a hang
            return f"referee rank {referee} did not answer: {link.fail(exc)}"
        return {}

    def _ship(self, link: RefereeLink, step: int, referee: int, runner: Recomputer) -> None:
        ship = runner.shipment(step)
        words, nbytes = make_header(ship)
        link.send(torch.tensor(words, dtype=torch.int64), referee, "the referee header")
        if nbytes and ship is not None:
            tensors = [t.detach().to("cpu").contiguous() for t in ship.tensors()]
            blob = torch.frombuffer(bytearray(ship.names()), dtype=torch.uint8)
            parts = [t.reshape(-1).view(torch.uint8) for t in tensors] + [blob]
            link.send(torch.cat(parts), referee, "the referee payload")

    def _referee(
        self,
        link: RefereeLink,
        step: int,
        pair: tuple[int, ...],
        source: int,
        runner: Recomputer,
    ) -> None:
        # A test's slow or dead referee (the "referee" kind of :mod:`.taps`) acts here.
        taps.sleep_injected("referee")
        head = torch.zeros(HEADER_WORDS, dtype=torch.int64)
        link.recv(head, source, "the referee header")
        words = head.tolist()
        expected = runner.expected(step)
        values: dict[str, Any] | None = None
        refusal = Refusal.NONE
        if expected is None:
            refusal = Refusal.NO_CAPTURE
            plan: Plan | str = refusal_text(refusal)
        else:
            plan = read_header(words, expected, max_bytes=payload_cap(expected))
        # Keep the channel in step: a payload announced within the cap is received even
        # when its header is refused (the source sends it whatever the answer).
        announced = announced_bytes(words)
        buf = None
        if 0 < announced <= (DRAIN_CAP if expected is None else payload_cap(expected)):
            buf = torch.empty(announced, dtype=torch.uint8)
            link.recv(buf, source, "the referee payload")
        if isinstance(plan, str):
            log.warning("referee for ranks %s refuses: %s", list(pair), plan)
            refusal = refusal or (Refusal.NOT_SHIPPED if words[11] else Refusal.METADATA)
        elif buf is None or expected is None:
            refusal = Refusal.PAYLOAD
        else:
            parts = check_payload(buf, plan, expected)
            if isinstance(parts, str):
                log.warning("referee for ranks %s refuses the payload: %s", list(pair), parts)
                refusal = Refusal.PAYLOAD
            else:
                done = runner.recompute(*parts, threads=plan.threads)
                if isinstance(done, Refusal):
                    refusal = done
                else:
                    values = done
        answer = torch.tensor(result_words(values, refusal), dtype=torch.int64)
        for member in pair:
            link.send(answer, member, "the referee's answer")


def _pair_values(result: C3Result | None) -> tuple[int | None, ...]:
    if result is None:
        return ()
    return tuple(e if isinstance(e, int) else None for e in result.evidence)


def apply_finding(outcome: Any, finding: Finding) -> None:
    """Put ``finding`` on the round: where it names a copy, each differing surface reads
    attributed to it (the gate sees a localized SDC, as after a majority); :mod:`.verdicts`
    writes the referee's records."""
    outcome.referee = finding
    if finding.culprit is None:
        return
    name = outcome.recipe.name
    for leaf in finding.surfaces:
        key = f"{name}/{leaf}"
        result = outcome.results.get(key)
        if result is None:
            continue
        bitmap = tuple(r == finding.culprit for r in result.ranks)
        outcome.results[key] = dataclasses.replace(result, status=Status.ATTRIBUTED, bitmap=bitmap)
