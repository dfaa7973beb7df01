"""Shims that let a real TorchTitan 0.3 ``Trainer`` run on a CPU-only machine (tests only).

TorchTitan 0.3 assumes an accelerator in a few places. Each shim below replaces
exactly one of them, only when the machine needs it, and leaves every TorchTitan
class real: the ``Trainer``, its meshes, model, optimizers, checkpointer and data
loader are TorchTitan's own. None of this is part of the plugin proper; SCOUT's
tests and the CPU example install them, production jobs on GPUs never do.

[Which TorchTitan paths assume CUDA, and what each shim does]
1. ``torchtitan/tools/utils.py`` computes ``device_type`` as
   ``_get_available_device_type() or "cuda"``, so a machine with no accelerator gets
   ``"cuda"`` and ``torch.cuda`` as its device module. Several modules copy the two
   names at import time (``distributed/utils.py``, ``parallel_dims.py``,
   ``components/metrics.py``). Shim: set ``device_type = "cpu"`` and
   ``device_module = torch.cpu`` in ``tools/utils`` *before* those modules are
   imported (:func:`install_cpu_shims` refuses to run after, rather than half-patch).
2. ``import torchtitan.trainer`` reaches ``distributed/minimal_async_ep/kernels.py``,
   which does ``import triton`` unconditionally; CPU wheels of torch ship no triton.
   Shim: register a stand-in module under that name whose kernels raise if called
   (expert-parallel token dispatch needs CUDA anyway). We do not fake ``triton``
   itself: torch probes for it and would then take GPU code paths.
3. ``components/metrics.DeviceMemoryMonitor`` calls ``get_device_name``,
   ``get_device_properties``, ``memory_stats``, ``reset_peak_memory_stats`` and
   ``empty_cache`` on the device module; ``torch.cpu`` has none of them. Shim:
   ``metrics.build_device_memory_monitor`` returns a ``CpuMemoryMonitor``, a
   subclass of TorchTitan's monitor that reports the host's memory and zero peaks.
4. ``distributed/utils.set_pg_timeouts`` (called after the first step) runs
   ``barrier(device_ids=[device_module.current_device()])`` and then
   ``torch.distributed.set_timeout``, which torch 2.13 does not have (API drift
   between torchtitan 0.3.0 and torch 2.13, on any device). Shim: the same barrier
   without ``device_ids`` on CPU, and torch's ``_set_pg_timeout`` per group when
   ``set_timeout`` is missing.

The fifth CPU obstacle, FlexAttention (no CPU backward), is a model choice rather
than a patch: see :mod:`scout_torchtitan.testing.attention`.

Every patch is recorded; :func:`uninstall_cpu_shims` puts the originals back.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import types
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch

__all__ = [
    "cpu_shims_installed",
    "install_cpu_shims",
    "needs_device_shim",
    "uninstall_cpu_shims",
]

log = logging.getLogger(__name__)

_KERNELS = "torchtitan.distributed.minimal_async_ep.kernels"
# Modules that copy device_type/device_module at import time (shim 1).
_DEVICE_CONSUMERS = (
    "torchtitan.distributed.utils",
    "torchtitan.distributed.parallel_dims",
    "torchtitan.components.metrics",
    "torchtitan.models.common.token_dispatcher",
    "torchtitan.tools.profiler",
)
_KERNEL_NAMES = (
    "copy_full_counts_to_peers_kernel",
    "copy_rows_to_peers_kernel",
    "expand_topk_grad_kernel",
    "fill_combine_metadata_kernel",
    "fill_dispatch_metadata_kernel",
    "invert_flat_indices_kernel",
    "reduce_topk_slots_kernel",
    "topk_scores_grad_kernel",
)

_undo: list[Callable[[], None]] = []


def needs_device_shim() -> bool:
    """True when torch sees no accelerator (TorchTitan would then pick ``"cuda"``)."""
    from torch._utils import _get_available_device_type

    return _get_available_device_type() is None  # type: ignore[no-untyped-call]


def cpu_shims_installed() -> bool:
    """Whether :func:`install_cpu_shims` is in effect in this process."""
    return bool(_undo)


def _setattr(obj: Any, name: str, value: Any) -> None:
    missing = object()
    old = getattr(obj, name, missing)
    setattr(obj, name, value)
    if old is missing:
        _undo.append(lambda: delattr(obj, name))
    else:
        _undo.append(lambda: setattr(obj, name, old))


def _shim_device() -> None:
    stale = [
        m
        for m in _DEVICE_CONSUMERS
        if m in sys.modules and getattr(sys.modules[m], "device_type", "cpu") != "cpu"
    ]
    if stale:
        raise RuntimeError(
            "install_cpu_shims() must run before TorchTitan modules that copy "
            f"tools.utils.device_type are imported; already imported: {', '.join(stale)}"
        )
    utils = importlib.import_module("torchtitan.tools.utils")
    _setattr(utils, "device_type", "cpu")
    _setattr(utils, "device_module", torch.cpu)


def _kernel_stub(name: str) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            f"{_KERNELS}.{name} is a CPU test stub: minimal async expert parallelism "
            "needs triton and CUDA"
        )

    kernel.__name__ = name
    return kernel


def _stub_triton_kernels() -> None:
    if importlib.util.find_spec("triton") is not None or _KERNELS in sys.modules:
        return
    stub = types.ModuleType(_KERNELS, "CPU stand-in (scout_torchtitan.testing): needs triton")
    for name in _KERNEL_NAMES:
        setattr(stub, name, _kernel_stub(name))
    sys.modules[_KERNELS] = stub

    def unstub() -> None:
        sys.modules.pop(_KERNELS, None)

    _undo.append(unstub)


def _host_memory_bytes() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return 1 << 34


def _monitor_class() -> type:
    from torchtitan.components import metrics

    class _CpuMemoryMonitor(metrics.DeviceMemoryMonitor):  # type: ignore[misc]  # untyped base
        """TorchTitan's ``DeviceMemoryMonitor`` for the host: capacity known, peaks zero."""

        def __init__(self, device: str = "cpu") -> None:
            self.device = torch.device(device)
            self.device_name = "cpu"
            self.device_index = 0
            self.device_capacity = _host_memory_bytes()
            self.device_capacity_gib = self._to_gib(self.device_capacity)

        def get_peak_stats(self) -> Any:
            return metrics.DeviceMemStats(0.0, 0.0, 0.0, 0.0, 0, 0)

        def reset_peak_stats(self) -> None:
            return None

    _CpuMemoryMonitor.__name__ = _CpuMemoryMonitor.__qualname__ = "CpuMemoryMonitor"
    return _CpuMemoryMonitor


