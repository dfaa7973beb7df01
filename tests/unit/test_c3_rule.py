"""The C3 decision rule on the paper's cases (§5, Algorithm 1), without a process group.

Also the parts of the C3 wire encoding that need no process group: how a
:class:`Surface` validates and encodes its value, and :attr:`C3Result.outliers`.
"""

from __future__ import annotations

import math
import struct

import pytest

from scout_core.decision.c3 import (
    C3Result,
    Decision,
    Surface,
    decide_exact,
    decide_statistical,
    robust_scale,
)
from scout_core.vocabulary import Mode, Status

A, B, C, D = 0xA, 0xB, 0xC, 0xD


def bits(*flags: int) -> tuple[bool, ...]:
    return tuple(bool(f) for f in flags)


# --------------------------------------------------------------------------- exact


def test_strict_majority_flags_the_minority() -> None:
    assert decide_exact([A, A, A, B]) == Decision(Status.ATTRIBUTED, bits(0, 0, 0, 1))
    assert decide_exact([B, A, A]) == Decision(Status.ATTRIBUTED, bits(1, 0, 0))


def test_all_equal_agrees() -> None:
    assert decide_exact([A, A, A, A, A]) == Decision(Status.AGREE, bits(0, 0, 0, 0, 0))


def test_two_rank_split_is_inconclusive() -> None:
    assert decide_exact([A, B]) == Decision(Status.INCONCLUSIVE, bits(0, 0))


def test_two_vs_two_is_inconclusive() -> None:
    assert decide_exact([A, B, A, B]) == Decision(Status.INCONCLUSIVE, bits(0, 0, 0, 0))


def test_several_minority_values_are_all_flagged() -> None:
    assert decide_exact([A, A, A, B, C]) == Decision(Status.ATTRIBUTED, bits(0, 0, 0, 1, 1))
    assert decide_exact([C, A, B, A, A]) == Decision(Status.ATTRIBUTED, bits(1, 0, 1, 0, 0))


def test_exactly_half_is_not_a_strict_majority() -> None:
    assert decide_exact([A, A, A, B, C, D]) == Decision(Status.INCONCLUSIVE, (False,) * 6)
    assert decide_exact([A, A, B, C]).status is Status.INCONCLUSIVE
    # one more vote for A makes it a strict majority of 7
    assert decide_exact([A, A, A, B, C, D, A]) == Decision(
        Status.ATTRIBUTED, bits(0, 0, 0, 1, 1, 1, 0)
    )


def test_all_distinct_is_inconclusive() -> None:
    assert decide_exact([A, B, C]) == Decision(Status.INCONCLUSIVE, bits(0, 0, 0))


def test_single_peer_agrees_and_empty_group_is_an_error() -> None:
    assert decide_exact([A]) == Decision(Status.AGREE, (False,))
    with pytest.raises(ValueError, match="at least one"):
        decide_exact([])


def test_exact_compares_word_tuples_and_big_unsigned_values() -> None:
    fp_ok, fp_bad = (1, 2, 3), (1, 2, 4)
    assert decide_exact([fp_ok, fp_bad, fp_ok]) == Decision(Status.ATTRIBUTED, bits(0, 1, 0))
    sig = 2**64 - 1
    assert decide_exact([sig, sig, sig - 1]) == Decision(Status.ATTRIBUTED, bits(0, 0, 1))


def test_exact_decision_does_not_depend_on_peer_order() -> None:
    values = [A, B, A, C, A]
    d = decide_exact(values)
    rotated = decide_exact(values[2:] + values[:2])
    assert rotated.bitmap == d.bitmap[2:] + d.bitmap[:2]
    assert rotated.status is d.status is Status.ATTRIBUTED


# --------------------------------------------------------------------------- robust scale


def test_robust_scale_is_the_unscaled_mad() -> None:
    # median 3, |x - 3| = [2, 1, 0, 1, 97] -> median 1 (no 1.4826 factor)
    assert robust_scale([1.0, 2.0, 3.0, 4.0, 100.0]) == 1.0
    # even N: m = 2.5, |x - m| = [1.5, 0.5, 0.5, 1.5] -> median 1
    assert robust_scale([2.0, 3.0, 1.0, 4.0]) == 1.0
    assert robust_scale([1.0, 3.0]) == 1.0


