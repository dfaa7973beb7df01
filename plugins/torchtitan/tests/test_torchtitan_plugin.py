"""The torchtitan plugin on the core's plugin base: facts, discovery, refusals, settings."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from scout_core import Config, UnsupportedSetupError


def test_registered_under_entry_point_group() -> None:
    from scout_torchtitan import TitanPlugin, plugin

    from scout_core.testing import installed_plugins

    found = installed_plugins()["torchtitan"]
    assert found is plugin and isinstance(plugin, TitanPlugin)


def test_plugin_facts() -> None:
    from scout_torchtitan import plugin

    assert (plugin.name, plugin.distribution, plugin.framework) == (
        "torchtitan",
        "scout-torchtitan",
        "torchtitan",
    )
    assert plugin.supported == ">=0.3,<0.4" and plugin.prefixes == ("torchtitan.",)
    assert plugin.gates_checkpoints
    assert plugin.check_version().startswith("0.3")
    with pytest.raises(UnsupportedSetupError, match=r"supports TorchTitan >=0\.3,<0\.4.*0\.2\.1"):
        plugin.check_version("0.2.1")


def test_declines_foreign_objects_and_claims_torchtitan_ones() -> None:
    from scout_torchtitan import plugin
    from torchtitan.trainer import Trainer

    assert not plugin.handles(torch.nn.Linear(2, 2))
    assert not plugin.handles(object())
    assert not plugin.handles([torch.nn.Linear(2, 2)])
    fake = object.__new__(Trainer)  # the class decides; nothing is built
    assert plugin.handles(fake)


def test_build_adapter_refuses_what_is_not_a_trainer_by_name() -> None:
    from scout_torchtitan import plugin

    with pytest.raises(
        UnsupportedSetupError, match=r"attaches to a TorchTitan Trainer.*parallel_dims"
    ):
        plugin.build_adapter(torch.nn.Linear(2, 2), Config())
    trainer = SimpleNamespace(parallel_dims=None, model_parts=[], optimizers=None)
    with pytest.raises(UnsupportedSetupError, match="unexpected: int"):
        plugin.build_adapter(trainer, Config(), 3)


def test_expert_parallelism_is_refused_naming_the_core_gap() -> None:
    from scout_torchtitan.adapter import TitanAdapter

    trainer = SimpleNamespace(parallel_dims=SimpleNamespace(ep=2), model_parts=[], optimizers=None)
    with pytest.raises(UnsupportedSetupError, match=r"ep=2.*MeshLayout cannot express"):
        TitanAdapter(trainer, Config())


def test_settings_come_from_a_scout_trainer_or_scouts_checkpoint_config() -> None:
    from scout_torchtitan import plugin

    on = Config(replay_interval=7)
    assert plugin.config_section(SimpleNamespace(config=SimpleNamespace(scout=on))) == on.to_dict()
    checkpoint = SimpleNamespace(scout=on)
    trainer = SimpleNamespace(config=SimpleNamespace(checkpoint=checkpoint))
    assert plugin.config_section(trainer) == on.to_dict()
    stock = SimpleNamespace(config=SimpleNamespace(checkpoint=SimpleNamespace()))
    assert plugin.config_section(stock) is None


def test_disabled_settings_attach_nothing() -> None:
    from scout_torchtitan import plugin, session_of

    trainer = SimpleNamespace(parallel_dims=None, model_parts=[], optimizers=None)
    session = plugin.enable(trainer, config=Config(enabled=False))
    assert not session.enabled and session_of(trainer) is session
    session.close()
