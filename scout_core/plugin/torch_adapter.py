"""The plain-PyTorch adapter: DDP, FSDP2 (``fully_shard``), HSDP and DeviceMesh layouts.

Contract: :class:`TorchAdapter` reads the layout off the model (pure DP, the DTensor
parameters' ``DeviceMesh``, or ``mesh=``), and replay never talks on a training group:
shards are gathered on SCOUT's own groups and ``call`` runs a hook-free ``twin``, which a
plugin overrides to undo more. Docs: docs/plugins.md, "The adapter".
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from scout_core.decision.agreement import all_gather_single
from scout_core.errors import UnsupportedSetupError
from scout_core.integration.adapter import ModuleRef, Ownership
from scout_core.integration.adapter_base import AdapterBase, cpu_rng, device_rng
from scout_core.integration.discovery import Discovered, unwrap
from scout_core.replay import taps
from scout_core.topology.mesh import AXIS_ALIASES, Axis, MeshLayout

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup
    from torch.distributed.device_mesh import DeviceMesh

    from scout_core.topology.groups import PeerGroup

__all__ = ["TorchAdapter", "cpu_rng", "device_rng", "param_items"]

log = logging.getLogger(__name__)


def _dtensor_cls() -> type | None:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch built without distributed
        return None
    return DTensor


def _is_dtensor(t: object) -> bool:
    cls = _dtensor_cls()
    return cls is not None and isinstance(t, cls)


def _root_mesh(mesh: DeviceMesh) -> DeviceMesh:
    # A TP sub-mesh (mesh["tp"]) knows its parent; the layout must cover every rank.
    getter = getattr(mesh, "_get_root_mesh", None)
    root = getter() if callable(getter) else None
    return root if root is not None else mesh


def param_items(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Every parameter of ``module`` by dotted name, sorted: registered ones (plain, DTensor,
    DDP+TP shards with ``_st_info``) and DTensor attributes DDP's TP transform left unregistered.
    """
    out: dict[str, torch.Tensor] = {}
    for prefix, mod in module.named_modules():
        dot = f"{prefix}." if prefix else ""
        for name, p in mod._parameters.items():
            if p is not None:
                out[dot + name] = p
        for name, value in vars(mod).items():
            if not name.startswith("_") and _is_dtensor(value):
                out.setdefault(dot + name, value)
    return sorted(out.items())


def _spec(p: torch.Tensor) -> tuple[torch.Tensor, Any, tuple[Any, ...], torch.Size] | None:
    """(local tensor, mesh, placements, global shape) of a sharded parameter, else None."""
    if _is_dtensor(p):
        return (
            p.to_local(),  # type: ignore[attr-defined]  # DTensor method
            p.device_mesh,  # type: ignore[attr-defined]  # DTensor attribute
            tuple(p.placements),  # type: ignore[attr-defined]  # DTensor attribute
            p.shape,
        )
    info = getattr(p, "_st_info", None)
    if info is not None:  # DDP's TP transform: the local shard and its DTensorSpec
        return p, info.mesh, tuple(info.placements), torch.Size(info.shape)
    return None


def _layout_from_params(model: nn.Module) -> MeshLayout | None:
    """The layout the DTensor parameters imply, or None when there are none."""
    meshes: dict[int, Any] = {}
    placements: dict[int, list[Any]] = {}
    for _, p in param_items(model):
        spec = _spec(p)
        if spec is None:
            continue
        mesh = spec[1]
        root = _root_mesh(mesh)
        meshes[id(root)] = root
        if mesh is root:
            placements.setdefault(id(root), list(spec[2]))
    if not meshes:
        return None
    # The largest mesh wins: FSDP on the root, TP on a sub-mesh of the same root.
    root = max(meshes.values(), key=lambda m: m.mesh.numel())
    names = root.mesh_dim_names
    place = placements.get(id(root), [])
    axes: dict[str, Axis] = {}
    dims = []
    for i in range(root.mesh.dim()):
        name = names[i] if names is not None else f"dim{i}"
        dims.append(name)
        shard = i < len(place) and place[i].is_shard()
        known = AXIS_ALIASES.get(name.lower())
        if known is None or (known is Axis.D and shard and root.mesh.dim() == 1):
            # An unnamed dimension, or a 1-D FSDP mesh named "dp": placements decide.
            axes[name] = Axis.S if shard else Axis.D
    return MeshLayout.from_grid(root.mesh, dims, axes or None)


