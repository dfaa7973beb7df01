"""Find the modules replay samples: the repeated layers, the embedding and the LM head.

Contract: :func:`discover` attaches to a model it has never seen (each ``find_*`` says what it looks
for, through checkpoint and ``torch.compile`` wrappers); ``Config.layers`` / ``.embedding`` /
``.lm_head`` name the modules instead (checked at ``enable``), relative to the unwrapped model.
docs/plugins.md, "The adapter".
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from scout_core.errors import ConfigError
from scout_core.integration.adapter import ModuleRef

__all__ = [
    "Discovered",
    "candidate_lists",
    "discover",
    "find_embedding",
    "find_layers",
    "find_lm_head",
    "find_moe",
    "look_through",
    "unwrap",
]

WRAPPED = ("_checkpoint_wrapped_module", "_orig_mod")
"""Where torch's checkpoint wrapper and ``torch.compile``'s ``OptimizedModule`` keep the module."""


@dataclass(frozen=True)
class Discovered:
    """What discovery found in one model; each tuple is in model order."""

    layers: tuple[ModuleRef, ...]
    """The repeated blocks; paths like ``layers.3``."""
    embedding: ModuleRef | None
    lm_head: ModuleRef | None
    routers: tuple[ModuleRef, ...] = ()
    experts: tuple[ModuleRef, ...] = ()
    """The containers of each MoE layer's local experts."""

    def special(self) -> dict[str, ModuleRef]:
        """The adapter protocol's ``special_modules()``."""
        found = {"embedding": self.embedding, "lm_head": self.lm_head}
        out = {role: ref for role, ref in found.items() if ref is not None}
        out.update({f"router:{i}": ref for i, ref in enumerate(self.routers)})
        out.update({f"experts:{i}": ref for i, ref in enumerate(self.experts)})
        return out


def unwrap(model: nn.Module) -> nn.Module:
    """The user's model inside DDP-style wrappers (those exposing ``.module``)."""
    seen = 0
    while isinstance(model, nn.parallel.DistributedDataParallel) or (
        type(model).__name__ in {"DistributedDataParallel", "DataParallel"}
        and isinstance(getattr(model, "module", None), nn.Module)
    ):
        inner = model.module
        assert isinstance(inner, nn.Module)
        model = inner
        seen += 1
        if seen > 8:  # pragma: no cover - a wrapper cycle would be a bug elsewhere
            break
    return model


def _base_class(module: nn.Module) -> type:
    """The user's class of ``module``: FSDP2's ``fully_shard`` swaps it for ``FSDP<Name>`` (a
    subclass of ``FSDPModule`` and the original); blocks sharded one by one still share a class."""
    cls = type(module)
    if cls.__name__.startswith("FSDP") and len(cls.__bases__) >= 2:
        return cls.__bases__[-1]
    return cls


def look_through(module: nn.Module) -> nn.Module:
    """The block inside checkpoint / ``torch.compile`` wrappers, else ``module`` itself."""
    for _ in range(8):  # wrappers nest a few deep at most (compile over checkpoint)
        inner = next(
            (w for w in (getattr(module, a, None) for a in WRAPPED) if isinstance(w, nn.Module)),
            None,
        )
        if inner is None:
            break
        module = inner
    return module


Blocks = nn.ModuleList | nn.ModuleDict


def _children(container: Blocks) -> list[tuple[str, nn.Module]]:
    if isinstance(container, nn.ModuleDict):
        return list(container.items())
    return [(str(i), m) for i, m in enumerate(container)]


ROUTER_NAMES = ("router", "gate")
"""Child names under which an MoE layer keeps its router (beside its ``experts``)."""


def _moe_layers(root: nn.Module) -> list[tuple[str, str, nn.Module, str, Blocks]]:
    """(layer path, router path, router, experts path, experts) of every MoE layer."""
    out: list[tuple[str, str, nn.Module, str, Blocks]] = []
    for path, module in root.named_modules():
        experts = getattr(module, "experts", None)
        if not isinstance(experts, nn.ModuleList | nn.ModuleDict) or len(experts) == 0:
            continue
        name = next(
            (n for n in ROUTER_NAMES if isinstance(getattr(module, n, None), nn.Module)), None
        )
        if name is None:
            continue
        dot = f"{path}." if path else ""
        router = getattr(module, name)
        out.append((path, dot + name, router, dot + "experts", experts))
    return out


def find_moe(model: nn.Module) -> tuple[tuple[ModuleRef, ...], tuple[ModuleRef, ...]]:
    """The MoE layers' routers and expert containers, in model order: a layer has a non-empty
    ``experts`` ``ModuleList``/``ModuleDict`` (this rank's) and a ``router`` or ``gate`` child,
    as in megatron-core's ``MoELayer`` and most hand-written blocks; other shapes get no recipes."""
    found = _moe_layers(unwrap(model))
    routers = tuple(ModuleRef(rp, r) for _, rp, r, _, _ in found)
    experts = tuple(ModuleRef(ep, e) for _, _, _, ep, e in found)
    return routers, experts


