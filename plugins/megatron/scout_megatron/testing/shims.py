"""CPU shims for real megatron-core 0.16 on a machine without CUDA (tests and examples only).

megatron-core's model code runs on CPU (``TransformerConfig(use_cpu_initialization=True)``,
the local layer spec, learned absolute positions), forward and backward, tensor
parallel included, over Gloo. Three code paths assume CUDA; each shim below replaces
exactly one of them with the CPU equivalent. None of them is needed, or wanted, in a
GPU job: a GPU job uses Megatron's own objects unchanged.

* :class:`CpuMemoryBuffer`. ``megatron.core.utils.GlobalMemoryBuffer.get_tensor``
  allocates its scratch tensors with ``device=torch.cuda.current_device()``; the
  attention score buffer (``DotProductAttention.forward``) and the sequence-parallel
  gathers take them from ``parallel_state.get_global_memory_buffer()``. The subclass
  allocates on CPU and keeps the base class's reuse-by-(name, dtype) behaviour.
* :class:`CpuRNGStatesTracker`. ``tensor_parallel.random.CudaRNGStatesTracker``
  keeps one CUDA generator state per stream (``model-parallel-rng``,
  ``data-parallel-rng``, ``expert-parallel-rng``) and swaps them in and out of the
  CUDA generator in ``add`` and ``fork``. The subclass keeps the same streams, seeded
  the same way by ``model_parallel_cuda_manual_seed``, as states of the *CPU*
  default generator, so dropout inside ``fork()`` draws from the right stream on
  CPU. (``initialize_rng_tracker(inference_rng_tracker=True)`` would also avoid
  CUDA, but its tracker drops every stream: ``get_states()`` is empty and ``fork`` is
  a no-op, so it cannot exercise SCOUT's RNG capture.)
* :func:`cpu_recompute_rng`. Activation recompute (``tensor_parallel.checkpoint``,
  ``CheckpointWithoutOutput``) saves and restores "all" RNG states through
  ``tensor_parallel.random._get_cuda_rng_state`` / ``_set_cuda_rng_state``, which
  read and write the CUDA generator. On CPU there is no CUDA generator: the CPU
  state and the tracker's streams (which this shim's tracker keeps on the CPU
  generator) are saved by the same code next to it. The shim replaces the two
  functions, only while CUDA is unavailable, with an empty state and a no-op.
* :func:`cpu_dist_checkpointing`. ``dist_checkpointing``'s only sharded save strategy
  (``torch_dist``) assumes CUDA while it stages and finalises a save: it calls
  ``torch.cuda.synchronize()`` after staging, and creates its failure flags with
  ``device=torch.cuda.current_device()`` (and ``device='cuda'``). Inside this context
  manager, only on a host without CUDA, ``torch.cuda.current_device`` answers 0
  without initialising CUDA, ``torch.cuda.synchronize`` does nothing and
  :class:`cuda_factories_on_cpu` maps the resulting CUDA devices to CPU. Both torch
  functions are put back on exit. :class:`CpuCheckpointIO` runs the real
  :class:`~scout_megatron.checkpoint.MegatronCheckpointIO` inside it.
* :func:`cpu_moe_router`. Two code paths of an MoE layer's ``TopKRouter`` fail on
  a host without CUDA: ``Router.gating`` moves a CPU weight to
  ``torch.cuda.current_device()`` before every forward, and megatron-core 0.16.1's
  ``router_gating_linear`` reads ``moe_utils.te_general_gemm``, a name bound only
  when Transformer Engine imports (without TE it raises ``NameError``; ``None`` is
  the fallback its code tests for). The shim binds ``te_general_gemm = None`` when TE
  is absent and wraps ``Router.gating`` so that, only while CUDA is unavailable,
  ``current_device`` answers 0 and the move lands on CPU (:class:`cuda_factories_on_cpu`),
  i.e. the weight stays where it is. Its undo puts both back.
* :class:`cuda_factories_on_cpu`. ``FP32Optimizer.__init__`` creates its loss scale
  with ``torch.tensor(..., device='cuda')`` and ``get_grad_norm_fp32`` (called by
  every ``ChainedOptimizer.step``) its scratch tensors with ``device='cuda'``. This
  ``TorchFunctionMode`` rewrites an explicit CUDA ``device=`` of a torch call to CPU
  while it is active; the helpers wrap only the optimizer's construction and its
  ``step()`` in it.

:func:`install_cpu_shims` installs the first three and the router shim after
``parallel_state.initialize_model_parallel`` and seeds the streams the way Megatron
does. Megatron keeps both objects in private module globals
(``parallel_state._GLOBAL_MEMORY_BUFFER``,
``tensor_parallel.random._CUDA_RNG_STATE_TRACKER``): no public setter exists, so the
shim assigns them; ``destroy_model_parallel`` and ``initialize_rng_tracker(force_reset=
True)`` clear them again. The recompute and router shims replace module functions (no
public hook exists), only on a host without CUDA, and return their undo.
"""