def _is_framework_hook(hook: Any) -> bool:
    """A hook torch.distributed registered (FSDP2 unshard, TP input/output redistribution)."""
    owner = getattr(hook, "__self__", None)
    where = type(owner).__module__ if owner is not None else getattr(hook, "__module__", "")
    return str(where).startswith("torch.distributed.")


def _user_class(module: nn.Module) -> type[nn.Module]:
    """The user's class: FSDP2 swaps in a generated ``FSDP<Name>`` subclass."""
    cls = type(module)
    if cls.__module__.startswith("torch.distributed.fsdp") or cls.__name__.startswith("FSDP"):
        base: type[nn.Module] = cls.__bases__[-1]
        return base
    return cls


def hook_free_twin(module: nn.Module) -> nn.Module:
    """A twin of ``module`` without torch.distributed's hooks (they talk on training groups).

    It keeps the user's classes and hooks (injectors, SCOUT's capture) and owns copies of the
    parameter, buffer and submodule dicts, so ``functional_call`` leaves the live module alone.
    """
    twin: nn.Module = object.__new__(_user_class(module))
    twin.__dict__.update(module.__dict__)
    twin.__dict__["_parameters"] = dict(module._parameters)
    twin.__dict__["_buffers"] = dict(module._buffers)
    twin.__dict__["_modules"] = {
        k: (hook_free_twin(m) if m is not None else None) for k, m in module._modules.items()
    }
    for attr in ("_forward_pre_hooks", "_forward_hooks"):
        hooks = getattr(module, attr)
        kept = type(hooks)((k, h) for k, h in hooks.items() if not _is_framework_hook(h))
        twin.__dict__[attr] = kept
    return twin


def _with_capture_copy(
    found: Discovered, copy: Callable[[torch.Tensor], torch.Tensor]
) -> Discovered:
    """``found`` with ``copy`` as the ``capture_copy`` of every ref that has none."""

    def fill(ref: ModuleRef | None) -> ModuleRef | None:
        if ref is None or ref.capture_copy is not None:
            return ref
        return dataclasses.replace(ref, capture_copy=copy)

    def fill_all(refs: tuple[ModuleRef, ...]) -> tuple[ModuleRef, ...]:
        return tuple(r for r in (fill(ref) for ref in refs) if r is not None)

    return Discovered(
        layers=fill_all(found.layers),
        embedding=fill(found.embedding),
        lm_head=fill(found.lm_head),
        routers=fill_all(found.routers),
        experts=fill_all(found.experts),
    )


