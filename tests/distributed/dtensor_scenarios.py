"""Rank bodies for ``test_torch_adapter_dtensor``: TorchAdapter on DTensors it must rebuild.

Two ranks, one TP mesh of two (plus a size-1 ``fsdp`` dim, as TorchTitan and FSDP2
leave on every parameter). Each body builds real DTensors with known full values
and reports what the adapter made of them.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn


def _mesh() -> Any:
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (1, 2), mesh_dim_names=("fsdp", "tp"))


class _Block(nn.Module):
    """A linear layer plus a buffer that rides along (a stand-in for a RoPE cache)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 6, bias=False)
        self.register_buffer("scale", torch.full((6,), 2.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.lin(x) * self.scale
        return out


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([_Block(), _Block()])


def _adapter(model: nn.Module) -> Any:
    from scout_core.integration.discovery import discover
    from scout_core.plugin.torch_adapter import TorchAdapter
    from scout_core.topology.groups import create_peer_groups
    from scout_core.topology.mesh import MeshLayout

    layout = MeshLayout.from_order("t", t=2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    adapter = TorchAdapter(model, [opt], discover(model), mesh=layout)
    adapter.bind_groups(create_peer_groups(layout, dist.get_rank(), ["peer", "t"]))
    return adapter


def dtensor_rebuild() -> dict[str, Any]:
    """Parameters, an activation, a gradient, a buffer: each rebuilt to its full value."""
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    mesh = _mesh()
    torch.manual_seed(0)
    model = _Model()
    full_w = model.layers[0].lin.weight.detach().clone()
    block = model.layers[0]
    # Sharded along dim 0 on tp, with a Shard on the size-1 fsdp dim of the same tensor
    # dim (what the old gather refused as nested sharding).
    block.lin.weight = nn.Parameter(distribute_tensor(full_w, mesh, [Shard(0), Shard(0)]))
    block.scale = distribute_tensor(torch.full((6,), 2.0), mesh, [Replicate(), Replicate()])
    adapter = _adapter(model)
    out: dict[str, Any] = {}
    ref = adapter.repeated_layers()[0]
    out["capture_copy_set"] = all(r.capture_copy is not None for r in adapter.repeated_layers())
    with adapter.materialize(ref) as params:
        out["weight_full"] = bool(torch.equal(params["lin.weight"], full_w))
        out["weight_plain"] = type(params["lin.weight"]).__name__
    x = torch.arange(2 * 8 * 4, dtype=torch.float32).reshape(2, 8, 4)
    seq = DTensor.from_local(x.chunk(2, dim=1)[dist.get_rank()], mesh["tp"], [Shard(1)])
    got = adapter.full_tensor(seq)
    out["activation"] = [type(got).__name__, bool(torch.equal(got, x))]
    part = DTensor.from_local(torch.ones(3) * (dist.get_rank() + 1), mesh["tp"], [Partial()])
    out["partial"] = adapter.full_tensor(part).tolist()
    plain = torch.ones(2)
    copy = adapter.full_tensor(plain)
    out["plain_copied"] = bool(torch.equal(copy, plain)) and copy.data_ptr() != plain.data_ptr()
    # call(): params full, the buffer still a DTensor (replay copies buffers off the live
    # module), inputs full; the result is the unsharded function.
    state = {"lin.weight": full_w, "scale": block.scale.clone()}
    result = adapter.call(block, state, (x,), {})
    out["call"] = [type(result).__name__, bool(torch.allclose(result, (x @ full_w.T) * 2.0))]
    adapter.close()
    return out


def dtensor_refused() -> dict[str, Any]:
    """Nested sharding on a dim with more than one rank is refused, naming the tensor."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from scout_core.errors import UnsupportedSetupError

    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    adapter = _adapter(_Model())
    odd = distribute_tensor(torch.ones(4, 4), mesh, [Shard(0)])
    try:
        # a mesh dim SCOUT has no group for: this layout has no context-parallel axis
        renamed = init_device_mesh("cpu", (2,), mesh_dim_names=("cp",))
        adapter.full_tensor(distribute_tensor(torch.ones(4), renamed, [Shard(0)]))
        cp = "gathered"
    except UnsupportedSetupError as exc:
        cp = str(exc)
    adapter.close()
    return {"tp_ok": adapter.full_tensor(odd).shape == (4, 4), "cp": cp}


class _Sharded(nn.Module):
    """Returns a sequence-sharded DTensor, as a TorchTitan block does under SP."""

    def __init__(self, mesh: Any) -> None:
        super().__init__()
        self.mesh = mesh

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.distributed.tensor import DTensor, Shard

        return DTensor.from_local(x * 1.0, self.mesh, [Shard(1)])


def corrupt_dtensor_output() -> dict[str, Any]:
    """A corrupted DTensor output changes only the faulty rank's shard, with no collective."""
    from torch.distributed.device_mesh import init_device_mesh

    from scout_core.testing import BitFlip, Faults

    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    model = nn.Sequential(_Sharded(mesh))
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)
    faults = Faults().at(rank=1, step=0).corrupt_output("0", BitFlip(bit=30)).attach(model, opt)
    x = torch.ones(2, 4) * (dist.get_rank() + 1)
    out = model(x)
    local = out.to_local()
    faults.detach()
    return {"changed": not bool(torch.equal(local, x)), "fired": faults.fired()}
