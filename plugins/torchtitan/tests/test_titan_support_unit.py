"""Single-process checks of the CPU shims, generated assets, math attention and the
plugin's fact functions on TorchTitan objects built without a process group."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from scout_torchtitan.testing import shims
from torch import nn


def test_shims_patch_what_cpu_needs_and_come_off_again() -> None:
    from torchtitan.components import metrics
    from torchtitan.distributed import utils as dist_utils
    from torchtitan.tools import utils

    assert shims.needs_device_shim() and shims.cpu_shims_installed()
    assert (utils.device_type, utils.device_module) == ("cpu", torch.cpu)
    kernels = sys.modules["torchtitan.distributed.minimal_async_ep.kernels"]
    if importlib.util.find_spec("triton") is None:
        # CPU wheels of torch ship no triton: the stand-in raises if a kernel is called.
        with pytest.raises(RuntimeError, match="needs triton and CUDA"):
            kernels.fill_dispatch_metadata_kernel()
    else:
        # The index's default (CUDA) torch brings triton: TorchTitan's own module is kept.
        assert kernels.__file__ is not None and "scout_torchtitan" not in (kernels.__doc__ or "")
    monitor = metrics.build_device_memory_monitor()
    assert isinstance(monitor, metrics.DeviceMemoryMonitor) and monitor.device_name == "cpu"
    assert monitor.device_capacity > 0 and monitor.get_peak_stats().max_reserved_gib == 0.0
    patched = dist_utils.set_pg_timeouts
    assert patched.__module__ == shims.__name__
    shims.install_cpu_shims()  # idempotent
    assert dist_utils.set_pg_timeouts is patched
    try:
        shims.uninstall_cpu_shims()
        assert utils.device_type == "cuda" and dist_utils.set_pg_timeouts is not patched
        assert metrics.build_device_memory_monitor.__module__ == metrics.__name__
    finally:
        shims.install_cpu_shims()
    assert utils.device_type == "cpu"


def test_shims_refuse_to_half_patch_after_torchtitan_was_imported() -> None:
    code = (
        "import torchtitan.distributed.parallel_dims\n"
        "from scout_torchtitan.testing import install_cpu_shims\n"
        "install_cpu_shims()\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert proc.returncode != 0
    assert "must run before TorchTitan modules" in proc.stderr
    assert "torchtitan.distributed.parallel_dims" in proc.stderr


def test_assets_are_deterministic_and_load_in_torchtitan(tmp_path: Path) -> None:
    from scout_torchtitan.testing import write_assets
    from scout_torchtitan.testing.assets import VOCAB_SIZE
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    a, b = write_assets(tmp_path / "a"), write_assets(tmp_path / "b")
    for name in (
        "tokenizer/tokenizer.json",
        "tokenizer/tokenizer_config.json",
        "c4_test/train.jsonl",
    ):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert len((tmp_path / "a/c4_test/train.jsonl").read_text().splitlines()) == 400
    assert (
        write_assets(tmp_path / "c", seed=1).dataset_dir.joinpath("train.jsonl").read_bytes()
        != (a.dataset_dir / "train.jsonl").read_bytes()
    )
    tok = HuggingFaceTokenizer(tokenizer_path=str(b.tokenizer_dir))
    ids = tok.encode("replay é", add_bos=True, add_eos=True)
    assert ids[0] == 256 and ids[-1] == 257 and tok.get_vocab_size() == VOCAB_SIZE
    assert tok.decode(ids) == "replay é"
    assert a.cli_args()[:2] == ["--hf_assets_path", str(a.tokenizer_dir)]


def test_math_attention_is_causal_sdpa_with_a_cpu_backward() -> None:
    from scout_torchtitan.testing.attention import MathAttention
    from torchtitan.config.override import OverrideConfig, apply_overrides
    from torchtitan.models.common.attention import FlexAttention
    from torchtitan.models.llama3.config_registry import llama3_debugmodel

    q, k, v = (torch.randn(2, 8, 4, 16, requires_grad=True) for _ in range(3))
    out = MathAttention(MathAttention.Config())(q, k, v)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
    ).transpose(1, 2)
    torch.testing.assert_close(out, ref)
    out.sum().backward()
    assert q.grad is not None
    cfg = llama3_debugmodel()
    target = "scout_torchtitan.testing.attention.math_attention"
    apply_overrides(OverrideConfig(imports=[target]), cfg)
    inner = [layer.attention.inner_attention for layer in cfg.model_spec.model.layers]
    assert inner and all(type(c) is MathAttention.Config for c in inner)
    assert not any(isinstance(c, FlexAttention.Config) for c in inner)


def _tiny_model() -> nn.Module:
    from scout_torchtitan.testing.config_registry import tiny_llama3_spec

    with torch.device("meta"):
        model: nn.Module = tiny_llama3_spec().model.build()
    return model


def test_modules_of_a_decoder_and_of_pipeline_stages() -> None:
    from scout_torchtitan.modules import titan_modules
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    from scout_core import Config

    model = _tiny_model()
    found = titan_modules([model])
    assert [layer.path for layer in found.layers] == [f"layers.{i}" for i in range(4)]
    assert all(layer.outer is None for layer in found.layers)
    assert found.embedding is not None and found.embedding.module is model.tok_embeddings
    assert found.lm_head is not None and found.lm_head.module is model.lm_head
    # Activation checkpointing wraps each block: two handles, the canonical path.
    for key in ("0", "1", "2", "3"):
        model.layers[key] = checkpoint_wrapper(model.layers[key])
    wrapped = titan_modules([model])
    assert [layer.path for layer in wrapped.layers] == [f"layers.{i}" for i in range(4)]
    assert all(
        layer.outer is model.layers[str(i)]
        and type(layer.module).__name__ == "Llama3TransformerBlock"
        for i, layer in enumerate(wrapped.layers)
    )
    # Pipeline stages keep the original layer keys; ends live on the first / last stage.
    first, last = _tiny_model(), _tiny_model()
    for key in ("2", "3"):
        del first.layers[key]
    for key in ("0", "1"):
        del last.layers[key]
    first.lm_head = first.norm = None
    last.tok_embeddings = None
    staged = titan_modules([first, last])
    assert [x.path for x in staged.layers] == ["layers.0", "layers.1", "layers.2", "layers.3"]
    assert staged.layers[0].module is first.layers["0"]
    assert staged.layers[3].module is last.layers["3"]
    assert staged.embedding is not None and staged.embedding.module is first.tok_embeddings
    assert staged.lm_head is not None and staged.lm_head.module is last.lm_head
    with pytest.raises(ValueError, match="not a TorchTitan decoder"):
        titan_modules([nn.Linear(2, 2)])
    # SCOUT's own settings name other paths, as for any model.
    custom = titan_modules([_tiny_model()], Config(lm_head="norm", embedding="tok_embeddings"))
    assert custom.lm_head is not None and custom.lm_head.path == "norm"


def test_optimizers_container_and_parts() -> None:
    from scout_torchtitan.optimizers import titan_optimizers
    from torchtitan.components.optimizer import default_adamw

    parts = [nn.Linear(4, 4), nn.Linear(4, 2)]
    config = default_adamw(lr=1e-3)
    config.implementation = "for-loop"
    container = config.build(model_parts=parts)
    opts = titan_optimizers(container, parts)
    assert opts.container is container and isinstance(container, torch.optim.Optimizer)
    assert [(p.part, type(p.optimizer).__name__) for p in opts.per_part] == [
        (0, "AdamW"),
        (1, "AdamW"),
    ]
    fired: list[str] = []
    container.register_step_post_hook(lambda *_: fired.append("container"))
    for p in opts.per_part:
        p.optimizer.register_step_post_hook(lambda *_, i=p.part: fired.append(f"part{i}"))
    for part in parts:
        part(torch.ones(1, 4)).sum().backward()
    container.step()
    assert fired == ["part0", "part1", "container"]
    with pytest.raises(TypeError, match=r"not a torch\.optim\.Optimizer"):
        titan_optimizers(object(), parts)
    with pytest.raises(ValueError, match="model parts"):
        titan_optimizers(container, parts[:1])


def test_detach_removes_only_torchtitans_forward_wrappers() -> None:
    from scout_torchtitan.replay import detach_titan_parallelism, parallel_forwards

    def forward_with_redistribution(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the wrapper must not run")

    forward_with_redistribution.__module__ = "torchtitan.protocols.module"
    forward_with_redistribution.__qualname__ = (
        "Module.parallelize.<locals>.forward_with_redistribution"
    )
    twin = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    twin[0].forward = forward_with_redistribution  # type: ignore[method-assign]
    own = twin[1].forward
    twin[1].__dict__["forward"] = own  # a user's own instance forward stays
    twin[1].__dict__["tp_group"] = object()
    assert parallel_forwards(twin) == ["0"]
    assert detach_titan_parallelism(twin) is twin
    assert parallel_forwards(twin) == [] and "forward" not in twin[0].__dict__
    assert twin[1].__dict__["forward"] is own and twin[1].__dict__["tp_group"] is None
    assert twin(torch.ones(1, 2)).shape == (1, 2)
