"""The ``scout`` command line (:mod:`.main` lists its subcommands)."""

from __future__ import annotations

from scout_core.cli.main import main

__all__ = ["main"]
