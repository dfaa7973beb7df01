"""The published plugin interface: pinned names, the plugin base's lifecycle, version ranges.

``scout_core.plugin_api.__all__`` and ``scout_core.testing.__all__`` are contracts
other engineers code against (``/docs/plugins.md``); these tests pin them the way
httpx's ``test_exported_members`` does, so a rename cannot slip through.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import metadata
from typing import Any, ClassVar

import pytest
import torch

import scout_core.plugin_api as api
from scout_core import Config, ConfigError, UnsupportedSetupError, testing
from scout_core.integration.versions import VersionRange, check_version, parse_version

PLUGIN_API = {
    "FrameworkPlugin",
    "PendingPlugin",
    "check_version",
    "gate_of",
    "recover",
    "shadow_methods",
    "swapped_attributes",
    "agree_or_raise",
    "FrameworkAdapter",
    "AdapterBase",
    "ModuleRef",
    "Ownership",
    "RngStream",
    "cpu_rng",
    "device_rng",
    "default_rng_streams",
    "Discovered",
    "discover_modules",
    "unwrap",
    "find_embedding",
    "find_lm_head",
    "hook_free_twin",
    "param_items",
    "TorchAdapter",
    "PeerGroup",
    "create_peer_groups",
    "diagnostic_group",
    "diagnostic_groups",
    "group_ranks",
    "all_ok",
    "any_flag",
    "min_max",
    "same_value",
    "injected_delay",
    "CheckpointIO",
    "FrameworkGate",
    "Recovered",
    "DcpCheckpointIO",
    "Session",
    "Boundary",
}

TESTING = {
    "run_ranks",
    "RankFailedError",
    "RanksTimeoutError",
    "Faults",
    "BitFlip",
    "Scale",
    "AddNoise",
    "flip_bit",
    "comm_delay",
    "check_adapter",
    "check_plugin",
    "check_checkpoint_io",
    "documented_launches",
    "runnable",
    "check_documented_launch",
    "discover_catalog",
    "distinct_verdicts",
    "installed_plugins",
    "TinyLM",
    "Block",
    "batch",
    "train_step",
    "VOCAB",
    "signature",
    "signature_many",
    "TrialFault",
    "FAULT_KINDS",
    "Setup",
    "RoundLog",
    "ran_every_due_round",
    "BUSY_HOST",
}


def test_plugin_api_exports_exactly_the_contract() -> None:
    assert set(api.__all__) == PLUGIN_API
    assert len(api.__all__) == len(PLUGIN_API)
    for name in api.__all__:
        assert getattr(api, name) is not None, name


def test_testing_exports_exactly_the_contract() -> None:
    assert set(testing.__all__) == TESTING
    assert len(testing.__all__) == len(TESTING)
    for name in testing.__all__:
        assert getattr(testing, name) is not None, name
    with pytest.raises(AttributeError):
        testing.not_a_name  # noqa: B018  # the lazy loader must refuse unknown names


# -- version ranges ------------------------------------------------------------------------


def test_version_ranges() -> None:
    assert parse_version("0.19.8+cafe") == (0, 19, 8)
    assert parse_version("2.13.0rc1") == (2, 13, 0)
    rng = VersionRange.parse(">=0.19,<0.20")
    assert rng.contains("0.19.0") and rng.contains("0.19.8+cafe")
    assert not rng.contains("0.18.9") and not rng.contains("0.20.0")
    assert VersionRange.parse("==1.2").contains("1.2.0")
    assert not VersionRange.parse("!=1.2, >1.0").contains("1.2")
    with pytest.raises(ValueError, match=r"clause '~=1\.2'"):
        VersionRange.parse(">=1.0,~=1.2")
    with pytest.raises(UnsupportedSetupError, match=r"supports torch <2\.0; torch 2\.13\.0 is"):
        check_version("torch", "<2.0", plugin="p", version="2.13.0")
    with pytest.raises(UnsupportedSetupError, match="not installed"):
        check_version("no-such-distribution-xyz", ">=1", plugin="p")


# -- the plugin base -----------------------------------------------------------------------


class _Adapter:
    """Stands in for a real adapter: the lifecycle tests never reach compose()."""


class _FakePlugin(api.FrameworkPlugin):
    name: ClassVar[str] = "fake"
    distribution: ClassVar[str] = "scout-fake"
    framework: ClassVar[str] = "torch"
    supported: ClassVar[str] = ">=2.0"
    prefixes: ClassVar[tuple[str, ...]] = ("torch.nn.",)
    section_name: ClassVar[str] = 'fake config "scout" section'

    def __init__(self, section: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.section = section
        self.built = 0

    def config_section(self, obj: Any) -> Mapping[str, Any] | None:
        return self.section

    def build_adapter(self, obj: Any, config: Config, *args: Any, **kwargs: Any) -> Any:
        self.built += 1
        raise UnsupportedSetupError("fake: built")


def test_handles_by_module_prefix_without_importing() -> None:
    plugin = _FakePlugin()
    assert plugin.handles(torch.nn.Linear(2, 2))
    assert plugin.handles([torch.nn.Linear(2, 2)])  # model chunks: the first item
    assert not plugin.handles(object()) and not plugin.handles([])


def test_config_resolution_order(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    for var in ("SCOUT_CONFIG", "SCOUT_ENABLED", "SCOUT_KAPPA"):
        monkeypatch.delenv(var, raising=False)
    obj = torch.nn.Linear(2, 2)
    explicit = Config(kappa=9.0)
    assert _FakePlugin({"kappa": 3.0}).resolve_config(obj, explicit) is explicit
    monkeypatch.setenv("SCOUT_KAPPA", "4.5")
    assert _FakePlugin({"kappa": 3.0}).resolve_config(obj, None).kappa == 4.5  # env over section
    monkeypatch.delenv("SCOUT_KAPPA")
    assert _FakePlugin({"kappa": 3.0}).resolve_config(obj, None).kappa == 3.0
    with pytest.raises(ConfigError, match="fake config \"scout\" section: unknown key 'kapa'"):
        _FakePlugin({"kapa": 3.0}).resolve_config(obj, None)
    with pytest.raises(ConfigError, match="expected an object"):
        _FakePlugin(["kappa"]).resolve_config(obj, None)  # type: ignore[arg-type]
    # no section: a SCOUT_CONFIG file, else defaults, disabled unless SCOUT_ENABLED
    assert not _FakePlugin().resolve_config(obj, None).enabled
    monkeypatch.setenv("SCOUT_ENABLED", "1")
    assert _FakePlugin().resolve_config(obj, None).enabled
    monkeypatch.delenv("SCOUT_ENABLED")
    path = tmp_path / "scout.toml"
    path.write_text("[scout]\nkappa = 7.0\n", encoding="utf-8")
    monkeypatch.setenv("SCOUT_CONFIG", str(path))
    got = _FakePlugin().resolve_config(obj, None)
    assert got.kappa == 7.0 and got.enabled


def test_enable_disabled_registers_one_idempotent_session(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("SCOUT_CONFIG", "SCOUT_ENABLED"):
        monkeypatch.delenv(var, raising=False)
    plugin = _FakePlugin()
    obj = torch.nn.Linear(2, 2)
    first = plugin.enable(obj)
    assert not first.enabled and plugin.session_of(obj) is first
    assert plugin.enable(obj) is first and plugin.built == 0
    with pytest.raises(UnsupportedSetupError, match="fake: built"):
        plugin.enable(obj, config=Config())  # an enabled request builds the adapter
    first.close()
    assert plugin.session_of(obj) is None
    chunks = [torch.nn.Linear(2, 2)]  # unhashable keys work too
    assert plugin.session_of(chunks) is None
    assert plugin.session_of(chunks) is None and plugin.enable(chunks).closed is False
    assert plugin.session_of(chunks) is not None


def test_enable_checks_the_version_first() -> None:
    class Old(_FakePlugin):
        supported: ClassVar[str] = "<1.0"

    with pytest.raises(UnsupportedSetupError, match=r"scout-fake supports torch <1\.0"):
        Old().enable(torch.nn.Linear(2, 2))


def test_check_version_reads_framework_version() -> None:
    """A plugin whose framework can be importable without metadata (a source checkout)
    overrides ``framework_version``; the base checks that version against ``supported``."""

    class SourceCheckout(_FakePlugin):
        framework: ClassVar[str] = "no-such-distribution-xyz"
        supported: ClassVar[str] = ">=0.16,<0.17"
        found: ClassVar[str | None] = "0.16.1rc0"

        def framework_version(self) -> str | None:
            return self.found

    plugin = SourceCheckout()
    assert _FakePlugin().framework_version() == metadata.version("torch")  # the default
    assert plugin.check_version() == "0.16.1rc0"
    assert plugin.check_version("0.16.0") == "0.16.0"  # an explicit version wins
    SourceCheckout.found = "0.17.0"
    with pytest.raises(UnsupportedSetupError, match=r"0\.17\.0 is installed"):
        plugin.check_version()
    SourceCheckout.found = None  # neither metadata nor a checkout: not installed
    with pytest.raises(UnsupportedSetupError, match="not installed"):
        plugin.check_version()


def test_check_plugin_conformance_on_the_torch_plugin() -> None:
    from scout_core.plugin.torch_plugin import plugin

    testing.check_plugin(plugin, torch.nn.Linear(2, 2), registered=False)
    with pytest.raises(AssertionError, match="entry point 'torch'"):
        testing.check_plugin(plugin, torch.nn.Linear(2, 2))  # the core's own is not an entry point


def test_shadow_methods_shadows_on_the_instance_and_its_undo_removes_only_its_own() -> None:
    import torch

    class Engine(torch.nn.Module):  # nn.Module: plain callables land in the instance dict
        def save(self) -> str:
            return "framework"

        def load(self) -> str:
            return "framework"

    engine, other = Engine(), Engine()
    undo = api.shadow_methods(engine, save=lambda: "scout", load=lambda: "scout")
    assert (engine.save(), engine.load(), other.save()) == ("scout", "scout", "framework")
    engine.load = lambda: "someone else"  # replaced after us: the undo leaves it
    undo()
    assert (engine.save(), engine.load()) == ("framework", "someone else")
    assert "save" not in vars(engine) and Engine.save(engine) == "framework"
    undo()  # twice: nothing left to remove


def test_swapped_attributes_puts_everything_back_also_on_error() -> None:
    class Layer:
        def __init__(self) -> None:
            self.group = "training"
            self.l_aux = 1.0

    layer, other = Layer(), Layer()
    with api.swapped_attributes(
        [(layer, "group", "scout")], keep=[(layer, "l_aux"), (layer, "absent")]
    ):
        assert (layer.group, other.group) == ("scout", "training")
        layer.l_aux = 9.0  # the call overwrites its own state
    assert (layer.group, layer.l_aux) == ("training", 1.0)
    assert "absent" not in vars(layer)

    def changes():  # fails after its first swap: that one is put back too
        yield layer, "group", "scout"
        raise RuntimeError("no substitute")

    with pytest.raises(RuntimeError, match="no substitute"), api.swapped_attributes(changes()):
        pass
    assert layer.group == "training"
    with pytest.raises(ValueError, match="inside"), api.swapped_attributes([(layer, "group", "x")]):
        raise ValueError("inside")
    assert layer.group == "training"
