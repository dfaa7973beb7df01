"""Layer, embedding and LM-head discovery, and the errors for paths that do not exist."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from scout_core.errors import ConfigError
from scout_core.integration.discovery import candidate_lists, discover, unwrap
from scout_core.testing.models import TinyLM


class Mixed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(10, 4)
        self.small = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])
        self.mixed = nn.ModuleList([nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4), nn.ReLU()])
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(4, 4)) for _ in range(3)])
        self.out = nn.Linear(4, 10)


def test_largest_same_class_list_wins_and_mixed_lists_are_ignored() -> None:
    found = discover(Mixed())
    assert [r.path for r in found.layers] == ["blocks.0", "blocks.1", "blocks.2"]
    assert [p for p, _ in candidate_lists(Mixed())] == ["blocks", "small"]
    assert found.embedding is not None and found.embedding.path == "tok"
    assert found.lm_head is not None and found.lm_head.path == "out"


def test_tiny_lm_parts() -> None:
    found = discover(TinyLM(layers=3))
    assert [r.path for r in found.layers] == ["layers.0", "layers.1", "layers.2"]
    assert found.embedding is not None and found.embedding.path == "embed"
    assert found.lm_head is not None and found.lm_head.path == "head"


def test_configured_paths_override() -> None:
    found = discover(Mixed(), layers="small", lm_head="blocks.0.0")
    assert [r.path for r in found.layers] == ["small.0", "small.1"]
    assert found.lm_head is not None and found.lm_head.path == "blocks.0.0"


def test_missing_layer_path_names_it_and_the_candidates() -> None:
    with pytest.raises(ConfigError) as info:
        discover(Mixed(), layers="model.layers")
    msg = str(info.value)
    assert "'layers'" in msg and "'model.layers'" in msg
    assert "blocks" in msg and "small" in msg


def test_layer_path_that_is_not_a_list() -> None:
    with pytest.raises(ConfigError, match="not a non-empty ModuleList"):
        discover(Mixed(), layers="out")


def test_missing_embedding_and_head_paths() -> None:
    with pytest.raises(ConfigError, match=r"'embedding'.*'nope'.*tok"):
        discover(Mixed(), embedding="nope")
    with pytest.raises(ConfigError, match=r"'lm_head'.*'nope'"):
        discover(Mixed(), lm_head="nope")


def test_enable_fails_on_a_missing_layer_before_attaching_anything() -> None:
    from scout_core.config import Config
    from scout_core.plugin.torch_plugin import enable_torch

    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ConfigError, match=r"'model\.blocks'.*candidate ModuleLists: layers"):
        enable_torch(model, opt, Config(layers="model.blocks", observer=False))
    assert not model._forward_pre_hooks and not opt._optimizer_step_pre_hooks


def test_unwrap_looks_through_wrappers_only() -> None:
    model = TinyLM()

    class DataParallel(nn.Module):  # stands in for a .module wrapper
        def __init__(self, module: nn.Module) -> None:
            super().__init__()
            self.module = module

    assert unwrap(DataParallel(model)) is model
    assert unwrap(model) is model


def _checkpointed(model: TinyLM) -> TinyLM:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    for i, block in enumerate(model.layers):
        model.layers[i] = checkpoint_wrapper(block)
    return model


class DictLM(nn.Module):
    """Blocks in a ModuleDict keyed like a pipeline stage ("2", "3"), checkpoint-wrapped."""

    def __init__(self) -> None:
        super().__init__()
        inner = _checkpointed(TinyLM(layers=2))
        self.embed = inner.embed
        self.layers = nn.ModuleDict({"2": inner.layers[0], "3": inner.layers[1]})
        self.extra = nn.ModuleDict({"a": nn.Linear(4, 4)})
        self.head = inner.head


def test_checkpoint_wrapped_blocks_get_two_handles() -> None:
    from scout_core.testing.models import Block

    model = _checkpointed(TinyLM(layers=3))
    found = discover(model)
    assert [r.path for r in found.layers] == ["layers.0", "layers.1", "layers.2"]
    for i, ref in enumerate(found.layers):
        assert isinstance(ref.module, Block)  # the block inside: replay runs it
        assert ref.outer is model.layers[i] and ref.hooked is ref.outer  # capture hooks here
        assert type(ref.outer).__name__ == "CheckpointWrapper"
    assert found.lm_head is not None and found.lm_head.path == "head"
    plain = discover(TinyLM(layers=2))
    assert all(ref.outer is None and ref.hooked is ref.module for ref in plain.layers)


def test_a_module_dict_of_blocks_is_found_in_its_own_order() -> None:
    from scout_core.testing.models import Block

    model = DictLM()
    assert [p for p, _ in candidate_lists(model)] == ["layers", "extra"]
    found = discover(model)
    assert [r.path for r in found.layers] == ["layers.2", "layers.3"]
    assert all(isinstance(r.module, Block) and r.outer is not None for r in found.layers)
    assert discover(model, layers="layers").layers == found.layers
    assert found.embedding is not None and found.embedding.path == "embed"
    assert found.lm_head is not None and found.lm_head.path == "head"


def test_a_module_dict_of_mixed_classes_is_not_a_candidate() -> None:
    model = nn.Module()
    model.layers = nn.ModuleDict({"0": nn.Linear(2, 2), "1": nn.ReLU()})
    assert candidate_lists(model) == []
    assert discover(model).layers == ()