from __future__ import annotations

import contextlib
import functools
import operator
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from megatron.core import parallel_state, tensor_parallel
from megatron.core.tensor_parallel import random as mcore_random
from megatron.core.utils import GlobalMemoryBuffer
from torch.overrides import TorchFunctionMode

from scout_megatron.checkpoint import MegatronCheckpointIO

__all__ = [
    "CpuCheckpointIO",
    "CpuMemoryBuffer",
    "CpuRNGStatesTracker",
    "cpu_dist_checkpointing",
    "cpu_moe_router",
    "cpu_recompute_rng",
    "cuda_factories_on_cpu",
    "install_cpu_shims",
]

_MODEL_PARALLEL_RNG = "model-parallel-rng"


class CpuMemoryBuffer(GlobalMemoryBuffer):  # type: ignore[misc]  # megatron is untyped
    """``GlobalMemoryBuffer`` whose scratch tensors live on CPU."""

    def get_tensor(
        self,
        tensor_shape: Sequence[int],
        dtype: torch.dtype,
        name: str,
        mem_alloc_context: Any = None,
    ) -> torch.Tensor:
        del mem_alloc_context  # a CUDA allocator context: nothing to do on CPU
        required = functools.reduce(operator.mul, tensor_shape, 1)
        buffer: torch.Tensor | None = self.buffer.get((name, dtype))
        if buffer is None or buffer.numel() < required:
            buffer = torch.empty(required, dtype=dtype, requires_grad=False)
            self.buffer[(name, dtype)] = buffer
        return buffer[0:required].view(*tensor_shape)


class CpuRNGStatesTracker(mcore_random.CudaRNGStatesTracker):  # type: ignore[misc]
    """Megatron's RNG tracker with its named streams held as CPU generator states."""

    def add(self, name: str, seed: int) -> None:
        """Track a new stream ``name`` seeded with ``seed`` (same checks as Megatron)."""
        self._is_initialized = True
        if seed in self.seeds_:
            raise Exception(f"seed {seed} already exists")  # Megatron raises Exception too
        self.seeds_.add(seed)
        if name in self.states_:
            raise Exception(f"rng state {name} already exists")
        outer = torch.get_rng_state()
        torch.default_generator.manual_seed(seed)
        self.states_[name] = torch.get_rng_state()
        torch.set_rng_state(outer)

    @contextlib.contextmanager
    def fork(self, name: str = _MODEL_PARALLEL_RNG) -> Iterator[None]:
        """Draw from stream ``name`` inside the block; the outer CPU state is restored after."""
        if name not in self.states_:
            raise Exception(f"rng state {name} is not added")
        outer = torch.get_rng_state()
        outer_name = str(getattr(self, "_current_state_name", "default-rng"))
        torch.set_rng_state(self.states_[name])
        self._current_state_name = name
        try:
            yield
        finally:
            # A new tensor replaces the entry, as in Megatron: a state captured before
            # the fork stays valid.
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(outer)
            self._current_state_name = outer_name


def _no_device_state(*args: Any, **kwargs: Any) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8)


def _no_device_set(*args: Any, **kwargs: Any) -> None:
    return None


def cpu_recompute_rng() -> Callable[[], None]:
    """Make recompute's CUDA-generator save/restore a no-op on a CPU-only host; the undo.

    Does nothing (and undoes nothing) where CUDA is available.
    """
    if torch.cuda.is_available() or mcore_random._get_cuda_rng_state is _no_device_state:
        return lambda: None
    saved = (mcore_random._get_cuda_rng_state, mcore_random._set_cuda_rng_state)
    mcore_random._get_cuda_rng_state = _no_device_state
    mcore_random._set_cuda_rng_state = _no_device_set

    def undo() -> None:
        mcore_random._get_cuda_rng_state, mcore_random._set_cuda_rng_state = saved

    return undo


