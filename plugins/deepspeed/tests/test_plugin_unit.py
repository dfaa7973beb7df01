"""The plugin without a process group: discovery, versions, the "scout" section, layouts."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from scout_core import Axis, ConfigError, UnsupportedSetupError


def test_registered_under_entry_point_group() -> None:
    import scout_deepspeed

    from scout_core.testing import installed_plugins

    assert installed_plugins()["deepspeed"] is scout_deepspeed.plugin


def test_declines_foreign_objects() -> None:
    import torch
    from scout_deepspeed import plugin

    assert not plugin.handles(torch.nn.Linear(2, 2))
    assert not plugin.handles(object())
    assert not plugin.handles([torch.nn.Linear(2, 2)])


def test_enable_refuses_objects_that_are_not_engines() -> None:
    from scout_deepspeed import enable

    with pytest.raises(UnsupportedSetupError, match="attaches to the engine"):
        enable(object())


def test_supported_versions() -> None:
    from scout_deepspeed import SUPPORTED_DEEPSPEED, check_version, plugin

    assert plugin.supported == SUPPORTED_DEEPSPEED == ">=0.19,<0.20"
    assert check_version("0.19.8") == "0.19.8"
    assert check_version("0.19.8+cafe") == "0.19.8+cafe"
    assert check_version() == plugin.check_version()  # the installed release is supported
    for bad in ("0.18.9", "0.20.0", "1.0.0"):
        with pytest.raises(UnsupportedSetupError, match=rf"deepspeed {bad} is installed"):
            check_version(bad)


def test_section_errors_name_the_key() -> None:
    from scout_deepspeed import section_config

    with pytest.raises(ConfigError, match="unknown key 'replay_intervall'"):
        section_config({"replay_intervall": 3})
    with pytest.raises(ConfigError, match=r"'replay_interval' must be in 1\.\.1,000,000, got -1"):
        section_config({"replay_interval": -1})
    with pytest.raises(ConfigError, match="expected an object"):
        section_config(["replay_interval"])
    assert section_config({"replay_interval": 7}).replay_interval == 7


def test_environment_overrides_the_section(monkeypatch: pytest.MonkeyPatch) -> None:
    from scout_deepspeed import section_config

    monkeypatch.setenv("SCOUT_REPLAY_INTERVAL", "11")
    assert section_config({"replay_interval": 7}).replay_interval == 11


def test_config_for_reads_the_engine_section() -> None:
    from scout_deepspeed import config_for

    engine = SimpleNamespace(_config=SimpleNamespace(_param_dict={"scout": {"kappa": 3.0}}))
    cfg = config_for(engine)
    assert cfg is not None and cfg.kappa == 3.0
    assert config_for(SimpleNamespace(_config=SimpleNamespace(_param_dict={}))) is None
    bad = SimpleNamespace(_config=SimpleNamespace(_param_dict={"scout": {"kapa": 3.0}}))
    with pytest.raises(ConfigError, match="unknown key 'kapa'"):
        config_for(bad)


def _engine(stage: int, **attrs: Any) -> Any:
    return SimpleNamespace(zero_optimization_stage=lambda: stage, **attrs)


def test_layout_pure_data_parallel_and_zero3() -> None:
    from scout_deepspeed.layout import engine_layout

    z2 = engine_layout(_engine(2, dp_world_size=4), 4)
    assert (z2.size(Axis.D), z2.size(Axis.S)) == (4, 1)
    assert z2.replica_group(2) == (0, 1, 2, 3)
    z3 = engine_layout(_engine(3, dp_world_size=4), 4)
    assert (z3.size(Axis.D), z3.size(Axis.S)) == (1, 4)
    assert z3.shard_group(2) == (0, 1, 2, 3)


# The tensor-parallel layout is checked against a real DeepSpeed AutoTP engine in
# test_deepspeed_parallel.py (test_autotp_layout_is_deepspeeds_own_groups).


def test_layout_from_the_pipeline_topology() -> None:
    pytest.importorskip("deepspeed")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from deepspeed.runtime.pipe.topology import PipeDataParallelTopology

    from scout_deepspeed.layout import engine_layout

    class PipelineEngine:  # is_pipeline() goes by class name and a grid
        def __init__(self) -> None:
            self.grid = SimpleNamespace(_topo=PipeDataParallelTopology(num_pp=2, num_dp=3))

        def zero_optimization_stage(self) -> int:
            return 1

    layout = engine_layout(PipelineEngine(), 6)
    assert layout.size(Axis.P) == 2 and layout.size(Axis.D) == 3
    assert layout.replica_group(4) == (3, 4, 5)  # peers are the stage's data-parallel ranks
    assert layout.address(4).get(Axis.P) == 1


def test_pipeline_layers_are_the_numbered_same_class_children() -> None:
    from scout_deepspeed.adapter import pipeline_layers
    from torch import nn

    from scout_core.testing import Block

    stage = nn.Module()
    stage.add_module("3", Block(4))
    stage.add_module("4", Block(4))
    stage.add_module("5", nn.Linear(4, 4))
    stage.add_module("tied_modules", nn.ModuleDict())
    assert [r.path for r in pipeline_layers(stage)] == ["3", "4"]
