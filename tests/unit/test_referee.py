"""Referee replay's pure parts (:mod:`scout_core.replay.referee` and its wire format):
the trigger, the deterministic choice of the referee, the header and payload validation,
the decision, the records it gives and what the checkpoint gate reads from it."""

from __future__ import annotations

import itertools

import pytest
import torch

from scout_core.checkpoint.catalog import round_outcome
from scout_core.decision.c3 import C3Result
from scout_core.decision.gate import Outcome
from scout_core.replay.referee import (
    NO_THIRD,
    RefereePhase,
    apply_finding,
    choose_referee,
    decide,
    wants_referee,
)
from scout_core.replay.referee_wire import (
    HEADER_WORDS,
    Expected,
    Plan,
    Refusal,
    Shipment,
    check_payload,
    make_header,
    read_header,
    read_result,
    result_words,
)
from scout_core.replay.runner import RoundOutcome
from scout_core.replay.schedule import HIDDEN, Recipe
from scout_core.replay.verdicts import VerdictMaker
from scout_core.vocabulary import Mode, Status

PAIR = (0, 2)
RECIPE = Recipe(HIDDEN, "layers.1", 1)
NAME = RECIPE.name


# -- the trigger ------------------------------------------------------------------------


def _result(leaf: str, values: tuple[int | None, ...], ranks: tuple[int, ...] = PAIR) -> C3Result:
    agree = len(set(values)) == 1 and None not in values
    return C3Result(
        surface=f"{NAME}/{leaf}",
        mode=Mode.EXACT,
        status=Status.AGREE if agree else Status.INCONCLUSIVE,
        bitmap=(False,) * len(ranks),
        evidence=values,
        ranks=ranks,
    )


def _results(**over: tuple[int | None, ...]) -> dict[str, C3Result]:
    base: dict[str, tuple[int | None, ...]] = {
        "received": (7, 7),
        "params": (8, 8),
        "shard": (9, 9),
        "forward": (10, 11),
        "input_grad": (12, 12),
        "param_grad": (13, 13),
        "gap": (0, 0),
    }
    base.update(over)
    return {f"{NAME}/{k}": _result(k, v) for k, v in base.items()}


def test_a_pair_asks_only_for_a_computed_surface_on_equal_inputs_and_parameters() -> None:
    assert wants_referee(NAME, _results(), True) == ("forward",)
    both = _results(param_grad=(1, 2))
    assert wants_referee(NAME, both, True) == ("forward", "param_grad")
    assert wants_referee(NAME, _results(), False) == ()  # not ready
    assert wants_referee(NAME, _results(received=(7, 6)), True) == ()  # other inputs
    assert wants_referee(NAME, _results(params=(8, 5)), True) == ()  # other parameters
    assert wants_referee(NAME, _results(shard=(9, 1)), True) == ()  # other shards
    assert wants_referee(NAME, _results(gap=(0, 3)), True) == ()  # evidence missing
    assert wants_referee(NAME, _results(forward=(10, None)), True) == ()
    assert wants_referee(NAME, _results(forward=(10, 10)), True) == ()  # all agree
    trio = {f"{NAME}/forward": _result("forward", (1, 1, 2), (0, 1, 2))}
    trio[f"{NAME}/gap"] = _result("gap", (0, 0, 0), (0, 1, 2))
    assert wants_referee(NAME, trio, True) == ()  # three copies: the vote decides


# -- the choice -------------------------------------------------------------------------

TWO_BY_TWO = [(0, 2), (1, 3)]  # HSDP 2 x 2 and DP 2 x TP 2 replica pairs


def test_the_referee_is_the_next_group_at_the_sources_position() -> None:
    keys = dict.fromkeys(range(4), 99)
    asking = {0: True, 2: True, 1: False, 3: False}
    assert choose_referee(TWO_BY_TWO, (0, 2), 0, keys, asking) == 1
    assert choose_referee(TWO_BY_TWO, (0, 2), 2, keys, asking) == 3
    other = {0: False, 2: False, 1: True, 3: True}
    assert choose_referee(TWO_BY_TWO, (1, 3), 1, keys, other) == 0  # wraps round
    assert choose_referee(TWO_BY_TWO, (1, 3), 3, keys, other) == 2
    six = [(0, 3), (1, 4), (2, 5)]
    flags = {r: r in (1, 4) for r in range(6)}
    assert choose_referee(six, (1, 4), 4, dict.fromkeys(range(6), 5), flags) == 5


def test_every_rank_derives_the_same_referee_from_the_same_table() -> None:
    keys = {0: 1, 1: 1, 2: 1, 3: 1, 4: 1, 5: 1}
    six = [(0, 3), (1, 4), (2, 5)]
    flags = {r: r in (0, 3) for r in range(6)}
    picks = set()
    for order in itertools.permutations(range(6)):
        k = {r: keys[r] for r in order}
        f = {r: flags[r] for r in order}
        picks.add(choose_referee(six, (0, 3), 3, k, f))
    assert picks == {4}


