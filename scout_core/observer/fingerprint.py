"""Collective fingerprints, published just before a ``torch.distributed`` collective runs.

A fingerprint is what every member of a collective must agree on for it to complete (group,
type, tensor shape and dtype, reduction, root as a group rank), hashed into three int64
words so the progress record stays fixed-size and C3 can compare it exactly; values that
legitimately differ between ranks are left out. Contract:
:func:`install_collective_fingerprints` wraps the :data:`COLLECTIVES` functions (torch has no
public pre-collective hook) to publish the fingerprint and the exit, once per outermost
call; its closer restores each original still holding SCOUT's wrapper. Docs:
docs/observer.md, "Collective fingerprints".
"""

from __future__ import annotations

import functools
import inspect
import threading
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias

import torch
import torch.distributed as dist

from scout_core.observer.roles import GroupRoles, describe_group_word, plain_group_word
from scout_core.topology.mesh import MeshLayout

__all__ = [
    "COLLECTIVES",
    "CollectiveSink",
    "Fingerprint",
    "OpSpec",
    "describe",
    "fingerprint",
    "fingerprint_and_peer",
    "install_collective_fingerprints",
    "use_layout",
]

Fingerprint: TypeAlias = tuple[int, int, int]
"""Three int64 words: (op code | reduction | root in the group, group word (:mod:`.roles`),
shape/dtype hash)."""

_MASK63 = (1 << 63) - 1


class CollectiveSink(Protocol):
    """What receives fingerprints: the trainer's :class:`~.progress.Publisher`, or a counter."""

    def enter_collective(self, fp: Fingerprint, peer: int | None = None) -> None: ...

    def exit_collective(self) -> None: ...


@dataclass(frozen=True)
class OpSpec:
    """Where a collective's compared arguments are, by parameter name."""

    code: int
    """Collective type; ops with the same wire protocol share a code."""
    tensor: str | None = None
    kind: str = "tensor"
    """``tensor``, ``list`` (a tensor list: its length, first tensor's shape),
    ``split`` (all-to-all: leading dimension excluded), ``p2p``, ``none``."""
    reduce: str | None = None
    root: str | None = None
    group_root: str | None = None
    peer: str | None = None
    """Point-to-point: the partner as a global rank (``group_peer``: as a group rank)."""
    group_peer: str | None = None


# The one table of supported collectives. Codes are part of the fingerprint: never
# renumber. all_gather_into_tensor is the old name of all_gather_single (same code).
COLLECTIVES: dict[str, OpSpec] = {
    "all_reduce": OpSpec(1, "tensor", reduce="op"),
    "all_reduce_coalesced": OpSpec(2, "tensors", "list", reduce="op"),
    "all_gather": OpSpec(3, "tensor"),
    "all_gather_coalesced": OpSpec(4, "input_tensor_list", "list"),
    "all_gather_single": OpSpec(5, "input_tensor"),
    "all_gather_into_tensor": OpSpec(5, "input_tensor"),
    "reduce_scatter": OpSpec(6, "output", reduce="op"),
    "reduce_scatter_single": OpSpec(7, "output", reduce="op"),
    "reduce_scatter_tensor": OpSpec(7, "output", reduce="op"),
    "broadcast": OpSpec(8, "tensor", root="src", group_root="group_src"),
    "reduce": OpSpec(9, "tensor", reduce="op", root="dst", group_root="group_dst"),
    "gather": OpSpec(10, "tensor", root="dst", group_root="group_dst"),
    "scatter": OpSpec(11, "tensor", root="src", group_root="group_src"),
    "all_to_all": OpSpec(12, "input_tensor_list", "split"),
    "all_to_all_single": OpSpec(13, "input", "split"),
    "barrier": OpSpec(14, kind="none"),
    "monitored_barrier": OpSpec(15, kind="none"),
    # Point-to-point: send and recv of one transfer look alike (the direction is
    # excluded); the partner is part of the group word only under a layout.
    "send": OpSpec(16, "tensor", "p2p", peer="dst", group_peer="group_dst"),
    "recv": OpSpec(16, "tensor", "p2p", peer="src", group_peer="group_src"),
    "isend": OpSpec(16, "tensor", "p2p", peer="dst", group_peer="group_dst"),
    "irecv": OpSpec(16, "tensor", "p2p", peer="src", group_peer="group_src"),
    "batch_isend_irecv": OpSpec(17, kind="none"),
}

