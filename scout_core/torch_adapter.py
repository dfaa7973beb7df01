"""The plain-PyTorch adapter: DDP, FSDP2 (``fully_shard``), HSDP and DeviceMesh layouts.

Plain PyTorch has no framework object that knows the parallel layout, so the
adapter reads it off the model:

* no DTensor parameters (DDP, or a single replica) → pure data parallel, ``d`` =
  world size;
* DTensor parameters (FSDP2, HSDP, TP) → the parameters' ``DeviceMesh`` (its root
  mesh when the parameter lives on a sub-mesh), each dimension mapped to an axis by
  name (``dp_replicate``/``dp`` → d, ``dp_shard``/``fsdp`` → s, ``tp`` → t ...) or,
  for unnamed dimensions, by placement (``Shard`` → s, ``Replicate`` → d);
* or an explicit ``mesh=`` (a ``DeviceMesh`` or a :class:`~scout_core.mesh.MeshLayout`).

[Materialising FSDP parameters without FSDP]
FSDP2's own unshard runs collectives on the training communicator and writes
module state; replay must do neither. :meth:`TorchAdapter.materialize` therefore
all-gathers each parameter's local shard itself, on SCOUT's diagnostic shard group
(the same ranks as the FSDP shard group, a separate Gloo group), undoes FSDP2's
``torch.chunk`` padding, and yields plain full-tensor *copies*. Tensor-parallel
dimensions stay local: replica peers at the same ``t`` compare their shards.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from scout_core.adapter import ModuleRef, Ownership, RngStream
from scout_core.discovery import Discovered, unwrap
from scout_core.errors import UnsupportedSetupError
from scout_core.mesh import AXIS_ALIASES, Axis, MeshAddress, MeshLayout
from scout_core.replay import taps

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup
    from torch.distributed.device_mesh import DeviceMesh

    from scout_core.groups import PeerGroup

__all__ = ["TorchAdapter", "cpu_rng", "device_rng"]

log = logging.getLogger("scout.torch")


def cpu_rng() -> RngStream:
    """The default CPU generator."""
    return RngStream("cpu", torch.get_rng_state, torch.set_rng_state)


def device_rng() -> RngStream | None:
    """The current CUDA device's generator, when CUDA is available."""
    if not torch.cuda.is_available():
        return None
    return RngStream("cuda", torch.cuda.get_rng_state, torch.cuda.set_rng_state)


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


def _layout_from_params(model: nn.Module) -> MeshLayout | None:
    """The layout the DTensor parameters imply, or None when there are none."""
    meshes: dict[int, Any] = {}
    placements: dict[int, list[Any]] = {}
    for p in model.parameters():
        if _is_dtensor(p):
            mesh = p.device_mesh  # type: ignore[attr-defined]  # DTensor attribute
            root = _root_mesh(mesh)
            meshes[id(root)] = root
            if mesh is root:
                placements.setdefault(id(root), list(p.placements))  # type: ignore[attr-defined]
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


def _is_fsdp_hook(hook: Any) -> bool:
    owner = getattr(hook, "__self__", None)
    where = type(owner).__module__ if owner is not None else getattr(hook, "__module__", "")
    return str(where).startswith("torch.distributed.fsdp")


def _without_fsdp_hooks(module: nn.Module) -> nn.Module:
    """A shallow twin of an FSDP2 module: the user's class, the user's hooks, no FSDP hooks.

    ``fully_shard`` swaps the class for ``FSDP<Name>`` and registers forward hooks that
    unshard over the training communicator. The twin shares submodules and parameter
    dicts with the original (functional_call binds and restores them), but has the
    original class and only the hooks FSDP did not register, so injectors and other
    user hooks still see the replayed call.
    """
    cls = type(module)
    if not cls.__module__.startswith("torch.distributed.fsdp") and not cls.__name__.startswith(
        "FSDP"
    ):
        return module
    base: type[nn.Module] = cls.__bases__[-1]
    twin: nn.Module = object.__new__(base)
    twin.__dict__.update(module.__dict__)
    for attr in ("_forward_pre_hooks", "_forward_hooks"):
        hooks = getattr(module, attr)
        kept = type(hooks)((k, h) for k, h in hooks.items() if not _is_fsdp_hook(h))
        setattr(twin, attr, kept)
    return twin


