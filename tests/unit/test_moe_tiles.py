"""The analytic tile model: path counts, configuration choice, wave regimes, compression."""

from __future__ import annotations

import pytest

from scout_core.moe.coverage import covers, minimum_cover
from scout_core.moe.shapes import ExpertClass, ExpertShape
from scout_core.moe.tiles import (
    DEFAULT_RULES,
    TileConfig,
    TileModel,
    TileRule,
    k_paths,
    path_counts,
)

CFG64 = TileConfig(block_m=64, block_n=64, block_k=64)


def nonzero(counts: dict[str, int]) -> dict[str, int]:
    return {p: c for p, c in counts.items() if c}


def test_interior_boundary_and_tail_tiles_are_counted() -> None:
    # 100 rows = 1 full + 1 tail tile along M; 160 cols = 2 full + 1 boundary along N;
    # k = 96 = 2 reduction steps, the last one masked.
    counts = path_counts(ExpertShape(rows=(100,), k=96, n=160), CFG64)
    assert nonzero(counts) == {
        "m:full/n:full/k2+t": 2,
        "m:full/n:tail/k2+t": 1,
        "m:tail/n:full/k2+t": 2,
        "m:tail/n:tail/k2+t": 1,
    }
    exact = path_counts(ExpertShape(rows=(128,), k=128, n=128), CFG64)
    assert nonzero(exact) == {"m:full/n:full/k2": 4}


def test_split_k_slices_are_units_with_their_own_loop() -> None:
    cfg = TileConfig(block_m=64, block_n=64, block_k=64, split_k=3)
    assert k_paths(256, cfg) == {"k2": 2, "k0": 1}  # 4 steps over 3 slices: 2, 2, 0
    assert k_paths(250, cfg) == {"k2": 1, "k2+t": 1, "k0": 1}  # last non-empty slice masked
    counts = path_counts(ExpertShape(rows=(64,), k=250, n=64), cfg)
    assert sum(counts.values()) == 3  # one tile, three slices


def test_grouped_counts_sum_over_experts_and_ignore_order() -> None:
    a = path_counts(ExpertShape(rows=(70, 5), k=64, n=64), CFG64)
    b = path_counts(ExpertShape(rows=(5, 70), k=64, n=64), CFG64)
    single = [path_counts(ExpertShape(rows=(r,), k=64, n=64), CFG64) for r in (70, 5)]
    assert a == b == {p: single[0][p] + single[1][p] for p in a}


def test_rules_pick_a_config_per_row_bucket() -> None:
    model = TileModel()
    assert model.select(ExpertShape(rows=(16,), k=8, n=8)) == DEFAULT_RULES[0].config
    assert model.select(ExpertShape(rows=(17,), k=8, n=8)) == DEFAULT_RULES[1].config
    assert model.select(ExpertShape(rows=(3, 300), k=8, n=8)) == DEFAULT_RULES[5].config
    assert model.select(ExpertShape(rows=(10**6,), k=8, n=8)) == DEFAULT_RULES[-1].config


def test_a_shape_no_rule_admits_is_uncertain() -> None:
    model = TileModel([TileRule(64, CFG64)])
    p = model.profile(ExpertShape(rows=(65,), k=64, n=64))
    assert not p.certain and "no tile rule admits 65 rows" in p.note
    assert model.profile(ExpertShape(rows=(64,), k=64, n=64)).certain


def test_fingerprint_names_config_and_wave_regime() -> None:
    model = TileModel(CFG64, num_sms=4)
    one_wave = model.profile(ExpertShape(rows=(256,), k=64, n=64))  # 4 tiles
    two_waves = model.profile(ExpertShape(rows=(257,), k=64, n=64))  # 5 tiles
    assert one_wave.fingerprint is not None and "waves1" in one_wave.fingerprint
    assert two_waves.fingerprint is not None and "waves2" in two_waves.fingerprint
    assert not covers(two_waves, one_wave)  # more work, but another scheduling regime
    flat = TileModel(CFG64, num_sms=4, wave_regimes=False)
    assert covers(
        flat.profile(ExpertShape(rows=(257,), k=64, n=64)),
        flat.profile(ExpertShape(rows=(256,), k=64, n=64)),
    )
    other = TileModel(TileConfig(block_m=32, block_n=64, block_k=64), num_sms=4)
    assert other.profile(ExpertShape(rows=(256,), k=64, n=64)).fingerprint != one_wave.fingerprint


def test_within_one_regime_the_largest_tailed_shape_covers_the_rest() -> None:
    cls = ExpertClass.uniform(name="c", k=64, n=64, tokens=range(1, 257))
    model = TileModel(CFG64, num_sms=1000)
    shapes = cls.shapes()
    cover = minimum_cover([model.profile(s) for s in shapes], [s.total_rows for s in shapes])
    # 255 rows = 3 full tiles + 1 tail; 256 rows = 4 full tiles: neither covers the other.
    assert [shapes[i].rows for i in cover.representatives] == [(255,), (256,)]


@pytest.mark.parametrize("experts", [2, 4, 8, 16])
def test_table4_grouped_workloads_compress_by_at_least_97_percent(experts: int) -> None:
    cls = ExpertClass.uniform(
        name=f"128x128/e{experts}", k=128, n=128, tokens=range(1, 2049), experts_per_kernel=experts
    )
    shapes = cls.shapes()
    profiles = [TileModel().profile(s) for s in shapes]
    cover = minimum_cover(profiles, [s.total_rows for s in shapes])
    assert all(p.certain for p in profiles)
    assert len(shapes) == 2048
    assert 1 - len(cover.representatives) / len(shapes) >= 0.97


def test_tile_model_validates_its_rules() -> None:
    with pytest.raises(ValueError, match="only the last"):
        TileModel([TileRule(None, CFG64), TileRule(64, CFG64)])
    with pytest.raises(ValueError, match="increasing"):
        TileModel([TileRule(64, CFG64), TileRule(32, CFG64)])
    with pytest.raises(ValueError, match="block_k must be an integer >= 1"):
        TileConfig(block_m=64, block_n=64, block_k=0)
    assert TileConfig.from_json(CFG64.to_json()) == CFG64
