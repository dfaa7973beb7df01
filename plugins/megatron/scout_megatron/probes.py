"""The megatron-core internals the plugin uses, probed at activation.

Contract: :data:`PROBES` lists each name megatron-core does not promise to keep, with its use;
:func:`require` (called before anything is hooked) checks them all and raises one
``UnsupportedSetupError`` naming every missing piece, never an ``AttributeError`` mid-training.
The adapter checks attributes of live objects. Docs: docs/megatron.md (the version table).
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass

from scout_core import UnsupportedSetupError

__all__ = ["PROBES", "Probe", "missing", "require"]


@dataclass(frozen=True)
class Probe:
    """One name the plugin uses: ``module.attribute`` (dotted), taking ``keywords``."""

    module: str
    attribute: str
    keywords: tuple[str, ...] = ()
    use: str = ""
    """What the plugin needs it for (shown when it is missing)."""
    or_else: Probe | None = None
    """The older name the plugin falls back to: either one present passes."""

    @property
    def name(self) -> str:
        return f"{self.module}.{self.attribute}"


_PS = "megatron.core.parallel_state"
_LAYOUT = "the parallel layout"
_GROUPS = "checking Megatron's live groups against the layout"

PROBES: tuple[Probe, ...] = (
    Probe(_PS, "model_parallel_is_initialized", use="the activation check"),
    Probe(_PS, "RankGenerator", use="Megatron's own group lists for the layout"),
    Probe(_PS, "RankGenerator.get_ranks", use="Megatron's own group lists for the layout"),
    Probe(_PS, "get_tensor_model_parallel_world_size", use=_LAYOUT),
    Probe(_PS, "get_pipeline_model_parallel_world_size", use=_LAYOUT),
    Probe(_PS, "get_virtual_pipeline_model_parallel_world_size", use=_LAYOUT),
    Probe(_PS, "get_context_parallel_world_size", use=_LAYOUT),
    Probe(_PS, "get_expert_model_parallel_world_size", use=_LAYOUT),
    Probe(_PS, "get_expert_tensor_parallel_world_size", use=_LAYOUT),
    Probe(
        _PS,
        "get_data_parallel_world_size",
        ("with_context_parallel", "partial_data_parallel"),
        use="the distributed optimizer's instances",
    ),
    Probe(_PS, "get_tensor_model_parallel_group", use=_GROUPS),
    Probe(_PS, "get_pipeline_model_parallel_group", use=_GROUPS),
    Probe(_PS, "get_context_parallel_group", use=_GROUPS),
    Probe(
        _PS,
        "get_data_parallel_group",
        ("with_context_parallel", "partial_data_parallel"),
        use=_GROUPS,
    ),
    Probe(_PS, "get_expert_model_parallel_group", use=_GROUPS),
    Probe(_PS, "get_expert_data_parallel_group", use=_GROUPS),
    Probe(
        "megatron.core.process_groups_config",
        "ProcessGroupCollection.use_mpu_process_groups",
        use="the training groups (reference only)",
    ),
    Probe("megatron.core.tensor_parallel", "get_cuda_rng_tracker", use="the RNG tracker streams"),
    Probe(
        "megatron.core.tensor_parallel.random",
        "is_checkpointing",
        use="telling activation recompute from the forward pass",
    ),
    Probe("megatron.core.utils", "unwrap_model", use="unwrapping model chunks"),
    Probe("megatron.core.transformer.moe.moe_layer", "MoELayer", use="finding routers and experts"),
    Probe(
        "megatron.core.transformer.moe.moe_logging",
        "get_moe_metrics_tracker",
        use="keeping MoE aux losses out of a replay",
        or_else=Probe(
            "megatron.core.transformer.moe.moe_utils", "get_moe_layer_wise_logging_tracker"
        ),
    ),
    Probe("megatron.core.dist_checkpointing", "save", use="gated checkpoints"),
    Probe("megatron.core.dist_checkpointing", "load", use="gated checkpoints"),
    Probe(
        "megatron.core.dist_checkpointing",
        "check_is_distributed_checkpoint",
        use="gated checkpoints",
    ),
)


def _problem(probe: Probe) -> str | None:
    problem = _own_problem(probe)
    if problem is None or probe.or_else is None:
        return problem
    if _problem(probe.or_else) is None:
        return None
    return f"{problem} (nor {probe.or_else.name})"


def _own_problem(probe: Probe) -> str | None:
    try:
        obj: object = importlib.import_module(probe.module)
    except ImportError as exc:
        return f"module {probe.module} ({exc})"
    for part in probe.attribute.split("."):
        if not hasattr(obj, part):
            return probe.name
        obj = getattr(obj, part)
    if probe.keywords:
        try:
            params = inspect.signature(obj).parameters  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return f"{probe.name} (no readable signature)"
        lacking = [k for k in probe.keywords if k not in params]
        if lacking:
            return f"{probe.name}({', '.join(f'{k}=' for k in lacking)})"
    return None


def missing(probes: tuple[Probe, ...] = PROBES) -> list[str]:
    """What of ``probes`` the installed megatron-core lacks, each with its use."""
    out = []
    for probe in probes:
        problem = _problem(probe)
        if problem is not None:
            out.append(f"{problem}, for {probe.use}" if probe.use else problem)
    return out


def require(probes: tuple[Probe, ...] = PROBES) -> None:
    """:class:`~scout_core.UnsupportedSetupError` naming everything of ``probes`` missing."""
    lacking = missing(probes)
    if lacking:
        from scout_megatron.versions import SUPPORTED, installed_version

        try:
            version = installed_version()
        except UnsupportedSetupError:
            version = "(version unknown)"
        raise UnsupportedSetupError(
            f"megatron-core {version} lacks what scout-megatron uses: {'; '.join(lacking)}. "
            f"scout-megatron supports megatron-core{SUPPORTED} (docs/megatron.md lists "
            "what each release was tested with)"
        )
