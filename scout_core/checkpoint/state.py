"""One rank's training state as a tree: captured, flattened for storage, restored.

Contract: this is the one place that walks the tree a bitwise resume needs (model and
optimizer state dicts, every RNG stream the adapter names, the caller's state), so every
store agrees on its shape. A DTensor is kept as its local :class:`HostShard` and restores
only onto the same layout (else :class:`~scout_core.errors.CheckpointError`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from scout_core.errors import CheckpointError
from scout_core.integration.adapter import RngStream
from scout_core.topology.shards import local_shard

__all__ = [
    "HostShard",
    "capture_tree",
    "check_tree",
    "dtype_name",
    "restore_tree",
]

Copy = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True, slots=True)
class HostShard:
    """A DTensor's local shard in host memory, with the global shape and stride."""

    local: torch.Tensor
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    placements: str
    """``repr`` of the placements, checked against the live layout on restore."""


def dtype_name(dtype: torch.dtype) -> str:
    """``float32`` for ``torch.float32``: a dtype as stored in a skeleton."""
    return str(dtype).removeprefix("torch.")


def _copy_leaf(t: torch.Tensor, copy: Copy) -> torch.Tensor | HostShard:
    if isinstance(t, DTensor):
        return HostShard(
            local=copy(t.to_local().detach()),
            shape=tuple(t.shape),
            stride=tuple(t.stride()),
            placements=repr(tuple(t.placements)),
        )
    return copy(t.detach() if t.requires_grad else t)


def _copy_tree(value: Any, copy: Copy) -> Any:
    if isinstance(value, torch.Tensor):
        return _copy_leaf(value, copy)
    # (A state dict is made of plain dicts: ``type`` skips the ABC check per node.)
    if type(value) is dict or isinstance(value, Mapping):
        return {k: _copy_tree(v, copy) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy_tree(v, copy) for v in value]
    if isinstance(value, tuple):
        return tuple(_copy_tree(v, copy) for v in value)
    return value


def _address(t: torch.Tensor) -> int:
    """Where ``t``'s (local) data lives; 0 when it has none."""
    try:
        return int(local_shard(t).data_ptr())
    except RuntimeError:  # a tensor without storage
        return 0


def _model_tree(model: torch.nn.Module, copy: Copy, later: Copy | None) -> dict[str, Any]:
    """The model's state dict copied; parameters through ``later`` when given, except one
    sharing a buffer's storage (buffers change in the forward and go through ``copy``)."""
    if later is None:
        return _copy_tree(model.state_dict(), copy)  # type: ignore[no-any-return]  # a dict in, a dict out
    # (Parameter's isinstance goes through a metaclass hook: asked once per entry.)
    live = [
        (k, v, isinstance(v, torch.nn.Parameter))
        for k, v in model.state_dict(keep_vars=True).items()
    ]
    buffers = {_address(v) for _, v, param in live if not param and isinstance(v, torch.Tensor)}
    buffers.discard(0)
    out: dict[str, Any] = {}
    for k, v, param in live:
        if param and not (buffers and _address(v) in buffers):
            # A plain parameter (most entries) skips _copy_leaf's DTensor check.
            out[k] = later(v.detach()) if type(v) is torch.nn.Parameter else _copy_leaf(v, later)
        else:
            out[k] = _copy_tree(v, copy)
    return out


def _optim_tree(opt: torch.optim.Optimizer, copy: Copy, later: Copy | None) -> Any:
    """An optimizer's state dict copied; per-parameter state through ``later`` if given."""
    sd = opt.state_dict()
    if later is None:
        return _copy_tree(sd, copy)
    return {
        k: _copy_state(v, later) if k == "state" else _copy_tree(v, copy) for k, v in sd.items()
    }


def _copy_state(state: Any, later: Copy) -> Any:
    """An optimizer's per-parameter state through ``later``, the capture's hot loop: a plain
    tensor slot skips the generic walk (with the parameter shortcut, a tenth less blocking)."""
    if type(state) is not dict:
        return _copy_tree(state, later)
    out: dict[Any, Any] = {}
    for index, slots in state.items():
        if type(slots) is not dict:
            out[index] = _copy_tree(slots, later)
            continue
        out[index] = {
            k: later(v) if type(v) is torch.Tensor and not v.requires_grad else _copy_tree(v, later)
            for k, v in slots.items()
        }
    return out


