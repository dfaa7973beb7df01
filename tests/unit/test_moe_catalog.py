"""Catalogs: discovery, rotation, JSON round trip, environment drift, heterogeneous models."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from scout_core.errors import CatalogDriftError, CatalogError
from scout_core.moe import (
    CatalogSet,
    ExpertClass,
    ExpertLayerSpec,
    ExpertShape,
    Profile,
    TileConfig,
    TileModel,
    class_for,
    current_environment,
    discover,
    expert_classes,
    load_or_discover,
)

CFG = TileConfig(block_m=16, block_n=32, block_k=16)


def small_class(name: str = "16x32/e2", *, upto: int = 64) -> ExpertClass:
    return ExpertClass.uniform(
        name=name, k=16, n=32, tokens=range(1, upto + 1), experts_per_kernel=2
    )


def test_discovery_covers_every_admitted_shape_with_fewer_representatives() -> None:
    catalog = discover(small_class(), TileModel(CFG, num_sms=4))
    assert len(catalog.entries) == 64
    assert 1 <= catalog.size < 64
    covered = [s for rep in catalog.representatives for s in catalog.covered(rep)]
    assert sorted(covered) == sorted(small_class().shapes())
    assert catalog.summary()["admitted"] == 64 and catalog.uncertain == 0


def test_rotation_is_a_pure_function_of_the_index() -> None:
    catalog = discover(small_class(), TileModel(CFG, num_sms=4))
    k = catalog.size
    first = [catalog.at(i) for i in range(k)]
    assert first == list(catalog.representatives)  # one rotation visits each once, in order
    assert [catalog.at(i + 7 * k) for i in range(k)] == first
    again = discover(small_class(), TileModel(CFG, num_sms=4))  # another "rank"
    assert [again.at(i) for i in range(3 * k)] == [catalog.at(i) for i in range(3 * k)]
    with pytest.raises(ValueError, match=">= 0"):
        catalog.at(-1)


def test_json_round_trip(tmp_path: Path) -> None:
    catalogs = CatalogSet(
        [
            discover(small_class("b"), TileModel(CFG, num_sms=4)),
            discover(small_class("a", upto=20), TileModel(CFG, num_sms=4)),
        ]
    )
    path = catalogs.save(tmp_path / "catalog.json")
    text = path.read_text()
    json.loads(text)  # plain JSON
    loaded = CatalogSet.load(path)
    assert loaded.to_json() == catalogs.to_json()
    assert [loaded.at(i) for i in range(loaded.size)] == [
        catalogs.at(i) for i in range(catalogs.size)
    ]
    assert [name for name, _ in (catalogs.at(i) for i in range(catalogs.size))] == sorted(
        ["a"] * catalogs["a"].size + ["b"] * catalogs["b"].size
    )


def test_a_tampered_catalog_is_refused(tmp_path: Path) -> None:
    catalog = discover(small_class(), TileModel(CFG, num_sms=4))
    data = CatalogSet([catalog]).to_json()
    shapes = data["catalogs"][0]["shapes"]
    largest = max(range(len(shapes)), key=lambda i: sum(shapes[i]["rows"]))
    shapes[largest]["covered_by"] = 0  # the smallest shape cannot cover the largest
    with pytest.raises(CatalogError, match="does not cover its shapes"):
        CatalogSet.from_json(data)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(CatalogError, match="cannot read shape catalog"):
        CatalogSet.load(tmp_path / "bad.json")
    with pytest.raises(CatalogError, match="schema"):
        CatalogSet.from_json({"schema": "other"})


def test_environment_drift_forces_rediscovery_and_names_what_drifted(tmp_path: Path) -> None:
    cls, profiler = small_class(), TileModel(CFG, num_sms=4)
    now = current_environment(cls.describe(), profiler.describe(), device="NVIDIA H200")
    old = dataclasses.replace(now, torch="2.9.0", device="NVIDIA A100-SXM4-80GB")
    path = tmp_path / "catalog.json"
    CatalogSet([discover(cls, profiler, environment=old)]).save(path)

    with pytest.raises(CatalogDriftError) as err:
        CatalogSet.load(path).check([cls], profiler, device="NVIDIA H200")
    message = str(err.value)
    assert "torch: '2.9.0' in the catalog" in message
    assert "device: 'NVIDIA A100-SXM4-80GB' in the catalog, 'NVIDIA H200' now" in message
    assert len(err.value.drift) == 2

    result, messages = load_or_discover(path, [cls], profiler, device="NVIDIA H200")
    assert len(messages) == 1 and "drifted" in messages[0] and "torch" in messages[0]
    assert result[cls.name].environment == now
    CatalogSet.load(path).check([cls], profiler, device="NVIDIA H200")  # rewritten: no drift

    before = path.stat().st_mtime_ns
    _, messages = load_or_discover(path, [cls], profiler, device="NVIDIA H200")
    assert messages == [] and path.stat().st_mtime_ns == before  # reused, not rewritten


def test_model_and_profiler_changes_are_drift_too(tmp_path: Path) -> None:
    cls, profiler = small_class(), TileModel(CFG, num_sms=4)
    path = tmp_path / "c.json"
    CatalogSet([discover(cls, profiler, device="cpu")]).save(path)
    wider = ExpertClass.uniform(
        name=cls.name, k=16, n=48, tokens=range(1, 65), experts_per_kernel=2
    )
    with pytest.raises(CatalogDriftError, match=r"model\.n: 32 in the catalog, 48 now"):
        CatalogSet.load(path).check([wider], profiler, device="cpu")
    with pytest.raises(CatalogDriftError, match=r"profiler\.num_sms: 4 in the catalog, 8 now"):
        CatalogSet.load(path).check([cls], TileModel(CFG, num_sms=8), device="cpu")
    with pytest.raises(CatalogDriftError, match="in the model but not in the catalog"):
        CatalogSet.load(path).check([cls, small_class("new")], profiler, device="cpu")
    _, messages = load_or_discover(path, [small_class("new")], profiler, device="cpu")
    assert any("not in" in m for m in messages) and any("dropped" in m for m in messages)


class Flaky:
    """A profiler that cannot tell the kernel for odd row counts."""

    name = "flaky"

    def describe(self) -> dict[str, str]:
        return {"name": self.name}

    def profile(self, shape: ExpertShape) -> Profile:
        if shape.rows[0] % 2:
            return Profile(None, note="kernel changed across repeats")
        return TileModel(CFG, num_sms=1000).profile(shape)


def test_uncertain_shapes_are_their_own_representatives(tmp_path: Path) -> None:
    catalog = discover(small_class(upto=10), Flaky())
    odd = [s for s in small_class(upto=10).shapes() if s.rows[0] % 2]
    assert set(odd) <= set(catalog.representatives)
    assert catalog.uncertain == 5
    path = CatalogSet([catalog]).save(tmp_path / "f.json")
    loaded = CatalogSet.load(path)[catalog.name]
    assert loaded.entries[0].profile.note == "kernel changed across repeats"


def test_heterogeneous_layers_get_one_catalog_per_class() -> None:
    layers = [
        ExpertLayerSpec(
            name="layers.0.moe",
            num_experts=4,
            ep_size=2,
            d_model=16,
            d_ff=32,
            max_tokens_per_expert=48,
        ),
        ExpertLayerSpec(
            name="layers.1.moe",
            num_experts=2,
            ep_size=2,
            d_model=16,
            d_ff=24,
            max_tokens_per_expert=48,
        ),
        ExpertLayerSpec(
            name="layers.2.moe",
            num_experts=4,
            ep_size=2,
            d_model=16,
            d_ff=32,
            max_tokens_per_expert=48,
        ),
    ]
    classes = expert_classes(layers)
    assert [c.name for c in classes] == ["16x32/e2", "32x16/e2", "16x24/e1", "24x16/e1"]
    assert class_for(classes, "layers.2.moe.down").name == "32x16/e2"
    assert class_for(classes, "layers.0.moe.up").layers == ("layers.0.moe.up", "layers.2.moe.up")
    with pytest.raises(KeyError, match="no expert class covers"):
        class_for(classes, "layers.9.moe.up")
    catalogs = CatalogSet([discover(c, TileModel(num_sms=8)) for c in classes])
    assert len(catalogs) == 4
    assert all(c.size < len(c.entries) for c in catalogs.catalogs.values())


def test_per_expert_token_vectors_share_representatives_across_permutations() -> None:
    vectors = ((3, 40), (40, 3), (10, 10), (0, 5))
    layer = ExpertLayerSpec(name="moe", num_experts=2, d_model=16, d_ff=32, token_vectors=vectors)
    up = expert_classes([layer])[0]
    assert up.admitted == vectors
    catalog = discover(up, TileModel(CFG, num_sms=1000))
    perms = {(3, 40), (40, 3)}
    assert len(perms & {s.rows for s in catalog.representatives}) == 1
    bad = ExpertLayerSpec(name="bad", num_experts=2, d_model=4, d_ff=4, token_vectors=((1, 2, 3),))
    with pytest.raises(ValueError, match="has 3 entries, experts_per_kernel is 2"):
        expert_classes([bad])


def test_the_moe_test_model_maps_onto_catalog_classes() -> None:
    from scout_core.testing.models import batch
    from scout_core.testing.moe_models import MoESpec, TinyMoE

    model = TinyMoE((MoESpec(4, 32), MoESpec(2, 16), MoESpec(8, 24), MoESpec(4, 32)))
    tokens = batch(0, 0)[:, :-1]
    model(tokens)
    classes = expert_classes(model.layer_specs(tokens_per_rank=tokens.numel()))
    assert [c.name for c in classes] == [
        "16x32/e1", "32x16/e1", "16x16/e1", "16x24/e1", "24x16/e1"
    ]  # fmt: skip
    assert class_for(classes, "layers.3.moe.up") is class_for(classes, "layers.0.moe.up")
    catalogs = CatalogSet([discover(c, TileModel(num_sms=8)) for c in classes])
    for name, layer in model.moe_layers():
        for proj in ("up", "down"):
            cls = class_for(classes, f"{name}.{proj}")
            admitted = set(cls.admitted)
            assert all((rows,) in admitted for rows in layer.last_tokens_per_expert)
            assert catalogs[cls.name].size < len(cls.admitted)
