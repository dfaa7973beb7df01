"""The supported megatron-core range and how the installed version is read."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from scout_megatron.versions import (
    SUPPORTED,
    check_version,
    installed_version,
    version_from_package_info,
)

from scout_core import UnsupportedSetupError


def test_installed_version_is_supported() -> None:
    assert installed_version() == "0.16.1"
    assert check_version() == "0.16.1"
    assert SUPPORTED == ">=0.16,<0.17"


@pytest.mark.parametrize("version", ["0.16.0", "0.16.1", "0.16.2rc0", "0.16.9"])
def test_every_0_16_release_is_accepted(version: str) -> None:
    assert check_version(version) == version


@pytest.mark.parametrize("version", ["0.15.3", "0.17.0", "0.17.0rc1", "1.0.0"])
def test_other_releases_are_refused_naming_both(version: str) -> None:
    with pytest.raises(UnsupportedSetupError) as info:
        check_version(version)
    assert version in str(info.value) and SUPPORTED in str(info.value)


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

    tomllib = pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")

    root = Path(__file__).resolve().parents[3]
    plugin = tomllib.loads((root / "plugins" / "megatron" / "pyproject.toml").read_text())
    requires = {r.name: r for r in map(Requirement, plugin["project"]["dependencies"])}
    assert str(requires["megatron-core"].specifier) == str(Requirement(f"x{SUPPORTED}").specifier)
    assert plugin["project"]["entry-points"]["scout.plugins"] == {
        "megatron": "scout_megatron:plugin"
    }
    core = tomllib.loads((root / "pyproject.toml").read_text())
    (extra,) = map(Requirement, core["project"]["optional-dependencies"]["megatron"])
    assert extra.name == plugin["project"]["name"] == "scout-megatron"
    line = 'pip install ".[megatron]" ./plugins/megatron'
    assert line in (root / "docs" / "megatron.md").read_text()
    assert line in (root / "plugins" / "megatron" / "README.md").read_text()
