"""Test tooling shipped with SCOUT, for its own tests, plugin tests, examples and users.

* :func:`run_ranks`: run a function on N local ranks over Gloo with a hard timeout
  (forked from a process that has imported torch, and ``SCOUT_TEST_PRELOAD``'s
  modules: ``zygotes.py``).
* :class:`Faults`: deterministic fault injectors keyed by (rank, step);
  :func:`comm_delay` stalls this rank inside SCOUT's timed diagnostic collectives of
  one group kind (what a plugin's own timed collective reads through
  ``scout_core.plugin_api.injected_delay``).
* :class:`TrialFault`: one ``scout campaign`` trial's fault (any of ``FAULT_KINDS``),
  armed inside a setup's training loop; each plugin's campaign rank body uses it.
  :class:`Setup`: a campaign setup, as a plugin registers its own.
* The shared conformance bodies: :func:`check_plugin`, :func:`check_adapter`,
  :func:`check_checkpoint_io`; :func:`installed_plugins` lists what the
  ``scout.plugins`` entry points load.
* The tiny models the tests, benchmarks and the demo share: :class:`TinyLM`,
  :class:`Block`, :func:`batch`, :func:`train_step`, ``VOCAB``.
* :func:`signature` / :func:`signature_many`: bitwise fingerprints of tensors, to
  compare training states in tests.
* :func:`discover_catalog` / :func:`distinct_verdicts`: the MoE tests' shape catalog
  (through the CLI) and the distinct verdicts of a run.

Plugins and examples import these names only as ``from scout_core.testing import X``.
Importing this package does not import torch until a name is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scout_core.decision.signature import signature, signature_many
    from scout_core.testing.checkpoint_io import check_checkpoint_io
    from scout_core.testing.conformance import check_adapter, check_plugin, installed_plugins
    from scout_core.testing.harness import RankFailedError, RanksTimeoutError, run_ranks
    from scout_core.testing.injectors import (
        AddNoise,
        BitFlip,
        Faults,
        Scale,
        comm_delay,
        flip_bit,
    )
    from scout_core.testing.launches import (
        check_documented_launch,
        documented_launches,
        runnable,
    )
    from scout_core.testing.models import VOCAB, Block, TinyLM, batch, train_step
    from scout_core.testing.moe_checks import discover_catalog, distinct_verdicts
    from scout_core.testing.round_log import RoundLog, ran_every_due_round
    from scout_core.testing.settings import BUSY_HOST
    from scout_core.testing.trial import FAULT_KINDS, Setup, TrialFault

__all__ = [
    # running ranks
    "run_ranks",
    "RankFailedError",
    "RanksTimeoutError",
    # fault injection
    "Faults",
    "BitFlip",
    "Scale",
    "AddNoise",
    "flip_bit",
    "comm_delay",
    "TrialFault",
    "FAULT_KINDS",
    "Setup",
    # replay's schedule
    "RoundLog",
    "ran_every_due_round",
    "BUSY_HOST",
    # conformance
    "check_adapter",
    "check_plugin",
    "check_checkpoint_io",
    "installed_plugins",
    # tiny models
    "TinyLM",
    "Block",
    "batch",
    "train_step",
    "VOCAB",
    # comparing states
    "signature",
    "signature_many",
    # MoE checks
    "discover_catalog",
    "distinct_verdicts",
    # examples' documented launch commands
    "documented_launches",
    "runnable",
    "check_documented_launch",
]

_MODULES: dict[str, tuple[str, ...]] = {
    "scout_core.testing.harness": ("run_ranks", "RankFailedError", "RanksTimeoutError"),
    "scout_core.testing.injectors": (
        "Faults",
        "BitFlip",
        "Scale",
        "AddNoise",
        "flip_bit",
        "comm_delay",
    ),
    "scout_core.testing.trial": ("TrialFault", "FAULT_KINDS", "Setup"),
    "scout_core.testing.round_log": ("RoundLog", "ran_every_due_round"),
    "scout_core.testing.settings": ("BUSY_HOST",),
    "scout_core.testing.conformance": ("check_adapter", "check_plugin", "installed_plugins"),
    "scout_core.testing.checkpoint_io": ("check_checkpoint_io",),
    "scout_core.testing.models": ("TinyLM", "Block", "batch", "train_step", "VOCAB"),
    "scout_core.decision.signature": ("signature", "signature_many"),
    "scout_core.testing.moe_checks": ("discover_catalog", "distinct_verdicts"),
    "scout_core.testing.launches": (
        "documented_launches",
        "runnable",
        "check_documented_launch",
    ),
}
_HOME = {name: module for module, names in _MODULES.items() for name in names}
"""Where each lazily imported name lives."""


def __getattr__(name: str) -> Any:
    if name in _HOME:
        import importlib

        return getattr(importlib.import_module(_HOME[name]), name)
    raise AttributeError(f"module 'scout_core.testing' has no attribute {name!r}")