def test_robust_scale_falls_back_to_the_inner_iqr_when_mad_is_zero() -> None:
    values = [1.0, 1.0, 1.0, 1.0, 1.0, 5.0, 6.0, 9.0]
    # median 1; |x - 1| = [0]*5 + [4, 5, 8]: MAD 0. Inner quartiles:
    # q1 = x[ceil(1.75)] = x[2] = 1, q3 = x[floor(5.25)] = x[5] = 5.
    assert robust_scale(values) == 4.0


def test_robust_scale_falls_back_to_scaled_range_when_iqr_is_zero() -> None:
    # MAD 0 and inner IQR x[5] - x[2] = 0; range 8 / (2*8) = 0.5
    assert robust_scale([1.0] * 7 + [9.0]) == 0.5
    # N = 3: the inner quartiles are both the median, so the range path applies
    assert robust_scale([1.0, 1.0, 7.0]) == 1.0


def test_robust_scale_is_zero_only_when_all_equal() -> None:
    assert robust_scale([3.5]) == 0.0
    assert robust_scale([2.0, 2.0, 2.0, 2.0]) == 0.0
    tiny = 5e-324  # the smallest subnormal: range / 2N underflows to 0
    assert robust_scale([0.0, 0.0, 0.0, tiny]) == tiny


def test_robust_scale_rejects_empty_and_non_finite() -> None:
    with pytest.raises(ValueError, match="at least one"):
        robust_scale([])
    with pytest.raises(ValueError, match="finite"):
        robust_scale([1.0, math.nan])


# --------------------------------------------------------------------------- statistical


def test_all_equal_timings_agree() -> None:
    assert decide_statistical([2.0, 2.0, 2.0, 2.0], 5.0) == Decision(Status.AGREE, (False,) * 4)
    assert decide_statistical([0.25], 5.0) == Decision(Status.AGREE, (False,))


def test_lone_outlier_is_flagged() -> None:
    # median 10, MAD 0.1 -> limit 0.5; only 30 is beyond it
    taus = [10.0, 10.1, 9.9, 10.0, 30.0]
    assert decide_statistical(taus, 5.0) == Decision(Status.ATTRIBUTED, bits(0, 0, 0, 0, 1))


def test_fleet_wide_slowdown_is_not_flagged() -> None:
    healthy = [10.0, 10.1, 9.9, 10.0]
    slow = [3 * t for t in healthy]
    assert decide_statistical(healthy, 5.0) == Decision(Status.AGREE, (False,) * 4)
    assert decide_statistical(slow, 5.0) == Decision(Status.AGREE, (False,) * 4)


def test_mad_zero_uses_the_iqr_and_flags_beyond_kappa_iqr() -> None:
    values = [1.0, 1.0, 1.0, 1.0, 1.0, 5.0, 6.0, 9.0]  # m = 1, d = IQR = 4
    # kappa 1: limit 4 -> 6 (dev 5) and 9 (dev 8); 5 sits exactly on the limit
    assert decide_statistical(values, 1.0) == Decision(
        Status.ATTRIBUTED, bits(0, 0, 0, 0, 0, 0, 1, 1)
    )
    # kappa 1.5: limit 6 -> only 9
    assert decide_statistical(values, 1.5).bitmap == bits(0, 0, 0, 0, 0, 0, 0, 1)
    # the default kappa 5: limit 20 -> nobody
    assert decide_statistical(values, 5.0) == Decision(Status.AGREE, (False,) * 8)


def test_iqr_zero_uses_the_scaled_range() -> None:
    # m = 1, MAD 0, IQR 0, d = 8 / 16 = 0.5 -> limit 2.5 at kappa 5:
    # 9 is flagged, 2 (one step off the tied bulk) is not
    values = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 2.0, 9.0]
    assert decide_statistical(values, 5.0) == Decision(
        Status.ATTRIBUTED, bits(0, 0, 0, 0, 0, 0, 0, 1)
    )


