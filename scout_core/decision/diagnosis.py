"""Cross-PG validation: turn slow process groups into a machine, group or job diagnosis.

A straggling link slows every member of a collective, so timing C3 names only the group
(paper Figure 2); slow groups of different dimensions narrow the fault to what they share
(§6.1.2, Figure 3). Contract: :func:`diagnose` is pure, so ranks that see the same slow
groups agree. The rule: docs/concepts.md, "Cross-PG validation".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from scout_core.vocabulary import Scope

__all__ = ["Diagnosis", "DiagnosisKind", "SlowGroup", "diagnose"]


@dataclass(frozen=True)
class SlowGroup:
    """A process group whose communication timing was found slow."""

    kind: str
    """Label of the group's dimension (``"tp"``, ``"fsdp"``, ``"replica"`` ...)."""
    ranks: tuple[int, ...]
    """Member global ranks, stored ascending."""

    def __post_init__(self) -> None:
        ranks = tuple(sorted(int(r) for r in self.ranks))
        if not ranks:
            raise ValueError(f"slow group {self.kind!r} has no ranks")
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"slow group {self.kind!r} lists a rank twice: {self.ranks}")
        object.__setattr__(self, "ranks", ranks)


class DiagnosisKind(str, Enum):
    """The four outcomes of cross-PG validation (paper Figure 3)."""

    MACHINE_LOCAL = "machine_local"
    """Intra- and inter-machine groups through one machine are slow: replace it."""
    INTRA_MACHINE_COMM = "intra_machine_comm"
    """Only a group inside one machine is slow: its internal interconnect."""
    INTER_MACHINE_COMM = "inter_machine_comm"
    """Only groups spanning machines are slow: the network between them."""
    JOB_LEVEL = "job_level"
    """Slow groups no single machine explains: software or cluster-wide contention."""


_SCOPES = {
    DiagnosisKind.MACHINE_LOCAL: Scope.MACHINE,
    DiagnosisKind.INTRA_MACHINE_COMM: Scope.MACHINE,
    DiagnosisKind.INTER_MACHINE_COMM: Scope.GROUP,
    DiagnosisKind.JOB_LEVEL: Scope.JOB,
}


@dataclass(frozen=True)
class Diagnosis:
    """What the slow groups, taken together, point at."""

    kind: DiagnosisKind
    scope: Scope
    hosts: tuple[str, ...]
    """Machines the diagnosis points at (all machines involved, for job level), sorted."""
    ranks: tuple[int, ...]
    """Ranks where the slow groups meet, if the evidence narrows that far; else empty."""
    groups: tuple[SlowGroup, ...]
    """The slow groups behind the diagnosis, sorted by kind then ranks."""
    explanation: str


def _describe(group: SlowGroup) -> str:
    return f"{group.kind} {{{', '.join(f'r{r}' for r in group.ranks)}}}"


def _hosts_of(group: SlowGroup, hosts: Mapping[int, str]) -> frozenset[str]:
    return frozenset(hosts[r] for r in group.ranks)


def diagnose(slow: Sequence[SlowGroup], hosts: Mapping[int, str]) -> Diagnosis | None:
    """Combine slow groups of different kinds into one diagnosis (``None`` if none is slow).
    ``hosts`` maps each of their ranks to its machine; a missing rank is a :class:`ValueError`
    (a guessed host could blame the wrong machine)."""
    groups = tuple(sorted(set(slow), key=lambda g: (g.kind, g.ranks)))
    if not groups:
        return None
    missing = sorted({r for g in groups for r in g.ranks if r not in hosts})
    if missing:
        raise ValueError(f"host map has no machine for ranks {missing}")

    spans = [_hosts_of(g, hosts) for g in groups]
    everywhere = sorted(frozenset().union(*spans))
    common = frozenset.intersection(*spans)
    listed = ", ".join(_describe(g) for g in groups)

    if not common:
        return Diagnosis(
            kind=DiagnosisKind.JOB_LEVEL,
            scope=_SCOPES[DiagnosisKind.JOB_LEVEL],
            hosts=tuple(everywhere),
            ranks=(),
            groups=groups,
            explanation=(
                f"{len(groups)} slow groups ({listed}) on {len(everywhere)} machines share "
                "no machine: a job-level software issue or cluster-wide contention"
            ),
        )

    intra = [g for g, span in zip(groups, spans, strict=True) if len(span) == 1]
    inter = [g for g, span in zip(groups, spans, strict=True) if len(span) > 1]
    if intra:
        (host,) = common  # an intra group touches only its own host
        if inter:
            inter_ranks = {r for g in inter for r in g.ranks}
            meet = tuple(sorted({r for g in intra for r in g.ranks} & inter_ranks))
            where = f" at {', '.join(f'r{r}' for r in meet)}" if meet else ""
            return Diagnosis(
                kind=DiagnosisKind.MACHINE_LOCAL,
                scope=_SCOPES[DiagnosisKind.MACHINE_LOCAL],
                hosts=(host,),
                ranks=meet,
                groups=groups,
                explanation=(
                    f"slow groups {listed} meet on machine {host}{where}: "
                    f"a machine-local problem; replace {host}"
                ),
            )
        return Diagnosis(
            kind=DiagnosisKind.INTRA_MACHINE_COMM,
            scope=_SCOPES[DiagnosisKind.INTRA_MACHINE_COMM],
            hosts=(host,),
            ranks=(),
            groups=groups,
            explanation=(
                f"only intra-machine groups are slow ({listed}) while the groups leaving "
                f"the machine are not: an intra-machine communication problem on {host}"
            ),
        )

    shared = frozenset.intersection(*(frozenset(g.ranks) for g in groups))
    endpoint = tuple(sorted(shared)) if len(groups) > 1 else ()
    where = f", meeting at {', '.join(f'r{r}' for r in endpoint)}" if endpoint else ""
    return Diagnosis(
        kind=DiagnosisKind.INTER_MACHINE_COMM,
        scope=_SCOPES[DiagnosisKind.INTER_MACHINE_COMM],
        hosts=tuple(sorted(common)),
        ranks=endpoint,
        groups=groups,
        explanation=(
            f"only groups spanning machines are slow ({listed}){where}: an inter-machine "
            "communication problem; the groups are reported for network diagnosis"
        ),
    )
