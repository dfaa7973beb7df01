"""One expert class's shape catalog: discovery, rotation, JSON form, drift check.

Contract: :meth:`Catalog.at` is a pure function of the rotation index, so every rank
holding the same catalog picks the same shape without talking; loading re-verifies the
cover, so a hand-edited or truncated file is refused. No pickle. Docs: docs/moe.md,
"Rotation" and "Environment binding and drift".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scout_core.errors import CatalogDriftError, CatalogError
from scout_core.moe.coverage import Cover, Profile, minimum_cover, verify_cover
from scout_core.moe.environment import Environment, current_environment
from scout_core.moe.profiler import ShapeProfiler
from scout_core.moe.shapes import ExpertClass, ExpertShape

__all__ = ["SCHEMA", "Catalog", "Entry", "Progress", "discover"]

SCHEMA = "scout.moe.catalog/1"

Progress = Callable[[int, int, str], None]
"""``progress(done, total, label)``, called after each profiled shape."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One admitted shape, its profile and the representative that covers it."""

    shape: ExpertShape
    profile: Profile
    covered_by: int
    """Index (into the catalog's entries) of the representative covering this shape."""


class Catalog:
    """The representatives of one expert class, bound to an environment."""

    def __init__(self, *, environment: Environment, entries: Sequence[Entry]) -> None:
        self.environment = environment
        self.workload = ExpertClass.from_json(environment.model)
        self.entries = tuple(entries)
        shapes = self.workload.shapes()
        if [e.shape for e in self.entries] != shapes:
            raise CatalogError(
                f"catalog of class {self.workload.name!r}: its entries are not the class's "
                f"{len(shapes)} admitted shapes in order"
            )
        cover = Cover(
            representatives=tuple(sorted({e.covered_by for e in self.entries})),
            covered_by=tuple(e.covered_by for e in self.entries),
        )
        problems = verify_cover([e.profile for e in self.entries], cover)
        if problems:
            raise CatalogError(
                f"catalog of class {self.workload.name!r} does not cover its shapes: "
                + "; ".join(problems[:5])
                + (f" (and {len(problems) - 5} more)" if len(problems) > 5 else "")
            )
        self._reps = cover.representatives

    @property
    def name(self) -> str:
        return self.workload.name

    @property
    def size(self) -> int:
        """``K``, the number of representatives: the length of one rotation."""
        return len(self._reps)

    @property
    def representatives(self) -> tuple[ExpertShape, ...]:
        """The retained shapes, in rotation order (the class's admitted order)."""
        return tuple(self.entries[i].shape for i in self._reps)

    @property
    def uncertain(self) -> int:
        """Shapes kept only because their profile was uncertain."""
        return sum(1 for e in self.entries if not e.profile.certain)

    @property
    def reduction(self) -> float:
        """``1 - K / admitted``: the share of admitted shapes online replay skips."""
        return 1.0 - self.size / len(self.entries)

    def at(self, index: int) -> ExpertShape:
        """The representative replayed at rotation index ``index`` (a pure function)."""
        if index < 0:
            raise ValueError(f"rotation index must be >= 0, got {index}")
        return self.entries[self._reps[index % self.size]].shape

    def covered(self, representative: ExpertShape) -> list[ExpertShape]:
        """The admitted shapes ``representative`` stands for (itself included)."""
        idx = next((i for i in self._reps if self.entries[i].shape == representative), None)
        if idx is None:
            raise KeyError(f"{representative.label()} is not a representative of {self.name!r}")
        return [e.shape for e in self.entries if e.covered_by == idx]

    def check(self, now: Environment, *, source: str = "the catalog") -> None:
        """Raise :class:`CatalogDriftError` naming every field that drifted from ``now``."""
        drift = self.environment.drift(now)
        if drift:
            raise CatalogDriftError(
                f"{source}, class {self.name!r}, was discovered for another environment: "
                + "; ".join(drift)
                + ". Rediscover it (`scout catalog discover`, or load_or_discover).",
                drift,
            )

    def summary(self) -> dict[str, Any]:
        """Counts for people and benchmarks."""
        return {
            "class": self.name,
            "admitted": len(self.entries),
            "representatives": self.size,
            "reduction": round(self.reduction, 6),
            "uncertain": self.uncertain,
            "fingerprints": len({e.profile.fingerprint for e in self.entries if e.profile.certain}),
        }

    def to_json(self) -> dict[str, Any]:
        table: dict[str, int] = {}
        prints: list[dict[str, Any]] = []
        shapes = []
        for e in self.entries:
            fp = e.profile.fingerprint
            if fp is not None and fp not in table:
                table[fp] = len(prints)
                prints.append({"fingerprint": fp, "paths": list(e.profile.paths)})
            shapes.append(
                {
                    "rows": list(e.shape.rows),
                    "fingerprint": None if fp is None else table[fp],
                    "counts": None if e.profile.counts is None else list(e.profile.counts),
                    "note": e.profile.note,
                    "covered_by": e.covered_by,
                }
            )
        return {
            "schema": SCHEMA,
            "class": self.name,
            "environment": self.environment.to_json(),
            "representatives": list(self._reps),
            "fingerprints": prints,
            "shapes": shapes,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Catalog:
        if data.get("schema") != SCHEMA:
            raise CatalogError(f"not a shape catalog: schema {data.get('schema')!r}, want {SCHEMA}")
        try:
            env = Environment.from_json(data["environment"])
            workload = ExpertClass.from_json(env.model)
            prints = [
                (str(p["fingerprint"]), tuple(map(str, p["paths"]))) for p in data["fingerprints"]
            ]
            entries = []
            for raw, shape in zip(data["shapes"], workload.shapes(), strict=True):
                if list(raw["rows"]) != list(shape.rows):
                    raise CatalogError(
                        f"shape rows {raw['rows']} differ from admitted {shape.rows}"
                    )
                fp = raw["fingerprint"]
                fingerprint, paths = (None, ()) if fp is None else prints[int(fp)]
                counts = raw["counts"]
                profile = Profile(
                    fingerprint,
                    paths,
                    None if counts is None else tuple(int(c) for c in counts),
                    str(raw["note"]),
                )
                entries.append(Entry(shape, profile, int(raw["covered_by"])))
            catalog = cls(environment=env, entries=entries)
        except CatalogError:
            raise
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise CatalogError(f"malformed shape catalog: {type(exc).__name__}: {exc}") from exc
        if list(catalog._reps) != [int(i) for i in data["representatives"]]:
            raise CatalogError(f"class {catalog.name!r}: representatives disagree with the cover")
        return catalog


def discover(
    workload: ExpertClass,
    profiler: ShapeProfiler,
    *,
    device: str | None = None,
    environment: Environment | None = None,
    progress: Progress | None = None,
) -> Catalog:
    """Profile every admitted shape of ``workload`` and keep a minimum cover.

    ``device`` names the target device (default: this host's); ``environment`` overrides
    the whole binding (tests use it to simulate another host).
    """
    env = environment or current_environment(
        workload.describe(), profiler.describe(), device=device
    )
    shapes = workload.shapes()
    profiles = []
    for i, shape in enumerate(shapes):
        profiles.append(profiler.profile(shape))
        if progress is not None:
            progress(i + 1, len(shapes), workload.name)
    cover = minimum_cover(profiles, prefer=[s.total_rows for s in shapes])
    entries = [Entry(s, p, c) for s, p, c in zip(shapes, profiles, cover.covered_by, strict=True)]
    return Catalog(environment=env, entries=entries)
