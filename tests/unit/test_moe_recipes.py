"""MoE replay without ranks: discovery of routers and experts, the adapter roles, the
schedule's synthetic ``experts`` track and the catalog targets of each MoE layer."""

from __future__ import annotations

from pathlib import Path

import pytest

from scout_core.errors import ConfigError
from scout_core.integration.adapter import moe_modules, role_of
from scout_core.integration.discovery import discover
from scout_core.moe import CatalogSet, TileModel, expert_classes
from scout_core.moe import discover as discover_catalog
from scout_core.replay.experts import expert_targets
from scout_core.replay.schedule import ALL_TO_ALL, EXPERTS, ROUTER, Recipe, Schedule, Track
from scout_core.testing.moe_models import MoESpec, TinyMoE

HETERO = (MoESpec(4, 32), MoESpec(2, 16), MoESpec(8, 24))


def test_discovery_finds_routers_and_experts_and_keeps_the_blocks_as_layers() -> None:
    found = discover(TinyMoE(HETERO))
    # The 8-expert list of layer 2 is larger than the 3 blocks, but it is the experts.
    assert [r.path for r in found.layers] == ["layers.0", "layers.1", "layers.2"]
    assert [r.path for r in found.routers] == [f"layers.{i}.moe.router" for i in range(3)]
    assert [r.path for r in found.experts] == [f"layers.{i}.moe.experts" for i in range(3)]
    special = found.special()
    assert {role_of(k) for k in special} == {"embedding", "lm_head", "router", "experts"}
    routers, experts = moe_modules(special)
    assert [r.path for r in experts] == [r.path for r in found.experts]
    assert [r.path for r in routers] == [r.path for r in found.routers]
    # The LM head is still the head, not a router's gate inside the blocks.
    assert found.lm_head is not None and found.lm_head.path == "head"


def test_dense_models_have_no_moe_roles() -> None:
    from scout_core.testing.models import TinyLM

    found = discover(TinyLM())
    assert found.routers == () and found.experts == ()
    assert moe_modules(found.special()) == ((), ())


def test_experts_track_is_synthetic_and_named_by_kind() -> None:
    sched = Schedule(
        layers=["layers.0"],
        embedding=None,
        lm_head=None,
        optimizer=False,
        intervals={"hidden": 2},
        recipes=("hidden",),
        variants=1,
        tracks=[
            Track(ROUTER, 2, ("layers.0.moe.router",)),
            Track(EXPERTS, 1, ("layers.0.moe.experts@rows=7", "layers.0.moe.experts@rows=9")),
        ],
    )
    assert sched.catalog_size == 4
    due = sched.due(1)
    assert Recipe(EXPERTS, "layers.0.moe.experts@rows=9", 1) in due
    # An experts target is no module: nothing is captured for it.
    for step in range(4):
        assert all("@" not in p for p in sched.modules_due(step))
    assert Recipe(EXPERTS, "x@rows=1").name == "experts/x@rows=1"
    assert Recipe(ROUTER, "layers.0.moe.router").name == "layer/layers.0.moe.router"


def _catalogs(specs: tuple[MoESpec, ...], ep: int = 2) -> CatalogSet:
    import dataclasses

    layers = [
        dataclasses.replace(s, ep_size=ep, max_tokens_per_expert=8 * ep)
        for s in TinyMoE(specs).layer_specs(8)
    ]
    classes = expert_classes(layers, dtype="float32")
    return CatalogSet([discover_catalog(c, TileModel()) for c in classes])


def test_heterogeneous_layers_get_one_catalog_per_class_and_their_own_targets() -> None:
    catalogs = _catalogs(HETERO)
    # 16x32 / 32x16 (layer 0), 16x16 (layer 1, up and down alike), 16x24 / 24x16 (layer 2)
    assert sorted(catalogs.catalogs) == ["16x16/e1", "16x24/e1", "16x32/e1", "24x16/e1", "32x16/e1"]
    found = discover(TinyMoE(HETERO))
    targets = expert_targets(found.experts, catalogs)
    by_layer: dict[str, set[tuple[int, ...]]] = {}
    for name, t in targets.items():
        assert name == f"{t.ref.path}@rows={','.join(map(str, t.rows))}"
        by_layer.setdefault(t.ref.path, set()).add(t.rows)
    assert sorted(by_layer) == [f"layers.{i}.moe.experts" for i in range(3)]
    for path, rows in by_layer.items():
        layer = path.rsplit(".", 1)[0]
        expected = {
            r.rows
            for c in catalogs.catalogs.values()
            if f"{layer}.up" in c.workload.layers or f"{layer}.down" in c.workload.layers
            for r in c.representatives
        }
        assert rows == expected
    assert {t.d_model for t in targets.values()} == {16}