def test_no_referee_of_other_work_or_from_a_group_that_asks_too() -> None:
    asking = {0: True, 2: True, 1: False, 3: False}
    keys = {0: 5, 2: 5, 1: 6, 3: 5}
    assert choose_referee(TWO_BY_TWO, (0, 2), 0, keys, asking) == 3  # 1 replayed other work
    keys = {0: 5, 2: 5, 1: None, 3: None}
    assert choose_referee(TWO_BY_TWO, (0, 2), 0, keys, asking) is None  # nothing replayed
    both = dict.fromkeys(range(4), True)
    assert choose_referee(TWO_BY_TWO, (0, 2), 0, dict.fromkeys(range(4), 5), both) is None
    assert choose_referee([(0, 1)], (0, 1), 0, {0: 1, 1: 1}, {0: True, 1: True}) is None
    mixed = {0: 5, 2: 6, 1: 5, 3: 5}  # the pair itself replayed different work
    assert choose_referee(TWO_BY_TWO, (0, 2), 0, mixed, asking) is None


# -- the wire ---------------------------------------------------------------------------


def _shipment() -> Shipment:
    gen = torch.Generator().manual_seed(0)
    return Shipment(
        step=7,
        digest=(1 << 64) - 3,
        threads=2,
        params={"fc.weight": torch.randn(4, 3, generator=gen), "fc.bias": torch.randn(4)},
        inputs=[torch.randn(2, 3, generator=gen), torch.arange(6).reshape(2, 3)],
        grads=[torch.randn(2, 4, generator=gen)],
        rng={"cpu": torch.randint(0, 255, (16,), dtype=torch.uint8, generator=gen)},
    )


def _expected(ship: Shipment) -> Expected:
    return Expected(
        step=ship.step,
        digest=ship.digest,
        params={k: (v.dtype, tuple(v.shape)) for k, v in ship.params.items()},
        inputs=[(t.dtype, tuple(t.shape)) for t in ship.inputs],
        grads=[(t.dtype, tuple(t.shape)) for t in ship.grads],
        rng={k: (v.dtype, tuple(v.shape)) for k, v in ship.rng.items()},
    )


def _payload(ship: Shipment) -> torch.Tensor:
    parts = [t.contiguous().reshape(-1).view(torch.uint8) for t in ship.tensors()]
    blob = torch.frombuffer(bytearray(ship.names()), dtype=torch.uint8)
    return torch.cat([*parts, blob])


