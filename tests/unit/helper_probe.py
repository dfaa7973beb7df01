"""A helper for test_harness.py, run as ``python -m helper_probe``.

``helper_probe OUT FD CODE``: write what this process sees to OUT (JSON), ``hello`` to the
passed descriptor FD, and exit with CODE. ``helper_probe sleep``: sleep until killed.
"""

from __future__ import annotations

import json
import os
import sys
import time

if __name__ == "__main__":
    if sys.argv[1:] == ["sleep"]:
        time.sleep(3600)
    out, fd, code = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    listing = os.listdir("/proc/self/fd")
    facts = {
        "pid": os.getpid(),
        "sid": os.getsid(0),
        "value": os.environ.get("SCOUT_PROBE_VALUE"),
        "cwd": os.getcwd(),
        # the descriptor that listed the directory is closed by now
        "fds": sorted(int(n) for n in listing if os.path.exists(f"/proc/self/fd/{n}")),
        "stdin": os.readlink("/proc/self/fd/0"),
    }
    with open(out, "w") as f:
        json.dump(facts, f)
    os.write(fd, b"hello")
    sys.exit(code)