class TorchAdapter(AdapterBase):
    """:class:`~scout_core.integration.adapter.FrameworkAdapter` for plain PyTorch models."""

    name = "torch"

    def __init__(
        self,
        model: nn.Module,
        optimizers: Sequence[torch.optim.Optimizer],
        found: Discovered,
        *,
        mesh: DeviceMesh | MeshLayout | None = None,
    ) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise UnsupportedSetupError(
                "scout.enable needs torch.distributed initialised (init_process_group) first"
            )
        self.model = model
        self.root = unwrap(model)
        super().__init__(
            rank=dist.get_rank(),
            layout=self._derive_layout(mesh),
            found=found,
            optimizers=optimizers,
        )
        self.found = _with_capture_copy(self.found, self.full_tensor)
        self._shard_group: PeerGroup | None = None
        self._tp_group: PeerGroup | None = None

    def _derive_layout(self, mesh: DeviceMesh | MeshLayout | None) -> MeshLayout:
        world = dist.get_world_size()
        if isinstance(mesh, MeshLayout):
            layout = mesh
        elif mesh is not None:
            layout = MeshLayout.from_device_mesh(_root_mesh(mesh))
        else:
            layout = _layout_from_params(self.root) or MeshLayout.from_order("d", d=world)
        if layout.world_size != world:
            raise UnsupportedSetupError(
                f"the parallel layout covers {layout.world_size} ranks but the job has {world}; "
                "pass mesh= with the job's full DeviceMesh"
            )
        return layout

    def bind_groups(self, groups: Mapping[str, PeerGroup]) -> None:
        """Keep SCOUT's shard group (FSDP; under pure FSDP the peer group) and ``"t"`` group."""
        if self._layout.size(Axis.S) > 1:
            self._shard_group = groups.get("shard", groups.get("peer"))
        if self._layout.size(Axis.T) > 1:
            self._tp_group = groups.get("t")

    # -- FrameworkAdapter ---------------------------------------------------------------

    def training_groups(self) -> Mapping[str, ProcessGroup]:
        groups: dict[str, ProcessGroup] = {}
        for _, p in param_items(self.root):
            spec = _spec(p)
            if spec is not None:
                root = _root_mesh(spec[1])
                for i, name in enumerate(root.mesh_dim_names or ()):
                    groups[name] = root.get_group(i)
                break
        return groups

    def optimizer_ownership(self) -> Ownership:
        if self._layout.size(Axis.S) == 1:
            return Ownership.REPLICATED
        return Ownership.SHARDED if self._layout.size(Axis.D) > 1 else Ownership.UNIQUE

    @contextmanager
    def materialize(self, ref: ModuleRef) -> Iterator[dict[str, torch.Tensor]]:
        """Full copies of ``ref.module``'s parameters, keeping ``requires_grad`` (replay
        differentiates what training does)."""
        out: dict[str, torch.Tensor] = {}
        for name, p in param_items(ref.module):
            out[name] = self._full_copy(f"parameter {name!r}", p).requires_grad_(
                p.requires_grad and p.is_floating_point()
            )
        yield out

    def local_shards(self, ref: ModuleRef) -> list[torch.Tensor]:
        """This rank's local parameter shards of ``ref`` (equal across replica peers)."""
        out: list[torch.Tensor] = []
        for _, p in param_items(ref.module):
            spec = _spec(p)
            out.append((p if spec is None else spec[0]).detach())
        return out

    def twin(self, module: nn.Module) -> nn.Module:
        """The module replay calls: :func:`hook_free_twin` (plugins may undo more on it)."""
        return hook_free_twin(module)

    def call(
        self,
        module: nn.Module,
        state: Mapping[str, torch.Tensor],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """Run ``module`` on ``state`` as a hook-free twin; DTensor entries (buffers copied off
        the live module) are gathered to full tensors first."""
        plain = {k: self.full_tensor(v) if _is_dtensor(v) else v for k, v in state.items()}
        return torch.func.functional_call(self.twin(module), plain, args, kwargs)

    def full_tensor(self, t: torch.Tensor) -> torch.Tensor:
        """A plain, full, detached copy of ``t``; a DTensor is gathered (or reduced) on SCOUT's
        groups: collective over its sharded mesh dims. :class:`UnsupportedSetupError` for a
        layout it cannot rebuild (nested sharding, a mesh dim without a SCOUT group)."""
        if not _is_dtensor(t):
            return t.detach().clone()
        return self._full_copy(f"a {type(t).__name__} of shape {tuple(t.shape)}", t)

    # -- gathering ----------------------------------------------------------------------

    def _full_copy(self, name: str, p: torch.Tensor) -> torch.Tensor:
        spec = _spec(p)
        if spec is None:
            return p.detach().clone()
        local, mesh, placements, shape = spec
        names = mesh.mesh_dim_names or tuple(f"dim{i}" for i in range(mesh.ndim))
        full = local.detach()
        dims_seen: set[int] = set()
        changed = False
        for i, pl in enumerate(placements):
            if mesh.size(i) == 1 or pl.is_replicate():
                continue  # one rank along this dim, or a full copy on each: nothing to do
            group = self._group_for(names[i], mesh)
            if pl.is_partial():
                full = self._reduce(full, str(getattr(pl, "reduce_op", "sum")), group, name)
                changed = True
                continue
            dim = int(pl.dim) % max(1, len(shape))
            if dim in dims_seen or type(pl).__name__ != "Shard":
                # Two mesh dims sharding one tensor dim (FSDP2's _StridedShard over TP)
                raise UnsupportedSetupError(f"{name}: nested sharding {placements} is not replayed")
            dims_seen.add(dim)
            full = self._gather(full, dim, int(shape[dim]), group)
            changed = True
        return full if changed else full.clone()

    @staticmethod
    def _reduce(local: torch.Tensor, op: str, group: PeerGroup, name: str) -> torch.Tensor:
        """The value of a ``Partial`` DTensor: its pending reduction, on SCOUT's group."""
        if op not in ("sum", "avg"):
            raise UnsupportedSetupError(f"{name}: a Partial({op}) DTensor is not replayed")
        out = local.detach().cpu().clone()
        dist.all_reduce(out, group=group.pg)
        if op == "avg":
            out /= len(group.ranks)
        return out.to(local.device)

    def _group_for(self, name: str, mesh: DeviceMesh) -> PeerGroup:
        """SCOUT's diagnostic group for a sharded mesh dimension; raises if it has none."""
        axis = AXIS_ALIASES.get(name.lower())
        fsdp = axis is Axis.S or (
            # A 1-D FSDP mesh may be unnamed or named "dp": its shards are FSDP shards.
            mesh.ndim == 1 and axis in (None, Axis.D) and self._layout.size(Axis.S) > 1
        )
        if fsdp:
            if self._shard_group is None:
                raise UnsupportedSetupError("FSDP parameters need SCOUT's diagnostic shard group")
            return self._shard_group
        if axis is Axis.T:
            if self._tp_group is None:
                raise UnsupportedSetupError("TP parameters need SCOUT's diagnostic TP group")
            return self._tp_group
        raise UnsupportedSetupError(f"parameters sharded on mesh dim {name!r} are not replayed")

    def _gather(self, local: torch.Tensor, dim: int, full: int, group: PeerGroup) -> torch.Tensor:
        n = len(group.ranks)
        axis = Axis.S if group is self._shard_group else Axis.T
        # FSDP2 and DTensor shard like torch.chunk: ceil-sized pieces, the last short or empty.
        rows = [c.shape[0] for c in torch.empty(full, device="meta").chunk(n)]
        rows += [0] * (n - len(rows))
        width = max(rows) if rows else 0
        # A device payload group (NCCL) gathers on the device; Gloo through host memory.
        on_device = group.payload_pg is not None and local.device.type == "cuda"
        where = local.device if on_device else torch.device("cpu")
        moved = local.movedim(dim, 0).to(where)
        pad = torch.zeros((width, *moved.shape[1:]), dtype=moved.dtype, device=where)
        pad[: moved.shape[0]] = moved
        recv = torch.empty((n * width, *moved.shape[1:]), dtype=moved.dtype, device=where)
        taps.sleep_injected("shard" if axis is Axis.S else "tp")
        pg = group.payload_pg if on_device else group.pg
        all_gather_single()(recv, pad.contiguous(), group=pg)
        by_coord = sorted(range(n), key=lambda j: self._layout.address(group.ranks[j]).get(axis))
        pieces = [recv[j * width : j * width + rows[k]] for k, j in enumerate(by_coord)]
        return torch.cat(pieces, 0).movedim(0, dim).to(local.device)