def cpu_moe_router() -> Callable[[], None]:
    """Let an MoE layer's router run on a CPU-only host (see the module doc); the undo.

    Does nothing (and undoes nothing) where CUDA is available or the shim is installed.
    """
    from megatron.core.transformer.moe import moe_utils, router

    if torch.cuda.is_available() or getattr(router.Router.gating, "_scout_cpu", False):
        return lambda: None
    gating = router.Router.gating
    had_gemm = hasattr(moe_utils, "te_general_gemm")

    @functools.wraps(gating)
    def cpu_gating(self: Any, input: torch.Tensor) -> Any:
        with cpu_dist_checkpointing():
            return gating(self, input)

    cpu_gating._scout_cpu = True  # type: ignore[attr-defined]
    router.Router.gating = cpu_gating
    if not had_gemm:
        moe_utils.te_general_gemm = None

    def undo() -> None:
        router.Router.gating = gating
        if not had_gemm:
            del moe_utils.te_general_gemm

    return undo


@contextlib.contextmanager
def cpu_dist_checkpointing() -> Iterator[None]:
    """Let ``dist_checkpointing`` save on a CPU-only host (nothing changes where CUDA exists):
    ``torch.cuda.current_device`` answers 0, ``synchronize`` does nothing and CUDA device
    arguments mean CPU, for the duration."""
    if torch.cuda.is_available():
        yield
        return
    saved = (torch.cuda.current_device, torch.cuda.synchronize)
    torch.cuda.current_device = _device_zero
    torch.cuda.synchronize = _no_sync
    try:
        with cuda_factories_on_cpu():
            yield
    finally:
        torch.cuda.current_device, torch.cuda.synchronize = saved


class CpuCheckpointIO(MegatronCheckpointIO):
    """:class:`~scout_megatron.checkpoint.MegatronCheckpointIO` whose saves run inside
    :func:`cpu_dist_checkpointing` (loads need no shim)."""

    def save(self, tag: str) -> bool:
        with cpu_dist_checkpointing():
            return super().save(tag)


def _device_zero() -> int:
    return 0


def _no_sync(device: Any = None) -> None:
    del device


def install_cpu_shims(seed: int) -> None:
    """Install the CPU memory buffer and RNG tracker, the recompute and MoE router shims,
    then seed the streams like Megatron.

    Call after ``parallel_state.initialize_model_parallel``. The streams get Megatron's
    seeds (``model_parallel_cuda_manual_seed``: data-parallel ``seed``, model-parallel
    ``seed + 2718 + tp_rank``, expert-parallel ``seed + 1024 + 100 * ep_rank + etp_rank``);
    the CPU generator is seeded with ``seed`` too.
    """
    parallel_state._GLOBAL_MEMORY_BUFFER = CpuMemoryBuffer()
    mcore_random.initialize_rng_tracker(force_reset=True)
    mcore_random._CUDA_RNG_STATE_TRACKER = CpuRNGStatesTracker()
    mcore_random._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    cpu_recompute_rng()
    cpu_moe_router()
    torch.manual_seed(seed)
    # torch.cuda.manual_seed inside is queued lazily by torch and never runs without CUDA.
    tensor_parallel.model_parallel_cuda_manual_seed(seed)


def _on_cpu(device: Any) -> Any:
    if device is None:
        return None
    if isinstance(device, int) and not isinstance(device, bool):
        return torch.device("cpu")  # a bare index names an accelerator device
    try:
        kind = torch.device(device).type
    except (RuntimeError, TypeError):
        return device
    return torch.device("cpu") if kind == "cuda" else device


class cuda_factories_on_cpu(TorchFunctionMode):  # noqa: N801 - used like a function
    """While active, a torch call's ``device='cuda'`` (or ``cuda:N``) argument means CPU."""

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = dict(kwargs or {})
        if "device" in kwargs:
            kwargs["device"] = _on_cpu(kwargs["device"])
        return func(*args, **kwargs)