def capture_tree(
    model: torch.nn.Module,
    optimizers: Sequence[torch.optim.Optimizer],
    rng_streams: Sequence[RngStream],
    extra: Mapping[str, Any] | None,
    copy: Copy,
    *,
    later: Copy | None = None,
) -> dict[str, Any]:
    """Copy the live training state into a tree whose tensors ``copy`` produced; ``later``, if
    given, copies what only an optimizer step writes while training goes on (:mod:`.memory`)."""
    extra_tree = {}
    if extra is not None:
        # The caller reuses its tensors at once: clone device ones so ``copy`` may be lazy.
        extra_tree = {
            str(k): _copy_tree(
                v.detach().clone() if isinstance(v, torch.Tensor) and v.device.type != "cpu" else v,
                copy,
            )
            for k, v in extra.items()
        }
    return {
        "model": _model_tree(model, copy, later),
        "optim": [_optim_tree(o, copy, later) for o in optimizers],
        "rng": {s.name: copy(s.get()) for s in rng_streams},
        "extra": extra_tree,
    }


# -- restore ---------------------------------------------------------------------------


def _check_shard(path: str, leaf: HostShard, live: torch.Tensor) -> DTensor:
    if not isinstance(live, DTensor):
        raise CheckpointError(
            f"{path}: checkpoint holds a shard but the live tensor is not sharded"
        )
    if tuple(live.shape) != leaf.shape or repr(tuple(live.placements)) != leaf.placements:
        raise CheckpointError(
            f"{path}: layout changed (checkpoint {leaf.shape} {leaf.placements}, live "
            f"{tuple(live.shape)} {tuple(live.placements)!r}); gate checkpoints restore "
            "onto the layout they were taken on"
        )
    if tuple(live.to_local().shape) != tuple(leaf.local.shape):
        raise CheckpointError(f"{path}: local shard shape differs from the checkpoint")
    return live


def _restore_model(model: torch.nn.Module, tree: Mapping[str, Any]) -> None:
    live = model.state_dict()  # checked by check_tree
    with torch.no_grad():
        for key, leaf in tree.items():
            target = live[key]
            if isinstance(leaf, HostShard):
                _check_shard(f"model/{key}", leaf, target).to_local().copy_(leaf.local)
            else:
                target.copy_(leaf)


def _optimizer_params(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    # state_dict() numbers parameters in param_groups order; this is that order.
    return [p for group in opt.param_groups for p in group["params"]]


def _rebuild_optim(path: str, value: Any, param: torch.Tensor | None) -> Any:
    if isinstance(value, HostShard):
        if param is None or tuple(param.shape) != value.shape:
            raise CheckpointError(f"{path}: sharded optimizer state does not match its parameter")
        live = _check_shard(path, value, param)
        local = value.local.clone().to(live.to_local().device)
        return DTensor.from_local(
            local,
            live.device_mesh,
            live.placements,
            run_check=False,
            shape=torch.Size(value.shape),
            stride=value.stride,
        )
    if isinstance(value, torch.Tensor):
        # A fresh clone: load_state_dict may keep it, and the checkpoint must stay intact.
        return value.clone()
    if isinstance(value, Mapping):
        return {k: _rebuild_optim(f"{path}/{k}", v, param) for k, v in value.items()}
    if isinstance(value, list):
        return [_rebuild_optim(f"{path}/{i}", v, param) for i, v in enumerate(value)]
    if isinstance(value, tuple):
        return tuple(_rebuild_optim(f"{path}/{i}", v, param) for i, v in enumerate(value))
    return value


def _restore_optimizer(index: int, opt: torch.optim.Optimizer, tree: Mapping[str, Any]) -> None:
    params = _optimizer_params(opt)
    state = {}
    for pid, per_param in tree.get("state", {}).items():
        param = params[int(pid)] if 0 <= int(pid) < len(params) else None
        state[pid] = _rebuild_optim(f"optim/{index}/state/{pid}", per_param, param)
    groups = _rebuild_optim(f"optim/{index}/param_groups", tree.get("param_groups", []), None)
    try:
        opt.load_state_dict({"state": state, "param_groups": groups})
    except (ValueError, KeyError) as exc:
        raise CheckpointError(f"optimizer {index} does not match the checkpoint: {exc}") from exc


def _restore_extra(
    tree: Mapping[str, Any], target: MutableMapping[str, Any] | None
) -> dict[str, Any]:
    restored = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in tree.items()}
    if target is not None:
        for key, value in restored.items():
            live = target.get(key)
            if (
                isinstance(live, torch.Tensor)
                and isinstance(value, torch.Tensor)
                and live.shape == value.shape
                and live.dtype == value.dtype
            ):
                with torch.no_grad():
                    live.copy_(value)  # keep the caller's tensor object (and device)
            else:
                target[key] = value
    return restored