@pytest.mark.parametrize("n", [3, 4, 5, 8])
def test_lone_deviant_from_a_tied_bulk_is_flagged_in_small_groups(n: int) -> None:
    values = [1.0] * (n - 1) + [9.0]
    expected = (False,) * (n - 1) + (True,)
    assert decide_statistical(values, 5.0) == Decision(Status.ATTRIBUTED, expected)


def test_non_finite_timing_is_inconclusive() -> None:
    for bad in (math.nan, math.inf, -math.inf):
        assert decide_statistical([1.0, bad, 1.0, 1.0], 5.0) == Decision(
            Status.INCONCLUSIVE, (False,) * 4
        )


@pytest.mark.parametrize("kappa", [0.0, -1.0, math.nan, math.inf])
def test_bad_kappa_is_an_error(kappa: float) -> None:
    with pytest.raises(ValueError, match="kappa"):
        decide_statistical([1.0, 2.0, 3.0], kappa)


def test_statistical_empty_group_is_an_error() -> None:
    with pytest.raises(ValueError, match="at least one"):
        decide_statistical([], 5.0)


# --------------------------------------------------------------------------- Surface encoding


def test_exact_surface_accepts_unsigned_and_negative_64_bit_values() -> None:
    assert Surface("s", Mode.EXACT, 2**64 - 1).words() == [-1]
    assert Surface("s", Mode.EXACT, 2**63).words() == [-(2**63)]
    assert Surface("s", Mode.EXACT, -(2**63)).words() == [-(2**63)]
    assert Surface("s", Mode.EXACT, 7).words() == [7]
    for bad in (2**64, -(2**63) - 1):
        with pytest.raises(ValueError, match="64 bits"):
            Surface("s", Mode.EXACT, bad)


def test_exact_surface_rejects_non_ints() -> None:
    with pytest.raises(ValueError, match="must be an int"):
        Surface("s", Mode.EXACT, 1.5)
    with pytest.raises(ValueError, match="must be an int"):
        Surface("s", Mode.EXACT, True)


def test_fixed_width_surface_needs_exactly_width_words() -> None:
    s = Surface("fp", Mode.EXACT, [1, 2**64 - 1, -2], width=3)
    assert s.value == (1, 2**64 - 1, -2)
    assert s.words() == [1, -1, -2]
    with pytest.raises(ValueError, match="2 words"):
        Surface("fp", Mode.EXACT, [1, 2], width=3)
    with pytest.raises(ValueError, match="sequence"):
        Surface("fp", Mode.EXACT, 5, width=3)


def test_statistical_surface_carries_float64_bits() -> None:
    s = Surface("t", Mode.STATISTICAL, 0.125)
    assert s.words() == [struct.unpack("<q", struct.pack("<d", 0.125))[0]]
    assert Surface("t", Mode.STATISTICAL, 2).value == 2.0
    with pytest.raises(ValueError, match="width 1"):
        Surface("t", Mode.STATISTICAL, 1.0, width=2)
    with pytest.raises(ValueError, match="float"):
        Surface("t", Mode.STATISTICAL, "1.0")  # type: ignore[arg-type]  # the point of the test


def test_missing_value_encodes_as_zero_words() -> None:
    assert Surface("fp", Mode.EXACT, None, width=4).words() == [0, 0, 0, 0]


def test_surface_mode_and_name_are_validated() -> None:
    assert Surface("s", "exact", 1).mode is Mode.EXACT  # type: ignore[arg-type]  # str coerced
    with pytest.raises(ValueError, match="exact, statistical"):
        Surface("s", "fuzzy", 1)  # type: ignore[arg-type]  # the point of the test
    with pytest.raises(ValueError, match="name"):
        Surface("", Mode.EXACT, 1)
    with pytest.raises(ValueError, match="width"):
        Surface("s", Mode.EXACT, None, width=0)


def test_result_outliers_are_global_ranks() -> None:
    r = C3Result(
        surface="s",
        mode=Mode.EXACT,
        status=Status.ATTRIBUTED,
        bitmap=bits(0, 1, 0, 1),
        evidence=(A, B, A, C),
        ranks=(4, 6, 0, 2),
    )
    assert r.outliers == (6, 2)
    assert r.as_dict()["outliers"] == [6, 2]
    assert r.as_dict()["status"] == "attributed"