_BATCH_P2P = COLLECTIVES["batch_isend_irecv"].code
_SUM = dist.ReduceOp.SUM
_CODE_NAMES = {spec.code: name for name, spec in reversed(list(COLLECTIVES.items()))}

_DTYPES: tuple[torch.dtype, ...] = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.complex64,
    torch.complex128,
)
_DTYPE_CODE: dict[torch.dtype, int] = {d: i + 1 for i, d in enumerate(_DTYPES)}
_WORLD_KEY = object()
_GROUP_WORD: dict[Any, int] = {}
_P2P_WORD: dict[int, int] = {}
_GROUP_RANK: dict[tuple[Any, int], int] = {}
_REDUCE_CODE: dict[Any, int] = {}


def _dtype_code(dtype: torch.dtype) -> int:
    code = _DTYPE_CODE.get(dtype)
    if code is None:  # rare dtypes (fp8 ...): a stable hash of the name, cached
        code = 1000 + zlib.crc32(str(dtype).encode())
        _DTYPE_CODE[dtype] = code
    return code


class _Roles:
    """The layout roles in force (:func:`use_layout`); None: describe groups by their ranks."""

    current: GroupRoles | None = None


def use_layout(layout: MeshLayout, rank: int) -> Callable[[], None]:
    """Describe groups by role and position in ``layout``, seen from ``rank``, from now on.

    This lets the observers compare equivalent ranks. Returns the undo (to global ranks)."""
    roles = GroupRoles(layout, rank)
    with _PATCH_LOCK:
        _Roles.current = roles
        _GROUP_WORD.clear()
        _P2P_WORD.clear()

    def undo() -> None:
        with _PATCH_LOCK:
            if _Roles.current is roles:
                _Roles.current = None
                _GROUP_WORD.clear()
                _P2P_WORD.clear()

    return undo


def _ranks_of(group: Any) -> list[int]:
    key = group if group is not None else dist.group.WORLD
    try:
        return list(dist.get_process_group_ranks(key))
    except (RuntimeError, ValueError, AttributeError):
        return []


def _group_word(group: Any) -> int:
    """The group word (:mod:`.roles`) of ``group``, cached per group object."""
    key = group if group is not None else _WORLD_KEY
    h = _GROUP_WORD.get(key)
    if h is None:
        ranks = _ranks_of(group)
        roles = _Roles.current
        h = roles.group_word(ranks) if roles is not None and ranks else plain_group_word(ranks)
        _GROUP_WORD[key] = h
    return h


def _p2p_word(group: Any, peer: int | None) -> int:
    """The group word of a point-to-point operation with global rank ``peer``."""
    roles = _Roles.current
    if roles is None or peer is None:
        return _group_word(group)
    h = _P2P_WORD.get(peer)
    if h is None:
        h = roles.p2p_word(peer)
        _P2P_WORD[peer] = h
    return h


def _group_rank(group: Any, root: int) -> int:
    """``root`` (a global rank) as a rank of ``group``; itself for the default group."""
    if group is None:
        return root
    key = (group, root)
    r = _GROUP_RANK.get(key)
    if r is None:
        try:
            r = dist.get_group_rank(group, root)
        except (RuntimeError, ValueError, AttributeError):
            r = root
        _GROUP_RANK[key] = r
    return r


def _reduce_code(op: Any) -> int:
    try:
        return _REDUCE_CODE[op]
    except (KeyError, TypeError):
        pass
    try:
        code = int(op) + 1
    except (TypeError, ValueError):  # a ReduceOp instance (e.g. premul-sum)
        return 200 + zlib.crc32(repr(op).encode()) % 50
    _REDUCE_CODE[op] = code
    return code


