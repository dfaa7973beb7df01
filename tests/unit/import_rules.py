"""Static import checks over source trees, from the AST (no module is imported to check it).

* :func:`plugin_violations`: a plugin (or example) may import only ``scout_core``,
  ``scout_core.plugin_api`` and ``scout_core.testing``, and only names in their
  ``__all__``; any other ``scout_core`` import, anywhere in the file (inside
  functions too), is a violation.
* :func:`import_graph` / :func:`find_cycles`: the import graph of a package
  (module-level and function-level imports; those under ``if TYPE_CHECKING:`` only
  with ``type_checking=True``) and its cycles. An edge goes to the module an import
  names: ``from a.b import c`` is an edge to ``a.b.c`` when that is a module, else
  to ``a.b``. :func:`folder_graph` folds it onto folders (a top-level module is its
  own unit), where a cycle is a loop of folders.
* :func:`session_reaches`: a plugin reading a session's internals
  (``session.replay``, ``session.observer``, ...) instead of its facade.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

ALLOWED = ("scout_core", "scout_core.plugin_api", "scout_core.testing")


def _runtime_imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import node not guarded by ``if TYPE_CHECKING:``."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _all_imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import node, ``TYPE_CHECKING`` ones included."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def plugin_violations(source: str, filename: str, exported: Mapping[str, set[str]]) -> list[str]:
    """The ``scout_core`` imports of ``source`` that break the plugin rule.

    ``exported`` maps each allowed module to its ``__all__``. Type-checking-only
    imports count too: a plugin must not even name core internals.
    """
    out: list[str] = []
    for node in ast.walk(ast.parse(source, filename)):
        where = f"{filename}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            for alias in node.names:
                name = alias.name
                if (name == "scout_core" or name.startswith("scout_core.")) and name not in ALLOWED:
                    out.append(f"{where}: import {name}")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            mod = node.module
            if mod != "scout_core" and not mod.startswith("scout_core."):
                continue
            if mod not in ALLOWED:
                out.append(f"{where}: from {mod} import ...")
                continue
            for alias in node.names:
                if alias.name == "*" or alias.name not in exported[mod]:
                    out.append(f"{where}: from {mod} import {alias.name} (not in its __all__)")
    return out


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph(package_dir: Path, *, type_checking: bool = False) -> dict[str, set[str]]:
    """Module → the modules of the same package it imports at runtime (and, with
    ``type_checking``, under ``if TYPE_CHECKING:`` too)."""
    files = {_module_name(package_dir, p): p for p in sorted(package_dir.rglob("*.py"))}
    top = package_dir.name
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        is_pkg = path.name == "__init__.py"
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        nodes = _all_imports(tree) if type_checking else _runtime_imports(tree)
        for node in nodes:
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = name.split(".") if is_pkg else name.split(".")[:-1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names
                ]
            for target in targets:
                inside = target == top or target.startswith(f"{top}.")
                if inside and target in files and target != name:
                    graph[name].add(target)
    return graph


def find_cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    cycles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def folder_of(module: str) -> str:
    """The folder a module belongs to: its package's first level below the top
    (``scout_core.checkpoint.coordinator`` → ``scout_core.checkpoint``); a top-level
    module (``scout_core.session``) is its own unit."""
    parts = module.split(".")
    return ".".join(parts[:2])


def folder_graph(graph: Mapping[str, set[str]]) -> dict[str, set[str]]:
    """The module graph folded onto folders (edges inside a folder dropped)."""
    out: dict[str, set[str]] = {}
    for source, targets in graph.items():
        a = folder_of(source)
        out.setdefault(a, set())
        for target in targets:
            b = folder_of(target)
            if b != a:
                out[a].add(b)
    return out


SESSION_INTERNALS = frozenset({"replay", "observer", "adapter", "_closers", "add_closer", "emit"})
"""What a plugin must not read off a session: its parts and its wiring."""


def session_reaches(source: str, filename: str) -> list[str]:
    """Attribute reads of :data:`SESSION_INTERNALS` on a session: a name that says
    ``session`` (``session``, ``live_session``, ``self.session``) or a ``session_of(...)``
    call."""
    out = []
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, ast.Attribute) or node.attr not in SESSION_INTERNALS:
            continue
        base = node.value
        if isinstance(base, ast.Call):
            base = base.func
        name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", "")
        if "session" in name.lower():
            out.append(f"{filename}:{node.lineno}: {ast.unparse(node)}")
    return out
