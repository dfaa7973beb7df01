"""Switching SCOUT on: the override factory, ``ScoutTrainer``'s flags, the version gate.

All at config level (no process group): TorchTitan applies overrides to the config
tree with ``apply_overrides`` before building anything, and ``ConfigManager`` parses
``--module/--config`` plus tyro flags.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from scout_torchtitan.manager import ScoutCheckpointManager
from scout_torchtitan.testing.config_registry import tiny_llama3
from scout_torchtitan.versions import SUPPORTED_RANGE, check_version, detect_api
from torchtitan.components.checkpoint import CheckpointManager
from torchtitan.config import ConfigManager
from torchtitan.config.override import OverrideConfig, apply_overrides

from scout_core import Config, ConfigError, UnsupportedSetupError

TARGET = "scout_torchtitan.overrides.scout"


def _apply(cfg: Any, **settings: Any) -> Any:
    apply_overrides(OverrideConfig(imports=[(TARGET, settings)]), cfg)
    return cfg


def test_override_swaps_in_scouts_manager_with_validated_settings() -> None:
    cfg = tiny_llama3()
    cfg.checkpoint.interval = 7
    _apply(cfg, replay_interval=20, recipes=["hidden", "optimizer"], report_dir="/tmp/r")
    ckpt = cfg.checkpoint
    assert type(ckpt) is ScoutCheckpointManager.Config
    assert ckpt.interval == 7  # TorchTitan's own checkpoint settings are kept
    assert ckpt.scout == Config(
        replay_interval=20, recipes=("hidden", "optimizer"), report_dir="/tmp/r"
    )
    _apply(cfg, replay_interval=5)  # applied twice: still SCOUT's, new settings
    assert type(cfg.checkpoint) is ScoutCheckpointManager.Config
    assert cfg.checkpoint.scout.replay_interval == 5


def test_override_is_also_a_config_function_entry() -> None:
    cfg = tiny_llama3()
    cfg.override = OverrideConfig(imports=[(TARGET, {"hang_timeout_s": 30.0})])
    apply_overrides(cfg.override, cfg)
    assert cfg.checkpoint.scout.hang_timeout_s == 30.0


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"replay_intervall": 20}, "replay_intervall"),
        ({"replay_interval": "20"}, "replay_interval"),
        ({"on_hang": "explode"}, "on_hang"),
    ],
)
def test_bad_settings_fail_naming_the_key(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        _apply(tiny_llama3(), **settings)
    assert "--override.imports scout_torchtitan.overrides.scout" in str(err.value)


def test_torchft_manager_keeps_its_behaviour_under_scout() -> None:
    from scout_torchtitan.torchft import ScoutTorchFTCheckpointManager
    from torchtitan.experiments.torchft.checkpoint import TorchFTCheckpointManager
    from torchtitan.experiments.torchft.llama3.config_registry import llama3_torchft_debugmodel

    cfg = llama3_torchft_debugmodel()
    cfg.checkpoint.enable_ft_dataloader_checkpoints = False
    _apply(cfg, replay_interval=11)
    ckpt = cfg.checkpoint
    assert type(ckpt) is ScoutTorchFTCheckpointManager.Config
    assert isinstance(ckpt, TorchFTCheckpointManager.Config)
    assert ckpt.enable_ft_dataloader_checkpoints is False and ckpt.scout.replay_interval == 11
    assert issubclass(ScoutTorchFTCheckpointManager, TorchFTCheckpointManager)


class _CustomManager(CheckpointManager):  # type: ignore[misc]  # untyped base
    @dataclass(kw_only=True, slots=True)
    class Config(CheckpointManager.Config):  # type: ignore[misc]  # untyped base
        extra: int = 1


def test_unknown_manager_subclass_is_refused_by_name() -> None:
    cfg = tiny_llama3()
    cfg.checkpoint = _CustomManager.Config()
    with pytest.raises(UnsupportedSetupError, match=r"_CustomManager\.Config"):
        _apply(cfg, replay_interval=3)


def _parse(*args: str) -> Any:
    return ConfigManager().parse_args(["--module", "scout_torchtitan.testing", *args])


def test_scout_trainer_takes_scout_flags() -> None:
    from scout_torchtitan.trainer import ScoutTrainer

    off = _parse("--config", "tiny_llama3_scout")
    assert type(off) is ScoutTrainer.Config and off.scout == Config(enabled=False)
    on = _parse(
        "--config",
        "tiny_llama3_scout",
        "--scout.enabled",
        "--scout.replay_interval",
        "5",
        "--scout.recipes",
        "hidden",
        "lm_head",
        "--training.steps",
        "3",
    )
    assert on.scout == Config(replay_interval=5, recipes=("hidden", "lm_head"))
    assert on.training.steps == 3


@pytest.mark.parametrize(
    "flags", [("--scout.replay_intervall", "5"), ("--scout.replay_interval", "0")]
)
def test_scout_trainer_rejects_bad_flags(flags: tuple[str, str]) -> None:
    with pytest.raises(SystemExit):
        _parse("--config", "tiny_llama3_scout", *flags)


def test_plugin_config_registry_serves_the_stock_debug_model() -> None:
    from scout_torchtitan.trainer import ScoutTrainer

    cfg = ConfigManager().parse_args(
        ["--module", "scout_torchtitan", "--config", "llama3_debugmodel", "--scout.enabled"]
    )
    assert type(cfg) is ScoutTrainer.Config and cfg.scout.enabled
    assert cfg.model_spec is not None and cfg.model_spec.flavor == "debugmodel"


def test_with_scout_refuses_subclassed_trainer_configs() -> None:
    from scout_torchtitan.trainer import with_scout
    from torchtitan.experiments.torchft.llama3.config_registry import llama3_torchft_debugmodel

    with pytest.raises(UnsupportedSetupError, match=r"FaultTolerantTrainer\.Config"):
        with_scout(llama3_torchft_debugmodel())
    with pytest.raises(ConfigError, match="bogus"):
        with_scout(tiny_llama3(), bogus=1)


@pytest.mark.parametrize("version", ["0.3.0", "0.3.7", "0.3.1.dev20261201+cpu"])
def test_supported_versions(version: str) -> None:
    assert check_version(version) == version


@pytest.mark.parametrize(
    ("version", "api", "why"),
    [
        ("0.2.2", None, "TOML"),
        ("0.1.0", None, "TOML"),
        ("0.4.0", None, "not the ones"),
        ("0.0.0", "<=0.2", "TOML"),
        ("0.0.0", "unknown", "not the ones"),
    ],
)
def test_unsupported_versions_name_the_supported_range(
    version: str, api: str | None, why: str
) -> None:
    with pytest.raises(UnsupportedSetupError) as err:
        check_version(version, api=api)
    assert SUPPORTED_RANGE in str(err.value) and version in str(err.value)
    assert why in str(err.value)


def test_installed_torchtitan_is_the_supported_api() -> None:
    assert detect_api() == "0.3"
    assert check_version("0.0.0") == "0.0.0"  # a source checkout: the API decides
    assert check_version().startswith("0.3")
