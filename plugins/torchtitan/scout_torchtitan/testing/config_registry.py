"""TorchTitan config functions for SCOUT's CPU tests and example.

``--module scout_torchtitan.testing --config tiny_llama3`` selects
:func:`tiny_llama3` the way ``--module llama3 --config llama3_debugmodel`` selects
TorchTitan's debug model: ``ConfigManager`` imports ``<module>.config_registry``.
The model is TorchTitan's llama3 (``Llama3Model`` of ``Llama3TransformerBlock``,
``parallelize_llama``, ``pipeline_llm``), shrunk so six CPU ranks train it in well
under a second per step, with :class:`~scout_torchtitan.testing.attention.MathAttention`
in place of FlexAttention. Everything is float32 and seeded, so two runs are
bitwise equal.

The assets are not in the config: pass ``--hf_assets_path`` and
``--dataloader.dataset_path`` (see :class:`scout_torchtitan.testing.assets.TitanAssets`).

Import only after :func:`scout_torchtitan.testing.install_cpu_shims`.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from torch import nn
from torchtitan.components.checkpoint import CheckpointManager
from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
from torchtitan.components.metrics import MetricsProcessor
from torchtitan.components.optimizer import LRSchedulersContainer, default_adamw
from torchtitan.config import ParallelismConfig, TrainingConfig
from torchtitan.config.configs import DebugConfig
from torchtitan.distributed.pipeline_parallel import pipeline_llm
from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader
from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
from torchtitan.models.common.config_utils import make_ffn_config, make_gqa_config
from torchtitan.models.llama3 import Llama3Model, parallelize_llama
from torchtitan.models.llama3.model import Llama3TransformerBlock
from torchtitan.models.llama3.state_dict_adapter import Llama3StateDictAdapter
from torchtitan.protocols.model_spec import ModelSpec
from torchtitan.trainer import Trainer

from scout_torchtitan.testing.assets import VOCAB_SIZE
from scout_torchtitan.testing.attention import MathAttention

__all__ = ["tiny_llama3", "tiny_llama3_scout", "tiny_llama3_spec", "TINY"]

TINY: dict[str, int] = {"dim": 64, "n_heads": 4, "n_layers": 4, "hidden": 128, "vocab": 320}
"""Sizes of the shrunk llama3 (heads and vocab divide by TP 2; vocab >= the tokenizer's)."""

assert TINY["vocab"] >= VOCAB_SIZE

_Init = dict[str, Callable[..., Any]]


def _linear_init(std: float) -> _Init:
    return {"weight": partial(nn.init.trunc_normal_, std=std), "bias": nn.init.zeros_}


_NORM: _Init = {"weight": nn.init.ones_}
_EMBEDDING: _Init = {"weight": partial(nn.init.normal_, std=1.0)}


def _block(layer_id: int, dim: int, n_heads: int, hidden: int) -> Llama3TransformerBlock.Config:
    rope = ComplexRoPE.Config(dim=dim // n_heads, max_seq_len=4096, theta=500000.0)
    depth_std = 0.02 / (2 * (layer_id + 1)) ** 0.5
    return Llama3TransformerBlock.Config(
        attention_norm=RMSNorm.Config(normalized_shape=dim, param_init=_NORM),
        ffn_norm=RMSNorm.Config(normalized_shape=dim, param_init=_NORM),
        attention=make_gqa_config(
            dim=dim,
            n_heads=n_heads,
            wqkv_param_init=_linear_init(0.02),
            wo_param_init=_linear_init(depth_std),
            inner_attention=MathAttention.Config(),
            fuse_qkv=True,
            rope=rope,
        ),
        feed_forward=make_ffn_config(
            dim=dim,
            hidden_dim=hidden,
            w1_param_init=_linear_init(0.02),
            w2w3_param_init=_linear_init(depth_std),
        ),
    )


def tiny_llama3_spec() -> ModelSpec:
    """TorchTitan's llama3 ``ModelSpec`` at :data:`TINY` sizes, math attention."""
    dim, heads, vocab = TINY["dim"], TINY["n_heads"], TINY["vocab"]
    model = Llama3Model.Config(
        dim=dim,
        vocab_size=vocab,
        tok_embeddings=Embedding.Config(
            num_embeddings=vocab, embedding_dim=dim, param_init=_EMBEDDING
        ),
        norm=RMSNorm.Config(normalized_shape=dim, param_init=_NORM),
        lm_head=Linear.Config(
            in_features=dim, out_features=vocab, param_init=_linear_init(dim**-0.5)
        ),
        layers=[_block(i, dim, heads, TINY["hidden"]) for i in range(TINY["n_layers"])],
    )
    return ModelSpec(
        name="llama3",
        flavor="scout_tiny",
        model=model,
        parallelize_fn=parallelize_llama,
        pipelining_fn=pipeline_llm,
        post_optimizer_build_fn=None,
        state_dict_adapter=Llama3StateDictAdapter,
    )


def tiny_llama3() -> Trainer.Config:
    """The shrunk llama3 debug job: float32, seeded, deterministic, 10 steps of 2x32 tokens.

    ``spmd_backend`` stays TorchTitan's default; pass
    ``--parallelism.spmd_backend partial_dtensor`` for more than one rank on Gloo.
    """
    spec = tiny_llama3_spec()
    return Trainer.Config(
        model_spec=spec,
        loss=ChunkedLossWrapper.Config(
            loss_fn=CrossEntropyLoss.Config(global_vocab_size=TINY["vocab"])
        ),
        optimizer=default_adamw(lr=8e-4),
        lr_scheduler=LRSchedulersContainer.Config(
            warmup_steps=2, decay_ratio=0.8, decay_type="linear", min_lr_factor=0.0
        ),
        training=TrainingConfig(
            local_batch_size=2,
            seq_len=32,
            steps=10,
            mixed_precision_param="float32",
            disable_cuda_graphs=True,
        ),
        dataloader=HuggingFaceTextDataLoader.Config(dataset="c4_test"),
        metrics=MetricsProcessor.Config(log_freq=1, disable_color_printing=True),
        parallelism=ParallelismConfig(),
        checkpoint=CheckpointManager.Config(interval=5, last_save_model_only=False),
        debug=DebugConfig(seed=1234, deterministic=True),
    )


def tiny_llama3_scout() -> Any:
    """:func:`tiny_llama3` under ``ScoutTrainer``: ``--scout.*`` flags, SCOUT off by default."""
    from scout_torchtitan.trainer import with_scout

    return with_scout(tiny_llama3())
