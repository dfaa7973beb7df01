"""Imported once by a test zygote (``SCOUT_TEST_PRELOAD``) before it forks DeepSpeed ranks.

Tests only. Imports DeepSpeed, its pipeline engine and the plugin, and loads the CPU
shared-memory op (``deepspeed.comm.torch.build_shm_op``), so each forked rank finds it in
``OpBuilder._loaded_ops``. Otherwise every rank calls ``cpp_extension.load``, which takes the
build directory's file lock and runs ninja: that serialises the ranks, and a rank killed
while holding the lock leaves it behind for every later rank until its test times out. An
unbuilt op is built here (minutes; past the zygote's start-up limit its ranks start fresh).
"""

from __future__ import annotations

import deepspeed
import deepspeed.pipe  # noqa: F401
from deepspeed.comm.torch import build_shm_op

import scout_deepspeed  # noqa: F401

build_shm_op()  # as deepspeed.comm's TorchBackend does; None where the op does not apply
