"""TorchTitan config functions that run under :class:`~scout_torchtitan.trainer.ScoutTrainer`.

``--module scout_torchtitan --config <name>`` picks one; each wraps a stock TorchTitan config
function with :func:`~scout_torchtitan.trainer.with_scout`, so stock flags work and ``--scout.*``
flags are added. SCOUT stays off unless ``--scout.enabled``.
"""

from __future__ import annotations

from scout_torchtitan.trainer import ScoutTrainer, with_scout

__all__ = ["llama3_debugmodel"]


def llama3_debugmodel() -> ScoutTrainer.Config:
    """TorchTitan's ``llama3_debugmodel`` with a ``scout`` section."""
    from torchtitan.models.llama3.config_registry import llama3_debugmodel as stock

    return with_scout(stock())