def _check_model(model: torch.nn.Module, tree: object) -> None:
    live = model.state_dict()
    if not isinstance(tree, Mapping) or set(live) != set(tree):
        found = set(tree) if isinstance(tree, Mapping) else set()
        missing, unexpected = sorted(set(live) - found), sorted(found - set(live), key=str)
        raise CheckpointError(
            f"model state does not match the checkpoint (missing {missing[:5]}, "
            f"unexpected {unexpected[:5]})"
        )
    for key, leaf in tree.items():
        target = live[key]
        if isinstance(leaf, HostShard):
            _check_shard(f"model/{key}", leaf, target)
        elif not isinstance(leaf, torch.Tensor):
            raise CheckpointError(f"model/{key}: the checkpoint holds no tensor there")
        elif target.shape != leaf.shape or target.dtype != leaf.dtype:
            raise CheckpointError(f"model/{key}: shape or dtype differs from the checkpoint")


def _check_optimizer(index: int, opt: torch.optim.Optimizer, tree: object) -> None:
    where = f"optim/{index}"
    if not isinstance(tree, Mapping):
        raise CheckpointError(f"{where}: the checkpoint holds no optimizer state there")
    params = _optimizer_params(opt)
    state, groups = tree.get("state", {}), tree.get("param_groups", [])
    if not isinstance(state, Mapping) or not isinstance(groups, list | tuple):
        raise CheckpointError(f"{where}: malformed optimizer state")
    for pid, per_param in state.items():
        if isinstance(pid, bool) or not isinstance(pid, int) or not 0 <= pid < len(params):
            raise CheckpointError(f"{where}: state for parameter {pid!r:.40}, which it lacks")
        if not isinstance(per_param, Mapping):
            raise CheckpointError(f"{where}/state/{pid}: malformed")
        for key, value in per_param.items():
            if isinstance(value, HostShard):
                if tuple(params[pid].shape) != value.shape:
                    raise CheckpointError(
                        f"{where}/state/{pid}/{key}: does not match its parameter"
                    )
                _check_shard(f"{where}/state/{pid}/{key}", value, params[pid])
    if len(groups) != len(opt.param_groups):
        raise CheckpointError(
            f"{where}: {len(groups)} parameter group(s) in the checkpoint, "
            f"{len(opt.param_groups)} live"
        )
    for i, (group, live) in enumerate(zip(groups, opt.param_groups, strict=True)):
        held = group.get("params") if isinstance(group, Mapping) else None
        if not isinstance(held, list | tuple) or len(held) != len(live["params"]):
            raise CheckpointError(f"{where}/param_groups/{i}: another number of parameters")


def check_tree(
    tree: object,
    model: torch.nn.Module,
    optimizers: Sequence[torch.optim.Optimizer],
    rng_streams: Sequence[RngStream],
) -> None:
    """Everything :func:`restore_tree` would refuse, checked without changing anything, so
    the ranks can agree before any applies (:mod:`.recovery`) and none is left half restored."""
    if not isinstance(tree, Mapping):
        raise CheckpointError("the checkpoint holds no state tree")
    optims = tree.get("optim", [])
    if not isinstance(optims, list | tuple) or len(optims) != len(optimizers):
        count = len(optims) if isinstance(optims, list | tuple) else "no"
        raise CheckpointError(
            f"checkpoint holds {count} optimizer(s), the job has {len(optimizers)}"
        )
    rng = tree.get("rng", {})
    if not isinstance(rng, Mapping):
        raise CheckpointError("checkpoint RNG states are malformed")
    names = [s.name for s in rng_streams]
    absent = sorted(set(names) - set(rng))
    if absent:
        raise CheckpointError(
            f"checkpoint lacks RNG stream(s) {absent}; it holds {sorted(rng, key=str)}"
        )
    for name in names:
        state = rng[name]
        if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8:
            raise CheckpointError(f"checkpoint RNG state {name!r} is not a byte tensor")
    _check_model(model, tree.get("model", {}))
    for i, (opt, sub) in enumerate(zip(optimizers, optims, strict=True)):
        _check_optimizer(i, opt, sub)
    if not isinstance(tree.get("extra", {}), Mapping):
        raise CheckpointError("checkpoint caller state is malformed")


def restore_tree(
    tree: Mapping[str, Any],
    model: torch.nn.Module,
    optimizers: Sequence[torch.optim.Optimizer],
    rng_streams: Sequence[RngStream],
    extra: MutableMapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Write ``tree`` back into the live objects, checked first; return the caller state.
    Tensors are copied in place (parameters keep their identity, so the optimizers still hold
    them); the tree is never aliased, so it can be restored again."""
    check_tree(tree, model, optimizers, rng_streams)
    optims = tree.get("optim", [])
    rng = tree.get("rng", {})
    _restore_model(model, tree.get("model", {}))
    for i, (opt, sub) in enumerate(zip(optimizers, optims, strict=True)):
        _restore_optimizer(i, opt, sub)
    for stream in rng_streams:
        stream.set(rng[stream.name].clone())
    return _restore_extra(tree.get("extra", {}), extra)
