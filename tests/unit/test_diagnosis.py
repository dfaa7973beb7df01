"""Cross-PG validation: paper Figure 3 and one case per row of its diagnosis table."""

from __future__ import annotations

import pytest

from scout_core.decision.diagnosis import Diagnosis, DiagnosisKind, SlowGroup, diagnose
from scout_core.topology.mesh import MeshLayout
from scout_core.vocabulary import Scope

# Figure 3: the 4x2 DP-FSDP mesh of Figure 2 with TP degree 2, 16 ranks in two TP
# slices (r0..r7 and r8..r15). Each TP group {rk, rk+8} occupies one machine.
LAYOUT = MeshLayout.from_order("fsdp-dp-tp", fsdp=2, dp=4, tp=2)
HOSTS = {r: f"node{r % 8}" for r in range(16)}


def _tp(rank: int) -> SlowGroup:
    return SlowGroup("tp", LAYOUT.group_along(rank, ["tp"]))


def _fsdp(rank: int) -> SlowGroup:
    return SlowGroup("fsdp", LAYOUT.shard_group(rank))


def test_layout_matches_figure_3() -> None:
    assert _tp(4).ranks == (4, 12)
    assert _fsdp(4).ranks == (4, 5)
    assert {HOSTS[r] for r in _tp(4).ranks} == {"node4"}
    assert {HOSTS[r] for r in _fsdp(4).ranks} == {"node4", "node5"}


def test_figure_3_slow_fsdp_and_tp_meet_at_r4() -> None:
    result = diagnose([_fsdp(4), _tp(4)], HOSTS)
    assert result is not None
    assert result == Diagnosis(
        kind=DiagnosisKind.MACHINE_LOCAL,
        scope=Scope.MACHINE,
        hosts=("node4",),
        ranks=(4,),
        groups=(SlowGroup("fsdp", (4, 5)), SlowGroup("tp", (4, 12))),
        explanation=result.explanation,
    )
    assert "replace node4" in result.explanation


def test_row_1_several_slow_fsdp_groups_through_the_machine() -> None:
    # r4's and r12's shard groups both pass through node4, as does the slow TP group.
    result = diagnose([_tp(12), _fsdp(4), _fsdp(12)], HOSTS)
    assert result is not None
    assert result.kind is DiagnosisKind.MACHINE_LOCAL
    assert result.hosts == ("node4",)
    assert result.ranks == (4, 12)
    assert len(result.groups) == 3


def test_row_2_slow_tp_normal_fsdp_is_intra_machine() -> None:
    result = diagnose([_tp(4)], HOSTS)
    assert result is not None
    assert result.kind is DiagnosisKind.INTRA_MACHINE_COMM
    assert result.scope is Scope.MACHINE
    assert result.hosts == ("node4",)
    assert result.ranks == ()
    assert result.groups == (SlowGroup("tp", (4, 12)),)


def test_row_3_normal_tp_slow_fsdp_is_inter_machine() -> None:
    result = diagnose([_fsdp(4)], HOSTS)
    assert result is not None
    assert result.kind is DiagnosisKind.INTER_MACHINE_COMM
    assert result.scope is Scope.GROUP
    assert result.hosts == ("node4", "node5")
    assert result.ranks == ()
    assert result.groups == (SlowGroup("fsdp", (4, 5)),)


def test_row_3_groups_sharing_a_link_are_reported_together() -> None:
    # {r4,r5} and {r12,r13} both cross node4-node5: one inter-machine problem.
    result = diagnose([_fsdp(4), _fsdp(12)], HOSTS)
    assert result is not None
    assert result.kind is DiagnosisKind.INTER_MACHINE_COMM
    assert result.hosts == ("node4", "node5")
    assert result.ranks == ()
    assert [g.ranks for g in result.groups] == [(4, 5), (12, 13)]


def test_row_3_inter_groups_meeting_at_one_endpoint() -> None:
    replica = SlowGroup("replica", LAYOUT.replica_group(4))  # {0, 2, 4, 6}
    result = diagnose([_fsdp(4), replica], HOSTS)
    assert result is not None
    assert result.kind is DiagnosisKind.INTER_MACHINE_COMM
    assert result.hosts == ("node4",)
    assert result.ranks == (4,)


def test_row_4_independent_groups_across_machines_are_job_level() -> None:
    slow = [_fsdp(0), _fsdp(4), _fsdp(10)]  # node0-1, node4-5, node2-3: no shared machine
    result = diagnose(slow, HOSTS)
    assert result is not None
    assert result.kind is DiagnosisKind.JOB_LEVEL
    assert result.scope is Scope.JOB
    assert result.hosts == ("node0", "node1", "node2", "node3", "node4", "node5")
    assert result.ranks == ()
    assert len(result.groups) == 3


def test_slow_tp_on_two_machines_is_not_one_machine() -> None:
    result = diagnose([_tp(4), _tp(6)], HOSTS)
    assert result is not None
    assert result.kind is DiagnosisKind.JOB_LEVEL


def test_slow_tp_and_unrelated_fsdp_group_is_not_one_machine() -> None:
    result = diagnose([_tp(4), _fsdp(0)], HOSTS)
    assert result is not None
    assert result.kind is DiagnosisKind.JOB_LEVEL


def test_intra_is_decided_by_hosts_not_kind_name() -> None:
    # HSDP with the shard group inside one node: a slow "fsdp" group there is intra-machine.
    hosts = {0: "a", 1: "a", 2: "b", 3: "b"}
    result = diagnose([SlowGroup("fsdp", (0, 1))], hosts)
    assert result is not None
    assert result.kind is DiagnosisKind.INTRA_MACHINE_COMM
    assert result.hosts == ("a",)
    # A TP group spanning nodes is inter-machine.
    result = diagnose([SlowGroup("tp", (1, 2))], hosts)
    assert result is not None
    assert result.kind is DiagnosisKind.INTER_MACHINE_COMM


def test_nothing_slow_means_no_diagnosis() -> None:
    assert diagnose([], HOSTS) is None


def test_duplicates_and_order_do_not_matter() -> None:
    a = diagnose([_tp(4), _fsdp(4), _fsdp(4)], HOSTS)
    b = diagnose([_fsdp(4), _tp(4)], HOSTS)
    assert a == b
    assert SlowGroup("tp", (12, 4)) == SlowGroup("tp", (4, 12))


def test_missing_host_fails_loudly() -> None:
    with pytest.raises(ValueError, match=r"ranks \[12\]"):
        diagnose([_tp(4)], {r: h for r, h in HOSTS.items() if r != 12})


def test_bad_slow_groups_are_rejected() -> None:
    with pytest.raises(ValueError, match="no ranks"):
        SlowGroup("tp", ())
    with pytest.raises(ValueError, match="twice"):
        SlowGroup("tp", (1, 1))
