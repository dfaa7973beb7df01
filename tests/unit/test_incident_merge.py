"""The incident merger as a pure function: one window's records in, incidents out.

The records are the ones real runs write (their surfaces, groups and detail keys),
built by hand so each rule is checked alone: a corrupted HSDP shard and its partner
group, an MoE expert's corrupted weights and the partner that received its output,
coupled ranks the records cannot tell apart, stragglers, and a failure that keeps
recurring (one incident, revised).
"""

from __future__ import annotations

from typing import Any

from scout_core.incident_merge import coupled_partners
from scout_core.records.evidence import load_report
from scout_core.records.incidents import MAX_IDS, IncidentBook, merge_window
from scout_core.records.record import INCIDENT_SCHEMA, VERDICT_SCHEMA, Record
from scout_core.topology.mesh import MeshLayout
from scout_core.vocabulary import Failure, Mode, Scope, Status

HSDP = coupled_partners(MeshLayout.from_order("fsdp-dp", fsdp=2, dp=3))  # shard pairs 0-1 ...
MOE = coupled_partners(MeshLayout.from_order("ep-dp", ep=2, dp=3))  # expert pairs 0-1 ...
DDP = coupled_partners(MeshLayout.from_order("dp", dp=4))  # nobody is coupled


def sdc(step: int, surface: str, group: tuple[int, ...], culprit: int, **over: Any) -> Record:
    fields: dict[str, Any] = {
        "schema": VERDICT_SCHEMA,
        "run_id": "r",
        "time": 100.0 + step,
        "step": step,
        "surface": surface,
        "mode": Mode.EXACT,
        "status": Status.ATTRIBUTED,
        "failure": Failure.SDC,
        "group": group,
        "outliers": (culprit,),
        "scope": Scope.RANK,
        "hosts": (f"node{culprit}",),
        "detail": {"recipe": "hidden", "module": surface.split("/")[1]},
    }
    fields.update(over)
    return Record(**fields)


def inconclusive(step: int, surface: str, group: tuple[int, ...], **detail: Any) -> Record:
    return sdc(
        step,
        surface,
        group,
        group[0],
        status=Status.INCONCLUSIVE,
        outliers=(),
        failure=detail.pop("failure", None),
        scope=Scope.GROUP,
        hosts=(),
        detail={"recipe": "hidden", "module": surface.split("/")[1], **detail},
    )


def test_a_corrupted_hsdp_shard_is_one_incident_that_explains_the_partner_group() -> None:
    mine = [
        sdc(5, "layer/layers.1/shard", (1, 3, 5), 3),
        sdc(5, "layer/layers.1/params", (1, 3, 5), 3),
        sdc(5, "layer/layers.1/forward", (1, 3, 5), 3),
    ]
    partner = inconclusive(
        5,
        "layer/layers.1/params",
        (0, 2, 4),
        reason="local shards agree but gathered parameters differ: a shard partner's shard differs",
        differing=[2],
    )
    (found,) = merge_window([partner, *mine], HSDP)
    assert (found.failure, found.culprits, found.scope) == (Failure.SDC, (3,), Scope.RANK)
    assert [r.id for r in found.corroborating] == sorted(
        (r.id for r in mine), key=lambda i: next(r.surface for r in mine if r.id == i)
    )
    assert [r.id for r in found.explained] == [partner.id]
    (incident,) = IncidentBook("r").add([found])
    assert incident.schema == INCIDENT_SCHEMA and incident.outliers == (3,)
    assert incident.group == (0, 1, 2, 3, 4, 5) and incident.hosts == ("node3",)
    assert incident.detail["explained"] == [partner.id]
    assert incident.detail["summary"].startswith("SDC on rank 3 (node3) at step 5:")


def test_the_moe_partner_that_only_received_corrupted_output_is_not_named() -> None:
    culprit = [
        sdc(1, "layer/layers.1/params", (0, 2, 4), 4),
        sdc(1, "layer/layers.1/forward", (0, 2, 4), 4),
        sdc(1, "layer/layers.1/param_grad", (0, 2, 4), 4),
    ]
    receiver = [
        sdc(1, "layer/layers.1/forward", (1, 3, 5), 5),
        sdc(1, "layer/layers.1/input_grad", (1, 3, 5), 5),
    ]
    (found,) = merge_window(receiver + culprit, MOE)
    assert found.culprits == (4,) and found.scope is Scope.RANK
    assert {r.id for r in found.explained} == {r.id for r in receiver}
    # Without the coupling (DDP-like partners) both would be named, each on its own.
    assert sorted(f.culprits for f in merge_window(receiver + culprit, DDP)) == [(4,), (5,)]


