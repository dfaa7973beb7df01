"""The supported megatron-core range and how the installed version is read."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from scout_megatron.probes import PROBES, Probe, missing, require
from scout_megatron.versions import (
    SUPPORTED,
    TESTED,
    check_version,
    installed_version,
    version_from_package_info,
)

from scout_core import UnsupportedSetupError


def test_installed_version_is_supported_and_tested() -> None:
    version = installed_version()
    assert version in TESTED
    assert check_version() == version
    assert SUPPORTED == ">=0.16,<0.20"
    # megatron-core 0.17 and later require Python 3.12: each environment gets its range.
    assert version.startswith("0.16.") or sys.version_info >= (3, 12)


@pytest.mark.parametrize(
    "version", ["0.16.0", "0.16.1", "0.16.2rc0", "0.17.0", "0.18.2", "0.19.0", "0.19.2"]
)
def test_every_release_from_0_16_to_0_19_is_accepted(version: str) -> None:
    assert check_version(version) == version


@pytest.mark.parametrize("version", ["0.15.3", "0.20.0", "0.20.0rc1", "1.0.0"])
def test_other_releases_are_refused_naming_both(version: str) -> None:
    with pytest.raises(UnsupportedSetupError) as info:
        check_version(version)
    assert version in str(info.value) and SUPPORTED in str(info.value)


@pytest.mark.usefixtures("megatron_core")
def test_every_probed_internal_is_in_the_installed_megatron_core() -> None:
    assert missing() == []
    require()
    assert {p.module.split(".")[2] for p in PROBES} >= {
        "parallel_state",
        "dist_checkpointing",
        "tensor_parallel",
        "transformer",
    }


@pytest.mark.usefixtures("megatron_core")
def test_a_moved_internal_is_named_not_an_attribute_error() -> None:
    gone = Probe("megatron.core.parallel_state", "get_no_such_group", use="a test")
    keyword = Probe("megatron.core.parallel_state", "get_data_parallel_group", ("no_such_keyword",))
    module = Probe("megatron.core.no_such_module", "anything")
    found = missing((PROBES[0], gone, keyword, module))
    assert found[0] == "megatron.core.parallel_state.get_no_such_group, for a test"
    assert found[1] == "megatron.core.parallel_state.get_data_parallel_group(no_such_keyword=)"
    assert found[2].startswith("module megatron.core.no_such_module (")
    assert len(found) == 3
    # An older name the plugin falls back to passes when present, and is named when not.
    assert missing((Probe(gone.module, gone.attribute, or_else=PROBES[0]),)) == []
    assert missing((Probe(gone.module, gone.attribute, or_else=gone),)) == [
        f"{gone.name} (nor {gone.name})"
    ]
    with pytest.raises(UnsupportedSetupError, match="get_no_such_group") as info:
        require((gone,))
    assert installed_version() in str(info.value) and SUPPORTED in str(info.value)


@pytest.mark.usefixtures("megatron_core")
def test_activation_refuses_a_megatron_core_without_a_probed_internal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the plugin reaches in ``parallel_state`` is probed before the adapter is
    built: a release that dropped one is refused by name, before any hook or group."""
    from megatron.core import parallel_state
    from scout_megatron.plugin import plugin
    from torch import nn

    from scout_core import Config

    monkeypatch.delattr(parallel_state, "get_expert_tensor_parallel_world_size")
    monkeypatch.setattr(
        parallel_state,
        "get_data_parallel_world_size",
        lambda with_context_parallel=False: 1,  # an older signature
    )
    with pytest.raises(UnsupportedSetupError) as info:
        plugin.build_adapter([nn.Linear(2, 2)], Config(), None)
    message = str(info.value)
    assert "parallel_state.get_expert_tensor_parallel_world_size" in message
    assert "get_data_parallel_world_size(partial_data_parallel=)" in message


def test_unparsable_version_is_refused() -> None:
    with pytest.raises(UnsupportedSetupError, match="cannot read the version"):
        check_version("not-a-version")


def test_source_checkout_version_is_read_from_package_info(tmp_path: Path) -> None:
    import megatron

    installed = Path(next(iter(megatron.__path__))) / "core" / "package_info.py"
    assert version_from_package_info(installed) == installed_version()
    fake = tmp_path / "package_info.py"
    fake.write_text('MAJOR = 0\nMINOR = 17\nPATCH = 0\nPRE_RELEASE = "rc2"\n')
    assert version_from_package_info(fake) == "0.17.0rc2"
    fake.write_text("MAJOR = 0\n")
    with pytest.raises(UnsupportedSetupError, match="cannot read"):
        version_from_package_info(fake)


def test_distribution_pulls_megatron_core_and_the_extra_is_documented() -> None:
    """``pip install -e plugins/megatron`` requires megatron-core in the supported range,
    the core's ``megatron`` extra is this distribution, and the docs give the line."""
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    tomllib = pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")

    root = Path(__file__).resolve().parents[3]
    plugin = tomllib.loads((root / "plugins" / "megatron" / "pyproject.toml").read_text())
    mcore = [
        r for r in map(Requirement, plugin["project"]["dependencies"]) if r.name == "megatron-core"
    ]
    # Python 3.12 gets the whole supported range; an older Python the 0.16 releases,
    # the last ones that install there.
    by_python = {
        py: [
            str(r.specifier)
            for r in mcore
            if r.marker and r.marker.evaluate({"python_version": py})
        ]
        for py in ("3.10", "3.11", "3.12", "3.13")
    }
    assert by_python["3.12"] == by_python["3.13"] == [SpecifierSet(SUPPORTED)]
    assert by_python["3.10"] == by_python["3.11"] == [SpecifierSet(">=0.16,<0.17")]
    assert plugin["project"]["entry-points"]["scout.plugins"] == {
        "megatron": "scout_megatron:plugin"
    }
    core = tomllib.loads((root / "pyproject.toml").read_text())
    (extra,) = map(Requirement, core["project"]["optional-dependencies"]["megatron"])
    assert extra.name == plugin["project"]["name"] == "scout-megatron"
    line = 'pip install ".[megatron]" ./plugins/megatron'
    assert line in (root / "docs" / "megatron.md").read_text()
    assert line in (root / "plugins" / "megatron" / "README.md").read_text()
