"""A math attention for TorchTitan models on CPU (tests and the CPU example only).

TorchTitan 0.3's language models use FlexAttention: compiled ``flex_attention`` has
no CPU backward, ``varlen`` needs CUDA flash attention, and the model registries
refuse ``"sdpa"`` for language models because it cannot apply per-document masks.
For tests we still want a real TorchTitan attention module, so
:class:`MathAttention` is TorchTitan's own ``ScaledDotProductAttention`` pinned to
the math backend (deterministic, differentiable on CPU).

What changes for the model: attention is causal over the whole packed sequence
instead of block-causal per document, and the trainer builds no attention masks
(it only does so for Flex/Varlen configs), so nothing is compiled. TorchTitan's own
graph-trainer tests use the same maskless SDPA configuration.

Two ways in:

* config functions build layers with ``MathAttention.Config()`` directly
  (:mod:`scout_torchtitan.testing.config_registry` does);
* any stock config can be switched with the override below:
  ``--override.imports scout_torchtitan.testing.attention.math_attention``.

Import this module only after :func:`scout_torchtitan.testing.install_cpu_shims`
(it imports TorchTitan model code).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.nn.attention import SDPBackend
from torchtitan.config.override import override
from torchtitan.models.common.attention import FlexAttention, ScaledDotProductAttention

__all__ = ["MathAttention", "math_attention"]


class MathAttention(ScaledDotProductAttention):  # type: ignore[misc]  # untyped base
    """TorchTitan's ``ScaledDotProductAttention``, math kernel only, causal."""

    @dataclass(kw_only=True, slots=True)
    class Config(ScaledDotProductAttention.Config):  # type: ignore[misc]  # untyped base
        """No fields: the math backend is the whole point."""

    sdpa_backends = [SDPBackend.MATH]  # noqa: RUF012  # mirrors the base's class attribute


@override(  # type: ignore[untyped-decorator]  # torchtitan is untyped
    target=FlexAttention.Config,
    description="SCOUT CPU tests: math SDPA in place of FlexAttention (no CPU backward)",
)
def math_attention(cfg: FlexAttention.Config) -> MathAttention.Config:
    """Replace every FlexAttention with :class:`MathAttention` (CPU tests only)."""
    del cfg  # FlexAttention's block size and kernel options mean nothing here
    return MathAttention.Config()
