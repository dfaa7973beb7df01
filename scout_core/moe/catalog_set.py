"""The catalogs of a whole MoE model: one per expert class, one file, one rotation.

Contract: :meth:`CatalogSet.at` rotates over every class (by name) as a pure function of
the index. :func:`load_or_discover`, called at job start, reuses the classes that still
match and rediscovers the rest; :meth:`CatalogSet.check` is the strict form. Docs: docs/moe.md.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from scout_core.errors import CatalogDriftError, CatalogError
from scout_core.moe.catalog import Catalog, Progress, discover
from scout_core.moe.environment import current_environment
from scout_core.moe.profiler import ShapeProfiler
from scout_core.moe.shapes import ExpertClass, ExpertShape

__all__ = ["SET_SCHEMA", "CatalogSet", "load_or_discover"]

SET_SCHEMA = "scout.moe.catalog-set/1"

log = logging.getLogger(__name__)


class CatalogSet:
    """The catalogs of one model, keyed by expert-class name."""

    def __init__(self, catalogs: Sequence[Catalog]) -> None:
        names = [c.name for c in catalogs]
        if len(set(names)) != len(names):
            raise CatalogError(f"expert class names must be unique, got {names}")
        if not catalogs:
            raise CatalogError("a catalog set needs at least one class")
        self.catalogs: dict[str, Catalog] = {
            c.name: c for c in sorted(catalogs, key=lambda c: c.name)
        }

    def __getitem__(self, name: str) -> Catalog:
        return self.catalogs[name]

    def __len__(self) -> int:
        return len(self.catalogs)

    @property
    def size(self) -> int:
        """Checks in one rotation over every class: the sum of the classes' ``K``."""
        return sum(c.size for c in self.catalogs.values())

    def at(self, index: int) -> tuple[str, ExpertShape]:
        """(class name, representative) for rotation index ``index`` (a pure function)."""
        if index < 0:
            raise ValueError(f"rotation index must be >= 0, got {index}")
        i = index % self.size
        for name, catalog in self.catalogs.items():
            if i < catalog.size:
                return name, catalog.at(i)
            i -= catalog.size
        raise AssertionError("unreachable: index is reduced modulo size")

    def check(
        self,
        classes: Sequence[ExpertClass],
        profiler: ShapeProfiler,
        *,
        device: str | None = None,
        source: str = "the catalog",
    ) -> None:
        """Raise :class:`CatalogDriftError` unless every class matches this environment."""
        drift: list[str] = []
        wanted = {c.name for c in classes}
        for name in sorted(set(self.catalogs) - wanted):
            drift.append(f"class {name!r} is in the catalog but not in the model")
        for cls in classes:
            catalog = self.catalogs.get(cls.name)
            if catalog is None:
                drift.append(f"class {cls.name!r} is in the model but not in the catalog")
                continue
            now = current_environment(cls.describe(), profiler.describe(), device=device)
            drift.extend(f"class {cls.name!r}: {d}" for d in catalog.environment.drift(now))
        if drift:
            raise CatalogDriftError(
                f"{source} was discovered for another environment: "
                + "; ".join(drift)
                + ". Rediscover it (`scout catalog discover`, or load_or_discover).",
                drift,
            )

    def summary(self) -> list[dict[str, Any]]:
        return [c.summary() for c in self.catalogs.values()]

    def to_json(self) -> dict[str, Any]:
        return {"schema": SET_SCHEMA, "catalogs": [c.to_json() for c in self.catalogs.values()]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CatalogSet:
        if data.get("schema") != SET_SCHEMA:
            raise CatalogError(
                f"not a shape-catalog file: schema {data.get('schema')!r}, want {SET_SCHEMA}"
            )
        raw = data.get("catalogs")
        if not isinstance(raw, list):
            raise CatalogError("malformed shape-catalog file: 'catalogs' is not a list")
        return cls([Catalog.from_json(c) for c in raw])

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the set as JSON, atomically (a temporary file renamed into place)."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".catalog-", suffix=".json", dir=target.parent)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(self.to_json(), f, separators=(",", ":"))
            os.chmod(tmp, 0o644)  # mkstemp makes it private; a catalog is meant to be shared
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return target

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> CatalogSet:
        """Read a catalog file; :class:`CatalogError` if it is not a valid one."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise CatalogError(f"cannot read shape catalog {path}: {exc}") from exc
        if not isinstance(data, dict):
            raise CatalogError(f"shape catalog {path} is not a JSON object")
        return cls.from_json(data)


def load_or_discover(
    path: str | os.PathLike[str],
    classes: Sequence[ExpertClass],
    profiler: ShapeProfiler,
    *,
    device: str | None = None,
    progress: Progress | None = None,
) -> tuple[CatalogSet, list[str]]:
    """Load ``path``, rediscovering every class that is missing or drifted.

    Returns the set and one message per change (empty: reused as is); the file is rewritten
    only then. An unreadable or malformed file is rediscovered whole.
    """
    messages: list[str] = []
    old: dict[str, Catalog] = {}
    if Path(path).exists():
        try:
            old = dict(CatalogSet.load(path).catalogs)
        except CatalogError as exc:
            messages.append(f"{path}: {exc}; rediscovering every class")
    else:
        messages.append(f"{path} does not exist; discovering every class")
    kept: list[Catalog] = []
    for cls in classes:
        now = current_environment(cls.describe(), profiler.describe(), device=device)
        catalog = old.get(cls.name)
        if catalog is not None:
            drift = catalog.environment.drift(now)
            if not drift:
                kept.append(catalog)
                continue
            messages.append(f"class {cls.name!r} drifted ({'; '.join(drift)}); rediscovering it")
        elif old:
            messages.append(f"class {cls.name!r} is not in {path}; discovering it")
        kept.append(discover(cls, profiler, environment=now, progress=progress))
    for name in sorted(set(old) - {c.name for c in classes}):
        messages.append(f"class {name!r} is no longer in the model; dropped")
    result = CatalogSet(kept)
    if messages:
        for m in messages:
            log.warning("shape catalog: %s", m)
        result.save(path)
    return result, messages
