"""Megatron-Bridge's callback call sites, read from its installed source without importing it.

Bridge's ``train()`` needs CUDA (Transformer Engine, Megatron's DDP and schedules), so
on CPU the tests drive :func:`scout_megatron.testing.bridge_loop.run_bridge_loop`
instead. What keeps that stand-in honest is this module: it parses Bridge's own
``megatron/bridge/training/train.py`` (and ``checkpointing.py``) with :mod:`ast` and
returns each ``callback_manager.fire("<event>", CallbackContext(...))`` call site of a
function, in source order, with the ``CallbackContext`` keywords it passes, and the
line where ``train_state.step`` is incremented. The same reader parses the stand-in's
``fire("<event>", ...)`` calls, so a Bridge release that renames, drops, reorders or
re-keys an event makes the comparison fail.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from scout_megatron.bridge import callbacks_file

__all__ = ["FireSite", "bridge_file", "fire_sites", "step_increments"]


@dataclass(frozen=True)
class FireSite:
    """One event fired: its name, the context keywords passed, the source line."""

    event: str
    keywords: frozenset[str]
    line: int


def bridge_file(name: str) -> Path:
    """An installed ``megatron/bridge/training/<name>`` (next to ``callbacks.py``)."""
    path = callbacks_file().parent / name
    if not path.is_file():
        raise FileNotFoundError(f"Megatron-Bridge has no {path}")
    return path


def _function(path: Path, function: str | None) -> ast.AST:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    if function is None:
        return tree
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == function:
            return node
    raise LookupError(f"{path} has no function {function}()")


def _keywords(call: ast.Call) -> frozenset[str]:
    """The keywords of ``fire``'s context: ``CallbackContext(k=...)`` or ``fire(e, k=...)``."""
    names = {k.arg for k in call.keywords if k.arg is not None}
    for arg in call.args[1:]:
        if isinstance(arg, ast.Call):
            names |= {k.arg for k in arg.keywords if k.arg is not None}
    return frozenset(names)


def fire_sites(path: Path, function: str | None = None) -> list[FireSite]:
    """Every ``*.fire("<event>", ...)`` / ``fire("<event>", ...)`` in ``function`` (None:
    the whole module), in source order."""
    sites = []
    for node in ast.walk(_function(path, function)):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        callee = node.func
        named = callee.attr if isinstance(callee, ast.Attribute) else getattr(callee, "id", None)
        first = node.args[0]
        if named == "fire" and isinstance(first, ast.Constant) and isinstance(first.value, str):
            sites.append(FireSite(first.value, _keywords(node), node.lineno))
    return sorted(sites, key=lambda s: s.line)


def step_increments(path: Path, function: str) -> list[int]:
    """Lines in ``function`` that do ``<...>.train_state.step += 1``."""
    lines = []
    for node in ast.walk(_function(path, function)):
        if (
            isinstance(node, ast.AugAssign)
            and isinstance(node.target, ast.Attribute)
            and node.target.attr == "step"
            and ast.unparse(node.target.value).endswith("train_state")
        ):
            lines.append(node.lineno)
    return sorted(lines)
