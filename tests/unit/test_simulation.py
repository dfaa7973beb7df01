"""``scout simulate``: the layout parser, every Table 2 layout, the checks, traffic and the CLI."""

from __future__ import annotations

import json

import pytest

from scout_core.cli.main import main
from scout_core.decision.c3 import Decision
from scout_core.errors import ConfigError
from scout_core.simulation import scale
from scout_core.simulation.layouts import LARGE, TABLE_2, parse_layout
from scout_core.simulation.scale import ROW_BYTES, simulate
from scout_core.vocabulary import Status

DIAGNOSES = ("machine_local", "intra_machine_comm", "inter_machine_comm", "job_level")


# -- the parser ----------------------------------------------------------------------------


def test_layout_strings_parse_in_any_order_and_case() -> None:
    layout = parse_layout("TP8 PP16 DP128")
    assert (layout.size("t"), layout.size("p"), layout.size("d")) == (8, 16, 128)
    assert parse_layout("dp128, pp16 tp8") == layout
    assert layout.world_size == 16384
    # Megatron order: tensor parallel fastest, so a TP group is 8 consecutive ranks.
    assert layout.group_along(0, ("t",)) == tuple(range(8))
    moe = parse_layout("PP12 EDP4 DP32")
    assert moe.size("e") == 4 and moe.peer_group(0).size == 32
    hsdp = parse_layout("FSDP4 DP2 CP2")
    assert (hsdp.size("s"), hsdp.size("d"), hsdp.size("c")) == (4, 2, 2)
    assert hsdp.peer_kind == "replica"


@pytest.mark.parametrize(
    ("text", "token"),
    [
        ("TP8 XP4 DP2", "'XP4'"),
        ("TP8 PP", "'PP'"),
        ("TP0 DP4", "'TP0'"),
        ("TP8 DP4 TP2", "'TP2'"),
        ("EP4 DP2 EDP2", "'EDP2'"),
        ("TP8 PP4x", "'PP4x'"),
        ("8TP DP2", "'8TP'"),
        ("TP-8", "'TP-8'"),
    ],
)
def test_parser_errors_name_the_bad_token(text: str, token: str) -> None:
    with pytest.raises(ConfigError, match=token):
        parse_layout(text)


def test_an_empty_layout_is_refused() -> None:
    with pytest.raises(ConfigError, match="empty layout"):
        parse_layout("  ,  ")


# -- every Table 2 layout, and 100k --------------------------------------------------------


@pytest.mark.parametrize("published", [*TABLE_2, LARGE], ids=lambda p: p.model)
def test_published_layouts_find_every_planted_culprit(published: object) -> None:
    from scout_core.simulation.layouts import PublishedLayout

    assert isinstance(published, PublishedLayout)
    sim = simulate(published.layout)
    assert sim.world == published.gpus
    assert sim.peer_kind == "replica"
    assert sim.peer_degree == published.peer_degree
    assert sim.groups == published.gpus // published.peer_degree
    assert sim.ok, {k: v for k, v in sim.checks.items() if not v}
    assert len(sim.checks) == 12  # 3 grouping, 2 C3, 1 job round, 4 diagnoses, 2 hang
    assert sim.diagnoses == {name: name for name in DIAGNOSES}
    assert sim.notes == []
    assert sim.traffic is not None
    assert sim.traffic.c3_round == published.peer_degree * ROW_BYTES
    assert sim.traffic.observer_world == published.gpus * ROW_BYTES
    assert sim.traffic.observer_peer_group == published.peer_degree * ROW_BYTES


def test_16k_grouping_plus_one_decision_is_under_a_second() -> None:
    sim = simulate("TP8 PP16 DP128")
    assert sim.ok
    assert sim.goal_s < 1.0  # a few ms on this machine; the goal is one second


def test_the_culprit_is_planted_by_seed() -> None:
    culprits = [simulate("TP4 PP8 DP24", seed=s).culprit for s in range(6)]
    assert culprits == [simulate("TP4 PP8 DP24", seed=s).culprit for s in range(6)]
    assert len(set(culprits)) > 1
    for seed in range(25):  # small groups are where a chance flag would show
        assert simulate("DP3 TP2", seed=seed).ok
        assert simulate("FSDP8", seed=seed).ok


def test_c3_traffic_does_not_grow_with_the_world() -> None:
    small = simulate("TP8 PP4 DP128")
    large = simulate("TP8 PP64 DP128")
    assert small.traffic is not None and large.traffic is not None
    assert large.world == 16 * small.world
    assert large.traffic.c3_round == small.traffic.c3_round == 128 * 1024
    assert large.traffic.observer_peer_group == small.traffic.observer_peer_group
    assert large.traffic.observer_world == 16 * small.traffic.observer_world


def test_layouts_that_cannot_name_a_rank_say_so() -> None:
    sim = simulate("DP2 TP4")
    assert sim.ok
    assert "C3 cannot name a rank" in sim.notes[0]
    assert "exact C3 names the culprit" not in sim.checks
    assert sim.diagnoses["job_level"].startswith("not applicable")
    # the wait-for graph needs no majority: a hang is named in pairs too
    assert sim.checks["hang: the graph's one root is the culprit"]
    assert sim.checks["hang: every other rank waits for the culprit"]


def test_a_hang_the_graph_cannot_trace_fails_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: the culprit's TP partners no longer say whom they wait for."""
    from scout_core.observer import waitfor

    real = waitfor.Position.members_in
    monkeypatch.setattr(waitfor.Position, "members_in", lambda self, layout: None)
    sim = simulate("TP4 PP2 DP8")
    assert not sim.checks["hang: the graph's one root is the culprit"]
    monkeypatch.setattr(waitfor.Position, "members_in", real)
    assert simulate("TP4 PP2 DP8").ok


def test_a_wrong_decision_fails_the_check(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def blind(values: object) -> Decision:
        assert isinstance(values, list)
        return Decision(Status.AGREE, (False,) * len(values))

    monkeypatch.setattr(scale, "decide_exact", blind)
    sim = simulate("TP4 PP8 DP24")
    assert not sim.ok
    assert not sim.checks["exact C3 names the culprit"]
    assert main(["simulate", "TP4 PP8 DP24"]) == 1
    assert "FAILED exact C3 names the culprit" in capsys.readouterr().out


# -- the command ---------------------------------------------------------------------------


def test_cli_json_and_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "TP8 PP16 DP128", "--json", "--seed", "3"]) == 0
    (data,) = json.loads(capsys.readouterr().out)
    assert data["world"] == 16384 and data["ok"] is True
    assert data["culprit"] == simulate("TP8 PP16 DP128", seed=3).culprit
    assert data["traffic_bytes_per_rank"]["observer_world"] == 16384 * 1024
    assert main(["simulate", "--table2"]) == 0
    out = capsys.readouterr().out
    for published in (*TABLE_2, LARGE):
        assert published.model in out and published.layout in out
    assert "NO" not in out.split()


def test_cli_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "TP8 QP2"]) == 2
    assert "'QP2'" in capsys.readouterr().err
    assert main(["simulate"]) == 2
    assert "--table2" in capsys.readouterr().err