def _shape_hash(value: Any, kind: str) -> int:
    if kind == "none" or value is None:
        return 0
    if not isinstance(value, torch.Tensor):  # a tensor list (all_to_all, coalesced ops)
        seq = list(value)
        if not seq:
            return 0  # an empty list: nothing to compare beyond the collective type
        first = seq[0]
        dims = tuple(first.shape)
        if kind == "split":  # split sizes are rank-dependent: drop the split dimension
            dims = dims[1:]
        return hash((len(seq), _dtype_code(first.dtype), dims)) & _MASK63
    shape = value.shape  # torch.Size is a tuple: hashed like one, deterministically
    if kind == "split":
        shape = shape[1:]
    code = _DTYPE_CODE.get(value.dtype) or _dtype_code(value.dtype)
    return hash((code, shape)) & _MASK63


_ABSENT = 1 << 30  # a parameter position no call reaches: fall back to kwargs


@dataclass(frozen=True)
class _Plan:
    """Parameter positions of one collective's compared arguments, resolved once."""

    code: int
    kind: str
    tensor: tuple[int, str | None]
    group: tuple[int, str | None]
    reduce: tuple[int, str | None]
    root: tuple[int, str | None]
    group_root: tuple[int, str | None]
    peer: tuple[int, str | None]
    group_peer: tuple[int, str | None]


_PLANS: dict[str, _Plan] = {}


def _plan(name: str, params: dict[str, int]) -> _Plan:
    spec = COLLECTIVES[name]

    def at(param: str | None) -> tuple[int, str | None]:
        if param is None:
            return (_ABSENT, None)
        return (params.get(param, _ABSENT), param)

    plan = _Plan(
        spec.code,
        spec.kind,
        at(spec.tensor),
        at("group"),
        at(spec.reduce),
        at(spec.root),
        at(spec.group_root),
        at(spec.peer),
        at(spec.group_peer),
    )
    _PLANS[name] = plan
    return plan


def _get(args: Sequence[Any], kwargs: dict[str, Any], where: tuple[int, str | None]) -> Any:
    i, param = where
    if i < len(args):
        return args[i]
    return kwargs.get(param) if param is not None and kwargs else None


def fingerprint(
    name: str, args: Sequence[Any], kwargs: dict[str, Any], params: dict[str, int] | None = None
) -> Fingerprint:
    """The fingerprint of ``torch.distributed.<name>(*args, **kwargs)``."""
    return fingerprint_and_peer(name, args, kwargs, params)[0]


def fingerprint_and_peer(
    name: str, args: Sequence[Any], kwargs: dict[str, Any], params: dict[str, int] | None = None
) -> tuple[Fingerprint, int | None]:
    """The fingerprint, and the partner's global rank for a point-to-point operation."""
    plan = _PLANS.get(name) or _plan(name, _params(name) if params is None else params)
    # Inlined argument lookups: this runs on every collective (see the benchmark).
    n = len(args)
    i, p = plan.group
    group = args[i] if i < n else (kwargs.get("group") if kwargs else None)
    if plan.code == _BATCH_P2P:
        ops = args[0] if args else kwargs.get("p2p_op_list") or []
        group = getattr(ops[0], "group", None) if ops else None
    root = None
    i, p = plan.root
    if p is not None:
        root = args[i] if i < n else kwargs.get(p)
        if root is not None:
            root = _group_rank(group, root)
        elif plan.group_root[1] is not None:
            root = _get(args, kwargs, plan.group_root)
    reduce = 0
    i, p = plan.reduce
    if p is not None:
        op = args[i] if i < n else kwargs.get(p)
        reduce = _reduce_code(_SUM if op is None else op)
    w0 = (plan.code << 48) | (reduce << 40) | ((root + 1) if root is not None else 0)
    i, p = plan.tensor
    tensor = args[i] if i < n else (kwargs.get(p) if p is not None else None)
    peer = None
    if plan.peer[1] is not None:
        peer = _get(args, kwargs, plan.peer)
        if peer is None:
            g_peer = _get(args, kwargs, plan.group_peer)
            if g_peer is not None:
                pg = group if group is not None else dist.group.WORLD
                peer = dist.get_global_rank(pg, g_peer) if pg is not None else g_peer
        word = _p2p_word(group, peer)
    else:
        word = _group_word(group)
    return (w0, word, _shape_hash(tensor, plan.kind)), peer