class TorchAdapter:
    """:class:`~scout_core.adapter.FrameworkAdapter` for plain PyTorch models."""

    name = "torch"

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
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
        self.optimizer = optimizer
        self.found = found
        self._rank = dist.get_rank()
        self._layout = self._derive_layout(mesh)
        self._steps = 0
        self._shard_group: PeerGroup | None = None
        self._handle = optimizer.register_step_post_hook(self._count)
        streams = [cpu_rng()]
        dev = device_rng()
        if dev is not None:
            streams.append(dev)
        self._rng = tuple(streams)

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

    def _count(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._steps += 1

    def close(self) -> None:
        self._handle.remove()

    def bind_groups(self, groups: Mapping[str, PeerGroup]) -> None:
        """FSDP parameters are gathered on SCOUT's diagnostic shard group.

        Under pure FSDP the peer group is the shard group itself.
        """
        if self._layout.size(Axis.S) > 1:
            self._shard_group = groups.get("shard", groups.get("peer"))

    # -- FrameworkAdapter ---------------------------------------------------------------

    def layout(self) -> MeshLayout:
        return self._layout

    def rank(self) -> int:
        return self._rank

    def address(self) -> MeshAddress:
        return self._layout.address(self._rank)

    def training_groups(self) -> Mapping[str, ProcessGroup]:
        groups: dict[str, ProcessGroup] = {}
        for p in self.root.parameters():
            if _is_dtensor(p):
                root = _root_mesh(p.device_mesh)  # type: ignore[attr-defined]  # DTensor
                for i, name in enumerate(root.mesh_dim_names or ()):
                    groups[name] = root.get_group(i)
                break
        return groups

    def repeated_layers(self) -> Sequence[ModuleRef]:
        return self.found.layers

    def special_modules(self) -> Mapping[str, ModuleRef]:
        out: dict[str, ModuleRef] = {}
        if self.found.embedding is not None:
            out["embedding"] = self.found.embedding
        if self.found.lm_head is not None:
            out["lm_head"] = self.found.lm_head
        return out

    def optimizers(self) -> Sequence[torch.optim.Optimizer]:
        return (self.optimizer,)

    def optimizer_ownership(self) -> Ownership:
        if self._layout.size(Axis.S) == 1:
            return Ownership.REPLICATED
        return Ownership.SHARDED if self._layout.size(Axis.D) > 1 else Ownership.UNIQUE

    def rng_streams(self) -> Sequence[RngStream]:
        return self._rng

    def step(self) -> int:
        return self._steps

    @contextmanager
    def materialize(self, ref: ModuleRef) -> Iterator[dict[str, torch.Tensor]]:
        """Full-tensor copies of ``ref.module``'s parameters, gathered off the training path."""
        out: dict[str, torch.Tensor] = {}
        for name, p in ref.module.named_parameters():
            out[name] = self._full_copy(name, p)
        yield out

    def local_shards(self, ref: ModuleRef) -> list[torch.Tensor]:
        """This rank's local parameter shards of ``ref`` (equal across replica peers)."""
        return [
            p.to_local().detach() if _is_dtensor(p) else p.detach()  # type: ignore[attr-defined]
            for _, p in sorted(ref.module.named_parameters())
        ]

    def call(
        self,
        module: nn.Module,
        state: Mapping[str, torch.Tensor],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """Run ``module`` on ``state`` without FSDP's hooks (they talk on the training group)."""
        return torch.func.functional_call(_without_fsdp_hooks(module), dict(state), args, kwargs)

    # -- gathering ----------------------------------------------------------------------

    def _full_copy(self, name: str, p: torch.Tensor) -> torch.Tensor:
        if not _is_dtensor(p):
            return p.detach().clone()
        local: torch.Tensor = p.to_local().detach()  # type: ignore[attr-defined]  # DTensor method
        mesh = p.device_mesh  # type: ignore[attr-defined]  # DTensor attribute
        names = mesh.mesh_dim_names or tuple(f"dim{i}" for i in range(mesh.ndim))
        shard_dims = [
            (i, pl.dim)
            for i, pl in enumerate(p.placements)  # type: ignore[attr-defined]  # DTensor
            if pl.is_shard() and self._is_fsdp_dim(names[i], mesh)
        ]
        if not shard_dims:
            return local.clone()  # TP shard or replicated: compare the local shard
        if len(shard_dims) > 1:
            raise UnsupportedSetupError(f"parameter {name!r} is FSDP-sharded on several mesh dims")
        (_, dim) = shard_dims[0]
        return self._gather(local, dim, int(p.shape[dim]))

    def _is_fsdp_dim(self, name: str, mesh: DeviceMesh) -> bool:
        axis = AXIS_ALIASES.get(name.lower())
        if axis is Axis.S:
            return True
        # A 1-D FSDP mesh may be unnamed or named "dp": its shards are FSDP shards.
        return mesh.ndim == 1 and axis in (None, Axis.D) and self._layout.size(Axis.S) > 1

    def _gather(self, local: torch.Tensor, dim: int, full: int) -> torch.Tensor:
        group = self._shard_group
        if group is None:
            raise UnsupportedSetupError("FSDP parameters need SCOUT's diagnostic shard group")
        n = len(group.ranks)
        # FSDP2 shards like torch.chunk: ceil-sized pieces, the last ones short or empty.
        rows = [c.shape[0] for c in torch.empty(full, device="meta").chunk(n)]
        rows += [0] * (n - len(rows))
        width = max(rows) if rows else 0
        moved = local.movedim(dim, 0).cpu()
        pad = torch.zeros((width, *moved.shape[1:]), dtype=moved.dtype)
        pad[: moved.shape[0]] = moved
        recv = torch.empty((n * width, *moved.shape[1:]), dtype=moved.dtype)
        delay = taps.comm_delay_s("shard") if taps._delays else 0.0
        if delay:
            time.sleep(delay)
        dist.all_gather_into_tensor(recv, pad.contiguous(), group=group.pg)
        by_coord = sorted(range(n), key=lambda j: self._layout.address(group.ranks[j]).get(Axis.S))
        pieces = [recv[j * width : j * width + rows[k]] for k, j in enumerate(by_coord)]
        return torch.cat(pieces, 0).movedim(0, dim).to(local.device)
