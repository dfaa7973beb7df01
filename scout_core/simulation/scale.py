"""SCOUT at scale without a cluster: grouping, C3 and diagnosis on one layout, timed.

Contract: :func:`simulate` takes a layout (``"TP8 PP16 DP128"``) and, in one process, does
what every rank of such a job would do with synthetic evidence and a planted culprit
(grouping, C3, cross-PG diagnosis, the observers' wait-for graph). Each part is timed and
each planted culprit must be found exactly (goal: grouping plus one decision at 16,384
ranks in under a second); :class:`Traffic` gives the diagnostic bytes per rank and round.
The parts and what they check: docs/scale.md.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from scout_core.decision.c3 import DEFAULT_KAPPA, ROW_WORDS, decide_exact, decide_statistical
from scout_core.decision.diagnosis import DiagnosisKind, SlowGroup, diagnose
from scout_core.simulation.layouts import parse_layout
from scout_core.topology.mesh import AXES, Axis, MeshLayout
from scout_core.vocabulary import Status

__all__ = ["ROW_BYTES", "Simulation", "Traffic", "simulate"]

ROW_BYTES = ROW_WORDS * 8
"""Bytes of one peer's C3 row on the wire."""
_BASE_S = 0.010
_T = TypeVar("_T")


@dataclass(frozen=True)
class Traffic:
    """Diagnostic bytes one rank receives per round."""

    c3_round: int
    """A C3 round in the rank's peer group: ``N x ROW_BYTES``."""
    observer_world: int
    """An observer round compared across the whole job: ``W x ROW_BYTES``."""
    observer_peer_group: int
    """An observer round compared within peer groups: ``N x ROW_BYTES``."""


@dataclass
class Simulation:
    """What :func:`simulate` built, decided and measured for one layout."""

    layout: str
    world: int
    peer_kind: str
    peer_degree: int
    groups: int
    hosts: int
    culprit: int
    timings_s: dict[str, float] = field(default_factory=dict)
    checks: dict[str, bool] = field(default_factory=dict)
    diagnoses: dict[str, str] = field(default_factory=dict)
    """Scenario -> diagnosis kind found, or why the scenario does not apply."""
    traffic: Traffic | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every check passed (each planted culprit found exactly)."""
        return all(self.checks.values())

    @property
    def goal_s(self) -> float:
        """Grouping plus one decision: the number the 1-second goal is about."""
        return self.timings_s["group"] + self.timings_s["exact"]

    @property
    def hang_goal_s(self) -> float:
        """Grouping plus the wait-for graph and its roots: a hang's 1-second goal."""
        return self.timings_s["group"] + self.timings_s["wait_for"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "layout": self.layout,
            "world": self.world,
            "peer_kind": self.peer_kind,
            "peer_degree": self.peer_degree,
            "groups": self.groups,
            "hosts": self.hosts,
            "culprit": self.culprit,
            "timings_s": dict(self.timings_s),
            "goal_s": self.goal_s,
            "hang_goal_s": self.hang_goal_s,
            "checks": dict(self.checks),
            "ok": self.ok,
            "diagnoses": dict(self.diagnoses),
            "traffic_bytes_per_rank": None if self.traffic is None else vars(self.traffic),
            "notes": list(self.notes),
        }


def _timed(out: dict[str, float], name: str, fn: Callable[[], _T]) -> _T:
    start = time.perf_counter()
    value = fn()
    out[name] = time.perf_counter() - start
    return value


