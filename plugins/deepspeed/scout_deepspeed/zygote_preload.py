"""Imported once by a test zygote (``SCOUT_TEST_PRELOAD``) before it forks DeepSpeed ranks.

Tests only; a job never imports it. Imports DeepSpeed, its pipeline engine and the
plugin, and loads the CPU shared-memory collective op that ``deepspeed.comm``'s CPU
backend loads in every rank (``deepspeed.comm.torch.build_shm_op``). Loaded here,
each forked rank finds the op in DeepSpeed's own cache (``OpBuilder._loaded_ops``)
instead of calling ``torch.utils.cpp_extension.load``, which takes the build
directory's file lock and runs ninja in every rank: on 2 cores that serialises the
ranks, and a rank killed while it holds the lock (a test's timeout) leaves it behind,
so every later DeepSpeed rank on the machine waits on it until its test times out.
Where the op is not built yet the zygote builds it (minutes on 2 cores; past the
zygote's start-up limit its ranks start fresh, as without a zygote).
"""

from __future__ import annotations

import deepspeed
import deepspeed.pipe  # noqa: F401
from deepspeed.comm.torch import build_shm_op

import scout_deepspeed  # noqa: F401

build_shm_op()  # as deepspeed.comm's TorchBackend does; None where the op does not apply
