"""Incidents: the records of one failure, from every peer group, merged into one answer.

One failure can leave records in several peer groups (a corrupted shard's owner named in
its replica group, its partner's group inconclusive); an incident names the culprit once
and links the records that corroborate it and the ones it explains. Contract:
:func:`merge_window` is a pure function of one step window's verdicts and of who is coupled
to whom (``partners``), so every rank merges alike; :class:`IncidentBook` carries incidents
across windows, a failure seen again as a new revision of its ``detail.key``, and stays
bounded. The rule: docs/evidence.md, "Where incidents are made".
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from scout_core.records.record import INCIDENT_SCHEMA, VERDICT_SCHEMA, Record
from scout_core.vocabulary import Failure, Scope, Status

__all__ = ["MAX_IDS", "MAX_OPEN", "Finding", "IncidentBook", "merge_window"]

MAX_OPEN = 1024
"""Incidents the book remembers (the oldest is forgotten first)."""
MAX_IDS = 64
"""Record ids one incident cites per list; the rest are counted in ``detail.omitted``."""

_COMPUTED = frozenset({"forward", "input_grad", "param_grad"})
_STATE = frozenset({"params", "shard"})

Partners = Callable[[int], frozenset[int]]


@dataclass
class Finding:
    """One failure found in one window, before it becomes (part of) an incident."""

    failure: Failure
    culprits: tuple[int, ...]
    """The ranks named; empty when no single rank can be (a group-scoped failure)."""
    group: set[int]
    scope: Scope
    surface: str
    step: int
    corroborating: list[Record] = field(default_factory=list)
    explained: list[Record] = field(default_factory=list)
    about: tuple[int, ...] = ()
    """The ranks the finding is about: the culprits, or the coupled ranks it cannot
    tell apart (what decides which inconclusive records it explains)."""

    @property
    def key(self) -> str:
        """What makes two windows' findings the same failure."""
        who = ",".join(map(str, self.culprits)) or "group:" + ",".join(map(str, sorted(self.group)))
        return f"{self.failure.value}/{self.scope.value}/{who}"


def _leaf(record: Record) -> str:
    return record.surface.rsplit("/", 1)[-1]


def _module(record: Record) -> object:
    return record.detail.get("module")


def _sdc_suspects(records: Sequence[Record]) -> dict[int, list[Record]]:
    named: dict[int, list[Record]] = {}
    for r in records:
        if r.failure is Failure.SDC and r.status is Status.ATTRIBUTED:
            for rank in r.outliers:
                named.setdefault(rank, []).append(r)
    return named


def _receivers(named: dict[int, list[Record]], partners: Partners) -> dict[int, int]:
    """Suspects that only received corrupted data → the partner whose state differs."""
    stateful = {rank: {_module(r) for r in rs if _leaf(r) in _STATE} for rank, rs in named.items()}
    out: dict[int, int] = {}
    for rank, rs in sorted(named.items()):
        if not all(_leaf(r) in _COMPUTED for r in rs):
            continue
        modules = {_module(r) for r in rs}
        source = [p for p in sorted(partners(rank)) if modules & stateful.get(p, set())]
        if source:
            out[rank] = source[0]
    return out


def _coupled_components(ranks: Iterable[int], partners: Partners) -> list[list[int]]:
    left, out = sorted(ranks), []
    while left:
        todo, part = [left.pop(0)], []
        while todo:
            r = todo.pop()
            part.append(r)
            for p in partners(r):
                if p in left:
                    left.remove(p)
                    todo.append(p)
        out.append(sorted(part))
    return out


def merge_window(records: Iterable[Record], partners: Partners) -> list[Finding]:
    """The failures of one step window's records (module doc); deterministic."""
    unique = {r.id: r for r in records if r.schema == VERDICT_SCHEMA}
    window = sorted(unique.values(), key=lambda r: (r.step, r.surface, r.group, r.id))
    named = _sdc_suspects(window)
    receivers = _receivers(named, partners)
    suspects = [r for r in named if r not in receivers]
    compute_only = {r for r in suspects if all(_leaf(x) in _COMPUTED for x in named[r])}
    findings: list[Finding] = []
    used: set[str] = set()

    def add(finding: Finding) -> Finding:
        used.update(r.id for r in finding.corroborating + finding.explained)
        findings.append(finding)
        return finding

    for part in _coupled_components(suspects, partners):
        ambiguous = len(part) > 1 and all(r in compute_only for r in part)
        groups = [part] if ambiguous else [[r] for r in part]
        for culprits in groups:
            cites = {x.id: x for r in culprits for x in named[r]}
            first = min(cites.values(), key=lambda x: (x.step, x.surface))
            heard = [x for rank, src in receivers.items() if src in culprits for x in named[rank]]
            explained = [x for x in heard if x.id not in cites]
            add(
                Finding(
                    Failure.SDC,
                    () if ambiguous else tuple(culprits),
                    {g for x in [*cites.values(), *explained] for g in x.group},
                    Scope.GROUP if ambiguous else Scope.RANK,
                    first.surface,
                    first.step,
                    sorted(cites.values(), key=lambda x: (x.step, x.surface, x.id)),
                    explained,
                    tuple(culprits),
                )
            )
    for r in window:  # inconclusive rounds: explained by a culprit next to them, or their own
        if r.id in used or r.status is not Status.INCONCLUSIVE:
            continue
        near = set(r.group) | {int(d) for d in r.detail.get("differing", []) if isinstance(d, int)}
        owner = next(
            (
                f
                for f in findings
                if f.failure is Failure.SDC
                and any(c in near or near & partners(c) for c in f.about)
            ),
            None,
        )
        if owner is not None:
            owner.explained.append(r)
            owner.group |= set(r.group)
            used.add(r.id)
        elif r.failure is not None:
            add(Finding(r.failure, (), set(r.group), Scope.GROUP, r.surface, r.step, [r]))
    for r in window:  # every other failure: one finding per failure and outliers
        if r.id in used or r.failure is None or r.status is Status.INCONCLUSIVE:
            continue
        scope = r.scope or (Scope.RANK if len(r.outliers) == 1 else Scope.GROUP)
        twin = next(
            (
                f
                for f in findings
                if f.failure is r.failure and f.culprits == r.outliers and f.scope is scope
            ),
            None,
        )
        if twin is None:
            twin = add(Finding(r.failure, r.outliers, set(r.group), scope, r.surface, r.step))
        twin.corroborating.append(r)
        twin.group |= set(r.group)
        used.add(r.id)
    return findings