def candidate_lists(model: nn.Module) -> list[tuple[str, Blocks]]:
    """Every non-empty ``ModuleList``/``ModuleDict`` whose children share one class (seen
    through wrappers), largest first; an MoE layer's experts are no candidate."""
    found: list[tuple[str, Blocks]] = []
    root = unwrap(model)
    expert_lists = {id(e) for *_, e in _moe_layers(root)}
    for path, module in root.named_modules():
        if not isinstance(module, nn.ModuleList | nn.ModuleDict) or len(module) == 0:
            continue
        if id(module) in expert_lists:
            continue
        classes = {_base_class(look_through(child)) for _, child in _children(module)}
        if len(classes) == 1:
            found.append((path, module))
    # Stable: on a tie the list met first in module order wins.
    found.sort(key=lambda item: -len(item[1]))
    return found


def _resolve(model: nn.Module, path: str, key: str) -> nn.Module:
    try:
        return model.get_submodule(path)
    except AttributeError:
        return _missing(model, path, key)


def _missing(model: nn.Module, path: str, key: str) -> nn.Module:
    if key == "layers":
        names = [p for p, _ in candidate_lists(model)] or ["(no ModuleList of same-class blocks)"]
        what = "candidate ModuleLists"
    else:
        want: type = nn.Embedding if key == "embedding" else nn.Linear
        names = [p for p, m in model.named_modules() if isinstance(m, want)][:20] or ["(none)"]
        what = f"{want.__name__} modules"
    raise ConfigError(f"key {key!r}: the model has no module {path!r}; {what}: {', '.join(names)}")


def _layer_ref(path: str, child: nn.Module) -> ModuleRef:
    block = look_through(child)
    return ModuleRef(path, block, outer=None if block is child else child)


def find_layers(model: nn.Module, path: str | None = None) -> tuple[ModuleRef, ...]:
    """The repeated blocks at ``path``, else the largest candidate (wrapped: both handles)."""
    root = unwrap(model)
    if path is not None:
        found = _resolve(root, path, "layers")
        if not isinstance(found, nn.ModuleList | nn.Sequential | nn.ModuleDict) or len(found) == 0:
            names = [p for p, _ in candidate_lists(root)] or ["(none)"]
            raise ConfigError(
                f"key 'layers': {path!r} is a {type(found).__name__}, not a non-empty "
                f"ModuleList of blocks; candidate ModuleLists: {', '.join(names)}"
            )
        base = path
        blocks = (
            _children(found)
            if isinstance(found, nn.ModuleDict)
            else [(str(i), m) for i, m in enumerate(found)]
        )
    else:
        candidates = candidate_lists(root)
        if not candidates:
            return ()
        base, container = candidates[0]
        blocks = _children(container)
    return tuple(_layer_ref(f"{base}.{key}" if base else key, b) for key, b in blocks)


def find_embedding(model: nn.Module, path: str | None = None) -> ModuleRef | None:
    """The token embedding: ``path``, else the first ``nn.Embedding`` near the top (depth <= 1)."""
    root = unwrap(model)
    if path is not None:
        return ModuleRef(path, _resolve(root, path, "embedding"))
    for name, module in root.named_modules():
        if isinstance(module, nn.Embedding) and name.count(".") <= 1:
            return ModuleRef(name, module)
    return None


def find_lm_head(
    model: nn.Module, layers: tuple[ModuleRef, ...] = (), path: str | None = None
) -> ModuleRef | None:
    """The output projection: ``path``, else the last ``nn.Linear`` outside the blocks."""
    root = unwrap(model)
    if path is not None:
        return ModuleRef(path, _resolve(root, path, "lm_head"))
    inside = {id(m) for ref in layers for m in ref.hooked.modules()}
    last: ModuleRef | None = None
    for name, module in root.named_modules():
        if isinstance(module, nn.Linear) and id(module) not in inside:
            last = ModuleRef(name, module)
    return last


def discover(
    model: nn.Module,
    *,
    layers: str | None = None,
    embedding: str | None = None,
    lm_head: str | None = None,
) -> Discovered:
    """Run all three searches; configured paths override, unknown paths raise ConfigError."""
    blocks = find_layers(model, layers)
    emb = find_embedding(model, embedding)
    head = find_lm_head(model, blocks, lm_head)
    # A head merely tied to the embedding's weight is its own call: only the same module drops.
    if head is not None and emb is not None and head.module is emb.module:
        head = None
    routers, experts = find_moe(model)
    return Discovered(layers=blocks, embedding=emb, lm_head=head, routers=routers, experts=experts)