def test_a_layer_without_a_class_gets_no_targets(caplog: pytest.LogCaptureFixture) -> None:
    catalogs = _catalogs((MoESpec(4, 32),))
    found = discover(TinyMoE(HETERO))
    targets = expert_targets(found.experts, catalogs)
    assert {t.ref.path for t in targets.values()} == {"layers.0.moe.experts"}
    assert "no class for layer layers.1.moe" in caplog.text


def test_an_unreadable_catalog_is_a_config_error(tmp_path: Path) -> None:
    from scout_core.config import Config
    from scout_core.replay.moe_tracks import moe_recipes
    from scout_core.topology.mesh import MeshLayout

    bad = tmp_path / "catalog.json"
    bad.write_text("{}")
    found = discover(TinyMoE())
    cfg = Config(moe_catalog=str(bad), observer=False)
    with pytest.raises(ConfigError, match="moe_catalog"):
        moe_recipes(found.layers, found.special(), MeshLayout.from_order("e-d", e=1, d=1), cfg)


def test_a_catalog_from_another_stack_is_refused_with_what_changed(tmp_path: Path) -> None:
    # The catalog is bound to its environment: online, replay refuses one discovered
    # under another torch (or device, CUDA, Triton) and says what changed.
    import dataclasses

    from scout_core.config import Config
    from scout_core.replay.moe_tracks import moe_recipes
    from scout_core.topology.mesh import MeshLayout

    model = TinyMoE()
    found = discover(model)
    classes = expert_classes(model.layer_specs(8), dtype="float32")
    here = CatalogSet([discover_catalog(c, TileModel()) for c in classes])
    layout = MeshLayout.from_order("e-d", e=1, d=1)
    ok = here.save(tmp_path / "here.json")
    moe = moe_recipes(found.layers, found.special(), layout, Config(moe_catalog=str(ok)))
    assert moe.experts  # same stack: accepted
    (name, catalog), *_ = here.catalogs.items()
    from scout_core.moe.catalog import Catalog

    old_env = dataclasses.replace(catalog.environment, torch="2.0.0")
    old = Catalog(environment=old_env, entries=catalog.entries)
    stale = CatalogSet([old, *list(here.catalogs.values())[1:]]).save(tmp_path / "old.json")
    with pytest.raises(ConfigError) as refused:
        moe_recipes(found.layers, found.special(), layout, Config(moe_catalog=str(stale)))
    text = str(refused.value)
    assert "was discovered for another environment" in text
    assert f"class {name!r}: torch: '2.0.0' in the catalog" in text
    assert "scout catalog discover" in text


def test_ep_blocks_leave_the_hidden_rotation(caplog: pytest.LogCaptureFixture) -> None:
    from scout_core.config import Config
    from scout_core.replay.moe_tracks import moe_recipes
    from scout_core.topology.mesh import MeshLayout

    found = discover(TinyMoE())
    cfg = Config(observer=False)
    ep = MeshLayout.from_order("e-d", e=2, d=2)
    moe = moe_recipes(found.layers, found.special(), ep, cfg)
    assert moe.layers == [] and "leaves out 2 block(s)" in caplog.text
    # No catalog configured: no experts track; the all-to-all track under EP.
    assert [t.kind for t in moe.tracks] == [ROUTER, ALL_TO_ALL]
    assert [r.path for r in moe.routers] == ["layers.0.moe.router", "layers.1.moe.router"]
    assert moe.experts == {} and "no 'moe_catalog'" in caplog.text
    assert list(moe.all_to_all) == ["layers.0.moe", "layers.1.moe"]
    no_ep = MeshLayout.from_order("e-d", e=1, d=4)
    moe = moe_recipes(found.layers, found.special(), no_ep, cfg)
    assert [r.path for r in moe.layers] == ["layers.0", "layers.1"]
    assert moe.all_to_all == {} and [t.kind for t in moe.tracks] == [ROUTER]