def test_coupled_ranks_with_no_state_evidence_are_one_group_incident() -> None:
    both = [
        sdc(2, "layer/layers.0/forward", (0, 2, 4), 4),
        sdc(2, "layer/layers.0/forward", (1, 3, 5), 5),
    ]
    (found,) = merge_window(both, MOE)
    assert found.culprits == () and found.scope is Scope.GROUP
    assert found.about == (4, 5)
    (incident,) = IncidentBook("r").add([found])
    assert incident.outliers == () and "cannot tell which" in incident.detail["summary"]


def test_unrelated_inconclusive_records_stand_alone_or_make_no_incident() -> None:
    no_majority = inconclusive(
        3, "layer/layers.2/forward", (0, 2), failure=Failure.SDC, reason="no strict majority"
    )
    not_ready = inconclusive(3, "layer/layers.2/ready", (1, 3), reason="capture missing")
    (found,) = merge_window([no_majority, not_ready], HSDP)
    assert (found.failure, found.culprits, found.group) == (Failure.SDC, (), {0, 2})
    assert merge_window([not_ready], HSDP) == []


def test_stragglers_and_a_recurring_failure_are_one_incident_revised() -> None:
    def slow(step: int) -> Record:
        return sdc(
            step,
            "layer/layers.1/t_M",
            (0, 1, 2, 3),
            2,
            mode=Mode.STATISTICAL,
            failure=Failure.STRAGGLER,
            detail={"median_s": 0.01},
        )

    book = IncidentBook("r")
    first = book.add(merge_window([slow(4)], DDP))
    second = book.add(merge_window([slow(5)], DDP))
    assert len(first) == len(second) == 1 and len(book) == 1
    a, b = first[0], second[0]
    assert a.failure is Failure.STRAGGLER and a.outliers == (2,)
    assert (b.step, b.detail["first_step"], b.detail["last_step"]) == (4, 4, 5)
    assert b.detail["key"] == a.detail["key"] and b.detail["revision"] == 1
    assert b.detail["supersedes"] == a.id
    assert b.detail["corroborating"] == [slow(4).id, slow(5).id]
    assert "steps 4-5" in b.detail["summary"]


def test_a_revised_incident_names_every_surface_it_was_seen_on() -> None:
    # A recurring SDC moves through the layers as the hidden recipe rotates; the summary
    # names every surface of the incident's steps, not only the latest step's.
    book = IncidentBook("r")
    for step, layer in ((9, 1), (10, 2), (11, 1)):
        (latest,) = book.add(
            merge_window([sdc(step, f"layer/blocks.{layer}/forward", (0, 1, 2), 2)], DDP)
        )
    assert latest.detail["summary"].endswith(
        "at steps 9-11: layer/blocks.1/forward, layer/blocks.2/forward"
    )
    for step, layer in ((12, 3), (13, 0)):
        (latest,) = book.add(
            merge_window([sdc(step, f"layer/blocks.{layer}/forward", (0, 1, 2), 2)], DDP)
        )
    assert latest.detail["summary"].endswith(
        "at steps 9-13: layer/blocks.0/forward, layer/blocks.1/forward, "
        "layer/blocks.2/forward and 1 more"
    )


def test_readers_keep_the_newest_revision(tmp_path: Any) -> None:
    from scout_core.records.evidence import EvidenceWriter

    book = IncidentBook("r")
    revisions = [
        book.add(merge_window([sdc(s, "optimizer/update", (0, 1, 2), 1)], DDP))[0] for s in range(3)
    ]
    with EvidenceWriter(tmp_path, 0, run_id="r") as w:
        for r in revisions:
            w.write(r)
    (current,) = load_report(tmp_path).incidents()
    assert current.id == revisions[-1].id and current.detail["revision"] == 2


def test_an_incident_cites_a_bounded_number_of_records() -> None:
    book = IncidentBook("r")
    for step in range(MAX_IDS + 10):
        (last,) = book.add(merge_window([sdc(step, "optimizer/update", (0, 1, 2), 1)], DDP))
    assert len(last.detail["corroborating"]) == MAX_IDS
    assert last.detail["omitted"] == 10