@functools.cache
def _params(name: str) -> dict[str, int]:
    fn = getattr(dist.distributed_c10d, name)
    return _params_of(getattr(fn, "__scout_original__", fn))


def describe(fp: Sequence[int]) -> dict[str, Any]:
    """A readable view of fingerprint words for evidence records."""
    w0 = int(fp[0]) & ((1 << 64) - 1)
    code, reduce, root = w0 >> 48, (w0 >> 40) & 0xFF, w0 & ((1 << 40) - 1)
    return {
        "collective": _CODE_NAMES.get(code, "none" if code == 0 else f"op{code}"),
        "reduce": None if reduce == 0 else reduce - 1,
        "root": None if root == 0 else root - 1,
        "group": describe_group_word(int(fp[1])),
        "group_hash": f"{int(fp[1]) & ((1 << 64) - 1):016x}",
        "shape_hash": f"{int(fp[2]) & ((1 << 64) - 1):016x}",
    }


_ORIGINALS: dict[str, Callable[..., Any]] = {}
_WRAPPERS: dict[str, Callable[..., Any]] = {}


class _Patch:
    """The installed sinks; replaced, never mutated, so a wrapper never sees half an update."""

    sinks: tuple[CollectiveSink, ...] = ()


_TLS = threading.local()
_PATCH_LOCK = threading.Lock()


def _wrap(name: str, orig: Callable[..., Any]) -> Callable[..., Any]:
    params = _params_of(orig)

    @functools.wraps(orig)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        sinks = _Patch.sinks
        if not sinks or getattr(_TLS, "inside", False):
            return orig(*args, **kwargs)
        try:
            fp, peer = fingerprint_and_peer(name, args, kwargs, params)
        except Exception:  # never break training over a fingerprint: publish the type only
            fp, peer = (COLLECTIVES[name].code << 48, 0, 0), None
        for sink in sinks:
            sink.enter_collective(fp, peer)
        _TLS.inside = True
        try:
            return orig(*args, **kwargs)
        finally:
            _TLS.inside = False
            for sink in sinks:
                sink.exit_collective()

    wrapper.__scout_original__ = orig  # type: ignore[attr-defined]  # marks SCOUT's wrapper
    return wrapper


def _params_of(fn: Callable[..., Any]) -> dict[str, int]:
    return {p: i for i, p in enumerate(inspect.signature(fn).parameters)}


def _modules() -> tuple[Any, ...]:
    return (dist, dist.distributed_c10d)


def install_collective_fingerprints(sink: CollectiveSink) -> Callable[[], None]:
    """Publish a fingerprint to ``sink`` before every supported collective; return an
    idempotent closer that detaches ``sink`` (the last one restores the originals)."""
    with _PATCH_LOCK:
        if not _WRAPPERS:
            for name in COLLECTIVES:
                orig = getattr(dist.distributed_c10d, name, None)
                if orig is None:
                    continue  # older torch without this collective
                _ORIGINALS[name] = orig
                _WRAPPERS[name] = _wrap(name, orig)
                for module in _modules():
                    if getattr(module, name, None) is orig:
                        setattr(module, name, _WRAPPERS[name])
        _Patch.sinks = (*_Patch.sinks, sink)
    done = False

    def close() -> None:
        nonlocal done
        with _PATCH_LOCK:
            if done:
                return
            done = True
            _Patch.sinks = tuple(s for s in _Patch.sinks if s is not sink)
            if _Patch.sinks:
                return
            for name, wrapper in _WRAPPERS.items():
                for module in _modules():
                    if getattr(module, name, None) is wrapper:
                        setattr(module, name, _ORIGINALS[name])
            _WRAPPERS.clear()
            _ORIGINALS.clear()

    return close