def test_a_shipment_round_trips_through_the_header_and_payload() -> None:
    ship = _shipment()
    words, nbytes = make_header(ship)
    assert len(words) == HEADER_WORDS
    plan = read_header(words, _expected(ship), max_bytes=1 << 20)
    assert isinstance(plan, Plan), plan
    assert plan.nbytes == nbytes and plan.threads == 2
    parts = check_payload(_payload(ship), plan, _expected(ship))
    assert not isinstance(parts, str), parts
    params, inputs, grads, rng = parts
    assert set(params) == set(ship.params)
    for k, v in ship.params.items():
        assert torch.equal(params[k], v)
    assert all(torch.equal(a, b) for a, b in zip(inputs, ship.inputs, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(grads, ship.grads, strict=True))
    assert torch.equal(rng["cpu"], ship.rng["cpu"])


def _refused(words: list[int], expected: Expected, max_bytes: int = 1 << 20) -> str:
    got = read_header(words, expected, max_bytes=max_bytes)
    assert isinstance(got, str), got
    return got


def test_the_header_is_validated_against_the_referees_own_round() -> None:
    ship = _shipment()
    exp = _expected(ship)
    words, _ = make_header(ship)
    assert "readiness" in _refused(words, Expected(**{**exp.__dict__, "digest": 5}))
    assert "readiness" in _refused(words, Expected(**{**exp.__dict__, "step": 8}))
    other = Expected(**{**exp.__dict__, "inputs": [(torch.float64, (2, 3)), exp.inputs[1]]})
    assert "dtype or shape" in _refused(words, other)
    shape = Expected(**{**exp.__dict__, "grads": [(torch.float32, (2, 5))]})
    assert "dtype or shape" in _refused(words, shape)
    fewer = Expected(**{**exp.__dict__, "rng": {}})
    assert "counts" in _refused(words, fewer)
    assert "exceeds the cap" in _refused(words, exp, max_bytes=10)
    bad = list(words)
    bad[10] += 4  # a byte count that its tensors do not add up to
    assert "byte count" in _refused(bad, exp)
    bad = list(words)
    bad[16] = 99  # no such dtype code
    assert "dtype code" in _refused(bad, exp)
    bad = list(words)
    bad[0] = 1
    assert _refused(bad, exp) == "not a referee header"
    refusal, n = make_header(None, Refusal.NOT_SHIPPED)
    assert n == 0 and "source refused" in _refused(refusal, exp)


def test_the_payload_is_validated_against_its_header() -> None:
    ship = _shipment()
    exp = _expected(ship)
    plan = read_header(make_header(ship)[0], exp, max_bytes=1 << 20)
    assert isinstance(plan, Plan)
    buf = _payload(ship)
    assert "size" in str(check_payload(buf[:-1], plan, exp))
    tampered = buf.clone()
    tampered[-3] ^= 1  # the name block no longer matches the header's digest
    assert "name block" in str(check_payload(tampered, plan, exp))
    renamed = Expected(**{**exp.__dict__, "params": {"fc.weight": exp.params["fc.weight"]}})
    assert "by name" in str(check_payload(buf, plan, renamed))
    reshaped = dict(exp.params)
    reshaped["fc.bias"] = (torch.float32, (5,))
    wrong = Expected(**{**exp.__dict__, "params": reshaped})
    assert "fc.bias" in str(check_payload(buf, plan, wrong))


def test_a_shipment_that_does_not_fit_the_header_is_sent_as_a_refusal() -> None:
    ship = _shipment()
    ship.params = {f"p{i}": torch.zeros(1) for i in range(200)}
    words, n = make_header(ship)
    assert n == 0 and words[11] == Refusal.NOT_SHIPPED
    ship = _shipment()
    ship.inputs = [torch.zeros(1, 1, 1, 1, 1, 1, 1)]  # seven dimensions
    assert make_header(ship)[1] == 0


def test_the_referees_answer_round_trips_with_high_bit_signatures() -> None:
    values = {"forward": (1 << 64) - 1, "input_grad": 5, "param_grad": None}
    assert read_result(result_words(values, Refusal.NONE)) == values
    assert "refused" in str(read_result(result_words(None, Refusal.RAISED)))
    assert "malformed" in str(read_result([0] * 8))


# -- the decision -----------------------------------------------------------------------

PAIR_VALUES = {"forward": (10, 11), "input_grad": (12, 12), "param_grad": (13, 13)}


def test_the_copy_the_referee_matches_is_healthy_and_the_other_is_named() -> None:
    found = decide(
        PAIR, ("forward",), PAIR_VALUES, 1, {"forward": 11, "input_grad": 12, "param_grad": 13}
    )
    assert (found.culprit, found.healthy, found.referee) == (0, 2, 1)
    assert found.signatures == {
        0: {"forward": 10, "input_grad": 12, "param_grad": 13},
        2: {"forward": 11, "input_grad": 12, "param_grad": 13},
        1: {"forward": 11, "input_grad": 12, "param_grad": 13},
    }
    found = decide(
        PAIR, ("forward",), PAIR_VALUES, 3, {"forward": 10, "input_grad": 12, "param_grad": 13}
    )
    assert (found.culprit, found.healthy) == (2, 0)


def test_a_referee_matching_neither_copy_names_no_one() -> None:
    neither = {"forward": 99, "input_grad": 12, "param_grad": 13}
    found = decide(PAIR, ("forward",), PAIR_VALUES, 1, neither)
    assert found.culprit is None and "neither" in found.reason and 1 in found.signatures
    # it matches rank 2 where they differ, but not where the pair agrees: untrustworthy
    odd = {"forward": 11, "input_grad": 40, "param_grad": 13}
    assert decide(PAIR, ("forward",), PAIR_VALUES, 1, odd).culprit is None
    assert decide(PAIR, ("forward",), PAIR_VALUES, None, NO_THIRD).culprit is None
    late = decide(PAIR, ("forward",), PAIR_VALUES, 1, "referee rank 1 did not answer: x")
    assert late.culprit is None and late.referee == 1 and "did not answer" in late.reason


def _outcome() -> RoundOutcome:
    return RoundOutcome(RECIPE, 5, PAIR, True, _results(), source=0)


def _maker() -> VerdictMaker:
    return VerdictMaker(
        run_id="t",
        hosts={r: f"h{r}" for r in range(4)},
        rounds=2,
        min_excess_s=0.05,
        min_ratio=1.5,
        peer_kind="replica",
    )


def test_a_refereed_round_is_a_rank_scoped_sdc_and_a_localized_sdc_for_the_gate() -> None:
    outcome = _outcome()
    assert round_outcome(outcome) is Outcome.INCONCLUSIVE  # two copies, no majority
    found = decide(
        PAIR, ("forward",), PAIR_VALUES, 1, {"forward": 11, "input_grad": 12, "param_grad": 13}
    )
    apply_finding(outcome, found)
    assert round_outcome(outcome) is Outcome.SDC
    records = [r for r in _maker().judge(outcome) if r.failure is not None]
    assert len(records) == 1, records
    rec = records[0]
    assert (rec.surface, rec.scope.value, rec.status.value) == (
        f"{NAME}/forward",
        "rank",
        "attributed",
    )
    assert rec.outliers == (0,) and rec.group == PAIR and rec.hosts == ("h0",)
    assert rec.detail["referee"] == 1 and rec.detail["healthy"] == 2
    assert rec.detail["signatures"] == {"0": f"{10:016x}", "2": f"{11:016x}", "1": f"{11:016x}"}


def test_an_unsettled_round_stays_group_scope_with_the_reason() -> None:
    outcome = _outcome()
    apply_finding(outcome, decide(PAIR, ("forward",), PAIR_VALUES, None, NO_THIRD))
    assert round_outcome(outcome) is Outcome.INCONCLUSIVE
    records = [r for r in _maker().judge(outcome) if r.failure is not None]
    assert len(records) == 1
    rec = records[0]
    assert (rec.scope.value, rec.status.value, rec.outliers) == ("group", "inconclusive", ())
    assert rec.detail["reason"] == NO_THIRD and rec.detail["referee"] is None


def test_a_pair_alone_in_its_pool_gets_the_no_referee_reason_without_talking() -> None:
    desk = RefereePhase(0, [PAIR], {})
    outcome = _outcome()
    assert outcome.pool is None
    found = desk.settle(outcome, ("forward",), runner=None)  # type: ignore[arg-type]
    assert found is not None and found.culprit is None and found.reason == NO_THIRD
    assert desk.settle(outcome, (), runner=None) is None  # type: ignore[arg-type]


@pytest.mark.parametrize("bits", [0, 1])
def test_a_healthy_pool_settles_nothing(bits: int) -> None:
    from scout_core.decision.pools import PoolTiming

    desk = RefereePhase(1, TWO_BY_TWO, {})
    outcome = _outcome()
    outcome.pool = PoolTiming((0, 1, 2, 3), (5,) * 4, (0.1,) * 4, (False,) * 4)
    assert desk.settle(outcome, (), runner=None) is None  # type: ignore[arg-type]
    # A pair that asks with no referee group on this rank: a reason, no culprit.
    outcome.pool = PoolTiming((0, 1, 2, 3), (5,) * 4, (0.1,) * 4, (True, bool(bits), True, False))
    desk0 = RefereePhase(0, TWO_BY_TWO, {})
    found = desk0.settle(outcome, ("forward",), runner=None)  # type: ignore[arg-type]
    assert found is not None and found.culprit is None


# -- what a referee checks a shipment against --------------------------------------------


def _round_fields(
    path: str, index: int, dim: int = 8, *, cls: type | None = None
) -> tuple[int, int]:
    """The readiness digest and the referee digest of a round of block ``path`` (a
    :class:`Block`, or ``cls``)."""
    from scout_core.integration.adapter import ModuleRef
    from scout_core.replay.capture import Capture
    from scout_core.replay.readiness import digest_of, readiness_fields, referee_fields
    from scout_core.testing.models import Block

    torch.manual_seed(index)  # other weights: the digests cover metadata, not values
    ref = ModuleRef(path, (cls or Block)(dim))
    x = torch.randn(2, 3, dim, requires_grad=True)
    cap = Capture(path, 4, [x], None, (True,), {"cpu": torch.get_rng_state()}, (True,))
    cap.grads = [torch.randn(2, 3, dim)]
    recipe = Recipe(HIDDEN, path, index)
    fields = readiness_fields(recipe, 5, ref, cap, variants=(0.1, 1.0, 10.0), stack="s")
    return digest_of(fields), digest_of(referee_fields(fields, recipe, ref))


def test_a_referee_in_another_pipeline_stage_checks_the_same_work_not_the_same_path() -> None:
    """Two pipeline stages name the same block class differently (``layers.1`` in stage
    0, ``layers.3`` in stage 1): their readiness digests differ (peers of one stage must
    agree on the path), their referee digests do not, and another shape or class still
    changes the referee digest."""
    ready0, referee0 = _round_fields("layers.1", 1)
    ready1, referee1 = _round_fields("layers.3", 1)
    assert ready0 != ready1
    assert referee0 == referee1
    assert _round_fields("layers.3", 1, dim=16)[1] != referee0

    from scout_core.testing.models import Block

    class OtherBlock(Block):  # the same parameters, another class: other work
        pass

    assert _round_fields("layers.3", 1, cls=OtherBlock)[1] != referee0
    assert _round_fields("layers.1", 1)[1] == referee0  # the same round: the same digest
