"""The framework releases a plugin supports, checked when SCOUT is switched on.

Plugins read framework internals that are not promised stable (DeepSpeed's
``engine._config._param_dict``, Megatron's parallel state), so activation refuses a release
outside the tested range, naming both versions, rather than fail later inside a replay.
Contract: ``supported = ">=0.19,<0.20"`` compares leading release numbers (``0.19.8rc1`` is
``0.19.8``; missing ones are zero, so it admits every ``0.19.x``), without ``packaging``.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata

from scout_core.errors import UnsupportedSetupError

__all__ = ["VersionRange", "check_version", "installed_version", "parse_version"]

_OPS: dict[str, Callable[[tuple[int, ...], tuple[int, ...]], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
    ">": operator.gt,
    "<": operator.lt,
}
_CLAUSE = re.compile(r"^\s*(>=|<=|==|!=|>|<)\s*(\d+(?:\.\d+)*)\s*$")


def parse_version(text: str) -> tuple[int, ...]:
    """The leading release numbers of ``text`` (``"0.19.8+cafe"`` → ``(0, 19, 8)``)."""
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)", text)
    if match is None:
        raise UnsupportedSetupError(f"cannot read the version {text!r}")
    return tuple(int(part) for part in match.group(1).split("."))


def _pad(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    n = max(len(a), len(b))
    return a + (0,) * (n - len(a)), b + (0,) * (n - len(b))


@dataclass(frozen=True)
class VersionRange:
    """A conjunction of comparisons such as ``">=0.16,<0.17"``."""

    spec: str
    clauses: tuple[tuple[str, tuple[int, ...]], ...]

    @classmethod
    def parse(cls, spec: str) -> VersionRange:
        """Parse ``spec``; :class:`ValueError` names a clause that is not ``<op><version>``."""
        clauses = []
        for part in spec.split(","):
            match = _CLAUSE.match(part)
            if match is None:
                raise ValueError(
                    f"version range {spec!r}: clause {part.strip()!r} is not one of "
                    f"{', '.join(_OPS)} followed by a release number"
                )
            clauses.append((match.group(1), parse_version(match.group(2))))
        return cls(spec, tuple(clauses))

    def contains(self, version: str) -> bool:
        """Whether ``version`` satisfies every clause."""
        got = parse_version(version)
        return all(_OPS[op](*_pad(got, want)) for op, want in self.clauses)


def installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution``, or None when it is not installed."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def check_version(
    distribution: str, supported: str, *, plugin: str, version: str | None = None
) -> str:
    """The checked version of ``distribution`` (default: installed); raises
    :class:`UnsupportedSetupError` unless it is in ``supported``."""
    found = installed_version(distribution) if version is None else version
    if found is None:
        raise UnsupportedSetupError(
            f"{plugin} needs {distribution} {supported}, which is not installed "
            f"(pip install '{distribution}{supported}')"
        )
    if not VersionRange.parse(supported).contains(found):
        raise UnsupportedSetupError(
            f"{plugin} supports {distribution} {supported}; {distribution} {found} is installed. "
            f"Install a supported release (pip install '{distribution}{supported}') or a "
            f"{plugin} that declares this one."
        )
    return found