@dataclass
class _Open:
    finding: Finding
    first_step: int
    last_step: int
    hosts: set[str]
    corroborating: list[str]
    explained: list[str]
    omitted: int = 0
    revision: int = 0
    last_id: str | None = None
    surfaces: set[str] = field(default_factory=set)
    """Every surface its findings were seen on, across revisions (what the summary names)."""


class IncidentBook:
    """Incidents of one run across windows (module doc): new ones and revisions."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self._open: OrderedDict[str, _Open] = OrderedDict()

    def __len__(self) -> int:
        return len(self._open)

    def add(self, findings: Iterable[Finding]) -> list[Record]:
        """The incident records to write for one window's ``findings``."""
        out = []
        for f in findings:
            inc = self._open.pop(f.key, None)
            hosts = {
                h for r in f.corroborating if set(r.outliers) & set(f.culprits) for h in r.hosts
            }
            if inc is None:
                inc = _Open(f, f.step, f.step, hosts, [], [])
            else:
                inc.last_step = max(inc.last_step, f.step)
                inc.finding.group |= f.group
                inc.hosts |= hosts
                inc.revision += 1
            inc.surfaces.update(r.surface for r in f.corroborating)
            inc.omitted += _extend(inc.corroborating, f.corroborating)
            inc.omitted += _extend(inc.explained, f.explained)
            self._open[f.key] = inc
            while len(self._open) > MAX_OPEN:
                self._open.popitem(last=False)
            record = self._record(inc, f)
            inc.last_id = record.id
            out.append(record)
        return out

    def _record(self, inc: _Open, latest: Finding) -> Record:
        f = inc.finding
        detail: dict[str, object] = {
            "first_step": inc.first_step,
            "last_step": inc.last_step,
            "corroborating": list(inc.corroborating),
            "explained": list(inc.explained),
            "summary": _summary(f, inc, latest),
            "key": f.key,
            "revision": inc.revision,
        }
        if inc.last_id is not None:
            detail["supersedes"] = inc.last_id
        if inc.omitted:
            detail["omitted"] = inc.omitted
        return Record(
            schema=INCIDENT_SCHEMA,
            run_id=self.run_id,
            step=inc.first_step,
            surface=f.surface,
            failure=f.failure,
            group=tuple(sorted(f.group | set(f.culprits))),
            outliers=f.culprits,
            scope=f.scope,
            hosts=tuple(sorted(inc.hosts)),
            detail=detail,
        )


def _extend(ids: list[str], records: Iterable[Record]) -> int:
    dropped = 0
    for r in records:
        if r.id in ids:
            continue
        if len(ids) < MAX_IDS:
            ids.append(r.id)
        else:
            dropped += 1
    return dropped


def _summary(f: Finding, inc: _Open, latest: Finding) -> str:
    steps = (
        f"step {inc.first_step}"
        if inc.first_step == inc.last_step
        else f"steps {inc.first_step}-{inc.last_step}"
    )
    hosts = f" ({', '.join(sorted(inc.hosts))})" if inc.hosts else ""
    surfaces = sorted(inc.surfaces)
    shown = ", ".join(surfaces[:3]) + (
        f" and {len(surfaces) - 3} more" if len(surfaces) > 3 else ""
    )
    if not f.culprits:
        ranks = ", ".join(map(str, sorted(f.group)))
        why = (
            "coupled ranks differ and the records cannot tell which computed wrong"
            if f.failure is Failure.SDC and f.scope is Scope.GROUP and len(f.group) > 1
            else "no single rank can be named"
        )
        text = f"{f.failure.value} in group [{ranks}] at {steps}: {why}; {shown}"
    else:
        who = "rank " + ", ".join(map(str, f.culprits))
        what = "SDC" if f.failure is Failure.SDC else f.failure.value
        text = f"{what} on {who}{hosts} at {steps}: {shown}"
    if latest.explained:
        text += f"; explains {len(latest.explained)} record(s) of coupled partner groups"
    return " ".join(text.split())
