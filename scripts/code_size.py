"""Product-code size per folder: non-blank lines and the share that is prose.

Product code is ``scout_core`` without ``testing/`` and each plugin's package
without its ``testing/``. Prose is docstring lines (module, class, function and
attribute strings) plus comment lines. Usage: ``python scripts/code_size.py [ROOT]``.
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from collections import defaultdict
from pathlib import Path


def _prose_lines(text: str) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Expr) and isinstance(getattr(node.value, "value", None), str):
            lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT and tok.line.strip().startswith("#"):
            lines.add(tok.start[0])
    return lines


def measure(root: Path) -> dict[str, tuple[int, int, int]]:
    """Folder → (modules, non-blank lines, prose lines)."""
    out: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    packages = [root / "scout_core", *sorted((root / "plugins").glob("*/scout_*/"))]
    for pkg in packages:
        if not (pkg / "__init__.py").exists():
            continue
        for path in sorted(pkg.rglob("*.py")):
            rel = path.relative_to(pkg)
            if rel.parts[0] == "testing":
                continue
            folder = f"{pkg.name}/{rel.parts[0]}" if len(rel.parts) > 1 else f"{pkg.name}/*.py"
            text = path.read_text(encoding="utf-8")
            nonblank = {i for i, line in enumerate(text.splitlines(), 1) if line.strip()}
            row = out[folder]
            row[0] += 1
            row[1] += len(nonblank)
            row[2] += len(_prose_lines(text) & nonblank)
    return {k: (v[0], v[1], v[2]) for k, v in sorted(out.items())}


def main() -> None:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1]
    rows = measure(root)
    print(f"{'folder':32} {'modules':>7} {'lines':>7} {'prose':>6}")
    for folder, (mods, lines, prose) in rows.items():
        print(f"{folder:32} {mods:7d} {lines:7d} {100 * prose / max(lines, 1):5.1f}%")
    mods = sum(r[0] for r in rows.values())
    lines = sum(r[1] for r in rows.values())
    prose = sum(r[2] for r in rows.values())
    print(f"{'total':32} {mods:7d} {lines:7d} {100 * prose / max(lines, 1):5.1f}%")


if __name__ == "__main__":
    main()
