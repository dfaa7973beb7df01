"""The core never imports a framework: checked in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys

FRAMEWORKS = ("megatron", "deepspeed", "torchtitan", "transformer_engine", "apex")


def test_import_scout_core_loads_no_framework() -> None:
    code = (
        "import json, sys\n"
        "import scout_core, scout_core.cli.main, scout_core.testing\n"
        "import scout_core.integration.registry\n"
        "from scout_core.integration.registry import discover\n"
        "discover()\n"  # loading the plugin entry points must not import frameworks either
        "import scout_core.campaign.plan\n"  # nor loading the plugins' campaign setups
        "print(json.dumps(sorted(m.split('.')[0] for m in sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=120
    )
    loaded = set(json.loads(out.stdout.strip().splitlines()[-1]))
    assert "torch" in loaded  # sanity: the probe really imported the core
    leaked = sorted(loaded.intersection(FRAMEWORKS))
    assert leaked == [], f"import scout_core loaded framework modules: {leaked}"
    # The report's drawing libraries load only when a report is drawn.
    heavy = sorted(loaded.intersection(("rich", "matplotlib")))
    assert heavy == [], f"import scout_core loaded {heavy}"