def simulate(
    layout: str | MeshLayout,
    *,
    gpus_per_host: int = 8,
    kappa: float = DEFAULT_KAPPA,
    seed: int = 0,
) -> Simulation:
    """Build, decide and diagnose ``layout`` with a culprit planted at random (``seed``)."""
    if gpus_per_host < 1:
        raise ValueError(f"gpus_per_host must be >= 1, got {gpus_per_host}")
    text = layout if isinstance(layout, str) else repr(layout.sizes)
    timings: dict[str, float] = {}
    mesh = _timed(
        timings, "parse", lambda: parse_layout(layout) if isinstance(layout, str) else layout
    )
    world = mesh.world_size
    ranks = mesh.ranks
    rng = random.Random(seed)
    culprit = ranks[rng.randrange(world)]

    def group() -> tuple[list[tuple[int, ...]], dict[int, int]]:
        mesh.coordinates()  # every rank's address
        groups = mesh.groups("peer")
        return groups, {r: i for i, g in enumerate(groups) for r in g}

    groups, group_of = _timed(timings, "group", group)
    peers = groups[group_of[culprit]]
    degree = mesh.size(Axis.D if mesh.peer_kind == "replica" else Axis.S)
    sim = Simulation(
        layout=text,
        world=world,
        peer_kind=mesh.peer_kind,
        peer_degree=degree,
        groups=len(groups),
        hosts=len({r // gpus_per_host for r in ranks}),
        culprit=culprit,
        timings_s=timings,
    )
    sim.checks["groups partition the job"] = (
        len(group_of) == world and sum(map(len, groups)) == world
    )
    sim.checks["every group has the peer degree"] = {len(g) for g in groups} == {degree}
    sim.checks["culprit's group matches peer_group()"] = mesh.peer_group(culprit).ranks == peers

    at = peers.index(culprit)
    signature = rng.getrandbits(64)
    signatures = [signature] * len(peers)
    signatures[at] ^= 1 << rng.randrange(52)  # one flipped bit
    exact = _timed(timings, "exact", lambda: decide_exact(signatures))
    can_name = len(peers) >= 3  # two peers can disagree but not say which is wrong
    if can_name:
        sim.checks["exact C3 names the culprit"] = _names(exact.status, exact.bitmap, at)
    else:
        sim.notes.append(
            f"peer groups of {len(peers)}: C3 cannot name a rank (needs 3 or more peers)"
        )

    # Healthy timings spread evenly over ±2% of 10 ms, in random order: their largest
    # deviation is about twice their MAD, far inside κ MADs, so a clean peer is never
    # flagged by chance and the check is exact.
    n = len(peers)
    taus = [_BASE_S * (1 + 0.02 * (2 * i / max(n - 1, 1) - 1)) for i in range(n)]
    rng.shuffle(taus)
    taus[at] = 3 * _BASE_S
    stat = _timed(timings, "statistical", lambda: decide_statistical(taus, kappa))
    if can_name:
        sim.checks["statistical C3 names the culprit"] = _names(stat.status, stat.bitmap, at)

    def every_group() -> int:
        flagged = 0
        for members in groups:
            values = signatures if members == peers else [signature] * len(members)
            flagged += decide_exact(values).status is Status.ATTRIBUTED
        return flagged

    flagged = _timed(timings, "every_group", every_group)
    sim.checks["only the culprit's group attributes"] = flagged == int(can_name)
    _diagnoses(sim, mesh, groups, culprit=culprit, per_host=gpus_per_host)
    _hang(sim, mesh, groups, culprit)
    sim.traffic = Traffic(n * ROW_BYTES, world * ROW_BYTES, n * ROW_BYTES)
    return sim


def _names(status: Status, bitmap: Sequence[bool], at: int) -> bool:
    return status is Status.ATTRIBUTED and [i for i, b in enumerate(bitmap) if b] == [at]


def _diagnoses(
    sim: Simulation,
    mesh: MeshLayout,
    groups: list[tuple[int, ...]],
    *,
    culprit: int,
    per_host: int,
) -> None:
    """Plant slow groups around ``culprit``; check what :func:`diagnose` concludes."""

    def host(r: int) -> str:
        return f"host{r // per_host}"

    peers = mesh.peer_group(culprit).ranks
    intra = None
    for axis in mesh.order:  # fastest axes first: the likeliest to stay on one machine
        if axis is not Axis.D and mesh.size(axis) > 1:
            members = mesh.group_along(culprit, (axis,))
            if len({host(r) for r in members}) == 1:
                intra = SlowGroup(axis.value, members)
                break
    spans = len({host(r) for r in peers}) > 1
    inter = SlowGroup(mesh.peer_kind, peers) if spans else None
    used = {host(r) for r in peers}
    far = next((g for g in groups if not used & {host(r) for r in g}), None)
    scenarios: dict[str, tuple[list[SlowGroup | None], DiagnosisKind, tuple[int, ...]]] = {
        "machine_local": ([intra, inter], DiagnosisKind.MACHINE_LOCAL, (culprit,)),
        "intra_machine_comm": ([intra], DiagnosisKind.INTRA_MACHINE_COMM, ()),
        "inter_machine_comm": ([inter], DiagnosisKind.INTER_MACHINE_COMM, ()),
        "job_level": (
            [inter, None if far is None else SlowGroup(mesh.peer_kind, far)],
            DiagnosisKind.JOB_LEVEL,
            (),
        ),
    }
    total = 0.0
    for name, (planted, expected, named) in scenarios.items():
        if any(g is None for g in planted):
            sim.diagnoses[name] = "not applicable: no such group in this layout"
            continue
        slow = [g for g in planted if g is not None]
        hosts = {r: host(r) for g in slow for r in g.ranks}
        start = time.perf_counter()
        found = diagnose(slow, hosts)
        total += time.perf_counter() - start
        sim.diagnoses[name] = "none" if found is None else found.kind.value
        right = found is not None and found.kind is expected and found.ranks == named
        if expected is not DiagnosisKind.JOB_LEVEL and found is not None:
            right = right and host(culprit) in found.hosts
        sim.checks[f"diagnosis: {name}"] = right
    sim.timings_s["diagnosis"] = total


def _hang(
    sim: Simulation, mesh: MeshLayout, groups: Sequence[tuple[int, ...]], culprit: int
) -> None:
    """The observers' wait-for graph with the culprit frozen, timed."""
    from scout_core.observer.progress import Stage
    from scout_core.observer.waitfor import Position, WaitForGraph

    step = 3
    tp = set(mesh.group_along(culprit, [Axis.T])) if mesh.size(Axis.T) > 1 else {culprit}
    peer = set(mesh.axes_for("peer"))
    instance = set(mesh.group_along(culprit, [a for a in AXES if a not in peer]))
    positions: list[Position] = []
    for members in groups:
        for r in members:
            if r == culprit:
                positions.append(Position(r, step, Stage.IDLE, 30))
            elif r in tp:  # inside the TP all-reduce the culprit never joined
                op = ("tp", min(tp))
                positions.append(Position(r, step, Stage.COLLECTIVE, 31, {}, tuple(tp), op))
            elif r in instance:
                positions.append(Position(r, step, Stage.LAYER, 31))  # an unseen collective
            else:  # the peer group's gradient all-reduce, waiting for its member behind
                op = ("dp", members[0])
                positions.append(Position(r, step, Stage.COLLECTIVE, 60, {}, members, op))

    def build() -> tuple[list[frozenset[int]], list[int]]:
        graph = WaitForGraph(positions, mesh)
        roots = graph.roots_of(range(mesh.world_size))
        waiters = graph.waiters(culprit)
        graph.next_hops(culprit)  # every waiter's chain of waits, for the record
        return roots, waiters

    roots, waiters = _timed(sim.timings_s, "wait_for", build)
    sim.checks["hang: the graph's one root is the culprit"] = roots == [frozenset({culprit})]
    sim.checks["hang: every other rank waits for the culprit"] = len(waiters) == (
        mesh.world_size - 1
    )
