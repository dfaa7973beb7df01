"""The ``scout`` command line: ``demo``, ``c3-round``, ``report``, ``simulate``, ``catalog``."""

from __future__ import annotations

from scout_core.cli.main import main

__all__ = ["main"]