def _shim_memory_monitor() -> None:
    from torchtitan.components import metrics

    monitor_cls = _monitor_class()

    def build_device_memory_monitor() -> Any:
        return monitor_cls("cpu")

    _setattr(metrics, "build_device_memory_monitor", build_device_memory_monitor)


def _shim_pg_timeouts(on_cpu: bool) -> None:
    import torch.distributed as dist
    from torchtitan.distributed import utils as dist_utils

    if not on_cpu and hasattr(dist, "set_timeout"):
        return
    from torch.distributed.distributed_c10d import _set_pg_timeout

    set_timeout = getattr(dist, "set_timeout", _set_pg_timeout)

    def set_pg_timeouts(timeout: timedelta, parallel_dims: Any) -> None:
        # Same contract as TorchTitan's: everyone reaches this point, then every
        # enabled mesh group and the default group get the shorter timeout.
        if on_cpu:
            dist.barrier()
        else:
            dist.barrier(device_ids=[torch.cuda.current_device()])
        groups = [m.get_group() for m in parallel_dims.get_all_one_dimensional_meshes().values()]
        for group in [*groups, None]:
            set_timeout(timeout, group)

    _setattr(dist_utils, "set_pg_timeouts", set_pg_timeouts)


def install_cpu_shims() -> None:
    """Install the shims this machine needs (idempotent). Call before importing
    ``torchtitan.trainer`` or ``torchtitan.train``.

    On a machine with an accelerator only the ``set_timeout`` drift shim (4) can
    apply; on a CPU-only machine all four do.
    """
    if _undo:
        return
    on_cpu = needs_device_shim()
    try:
        if on_cpu:
            _shim_device()
        _stub_triton_kernels()
        if on_cpu:
            _shim_memory_monitor()
        _shim_pg_timeouts(on_cpu)
    except BaseException:
        uninstall_cpu_shims()
        raise
    if _undo:
        log.info("TorchTitan CPU shims installed (%d patches)", len(_undo))


def uninstall_cpu_shims() -> None:
    """Undo every patch :func:`install_cpu_shims` made, newest first."""
    while _undo:
        _undo.pop()()
