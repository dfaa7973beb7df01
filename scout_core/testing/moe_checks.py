"""What the MoE tests of the core and the plugins share: a catalog, and the verdicts seen.

* :func:`discover_catalog` writes a shape catalog for a model description the way a
  user does, through ``python -m scout_core catalog discover --model``.
* :func:`distinct_verdicts` is the union of the verdicts every rank returned (each rank
  sees its group's), as sorted ``(step, surface, failure, outliers)`` tuples.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["discover_catalog", "distinct_verdicts"]


def discover_catalog(model: Sequence[Mapping[str, Any]], folder: Path) -> str:
    """Run ``scout catalog discover`` on ``model`` (float32); the catalog's path."""
    spec, out = folder / "model.json", folder / "catalog.json"
    spec.write_text(json.dumps(list(model)), encoding="utf-8")
    cmd = [sys.executable, "-m", "scout_core", "catalog", "discover", "--model", str(spec)]
    cmd += ["--dtype", "float32", "--quiet", "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    return str(out)


def distinct_verdicts(
    results: Sequence[Mapping[str, Any]],
) -> list[tuple[int, str, str, list[int]]]:
    """Every rank's ``"verdicts"``, each distinct one once, sorted."""
    seen = {
        (v["step"], v["surface"], v["failure"], tuple(v["outliers"]))
        for r in results
        for v in r["verdicts"]
    }
    return sorted((s, surf, str(f), list(o)) for s, surf, f, o in seen)
