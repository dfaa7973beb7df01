"""Entry point of one rank spawned by :func:`scout_core.testing.run_ranks`.

Reads its JSON spec, dies with the harness, joins the Gloo group through the
harness-hosted store, runs the target, and writes the JSON result.
"""

from __future__ import annotations

import ctypes
import datetime
import importlib
import importlib.util
import json
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

_PR_SET_PDEATHSIG = 1


def _die_with_parent(harness_pid: int) -> None:
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != harness_pid:  # the harness died before prctl took effect
        os._exit(1)


def _resolve(target: str) -> Any:
    obj: Any
    if target.startswith("file:"):  # harness.MAIN_PREFIX: a function of the user's script
        path, _, qualname = target[len("file:") :].rpartition(":")
        spec = importlib.util.spec_from_file_location("__scout_main__", path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {path}")
        obj = importlib.util.module_from_spec(spec)
        sys.modules["__scout_main__"] = obj
        spec.loader.exec_module(obj)
    else:
        module_name, _, qualname = target.partition(":")
        obj = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def main(spec_path: str, parent_pid: int | None = None) -> int:
    """Run the spec's target; ``parent_pid`` is the zygote's when one forked this rank."""
    spec = json.loads(Path(spec_path).read_text())
    _die_with_parent(spec["harness_pid"] if parent_pid is None else parent_pid)
    for p in reversed(spec["sys_path"]):
        if p not in sys.path:
            sys.path.insert(0, p)
    rank, world = spec["rank"], spec["world_size"]
    result_path = Path(spec_path).with_name(f"result-{rank}.json")
    import torch.distributed as dist

    try:
        if spec["init_process_group"]:
            # TCPStore is public API; torch's stubs just do not re-export it.
            store = dist.TCPStore("127.0.0.1", spec["store_port"], None, False)  # type: ignore[attr-defined]
            dist.init_process_group(
                "gloo",
                store=store,
                rank=rank,
                world_size=world,
                timeout=datetime.timedelta(seconds=spec["timeout_s"]),
            )
        fn = _resolve(spec["target"])
        result = fn(*spec["args"], **spec["kwargs"])
        if spec["init_process_group"] and dist.is_initialized():
            dist.destroy_process_group()
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        return 1
    result_path.write_text(json.dumps({"result": result}))
    return 0


if __name__ == "__main__":
    sys.stdout.flush()
    code = main(sys.argv[1])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
