"""One deterministic Nth of the ``slow`` tests (``scripts/test.sh`` loads it with ``-p``).

Run as ``python -m pytest -p scripts.slow_shard --slow-shard K/N ...`` from the
repository root. A test marked ``slow`` stays selected only when its shard is ``K``:
the shard of a test is a hash of its node id (blake2b, the same on every machine and
run; a ``-seedNNN`` part of the id, which changes from day to day, is left out), so
shards ``1/N`` to ``N/N`` together run every slow test exactly once. Tests not marked
``slow`` are left to ``-m``: CI runs ``-m "not gpu"`` with today's shard, so every
slow test runs in CI within N days; ``bash scripts/test.sh --slow-shard K/N`` runs one
shard of the slow set alone. A run prints its shard and the slow tests it kept.

It imports only pytest and the standard library, and does nothing without
``--slow-shard``.
"""

from __future__ import annotations

import hashlib
import re

import pytest

_SEED = re.compile(r"-seed\d+")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("scout-slow-shard", "a shard of the slow tests (scripts/slow_shard.py)")
    group.addoption(
        "--slow-shard",
        default=None,
        metavar="K/N",
        help="keep only the slow tests of shard K of N (1 <= K <= N)",
    )


def parse(text: str) -> tuple[int, int]:
    """``"K/N"`` as ``(K, N)``; a :class:`pytest.UsageError` naming the value otherwise."""
    match = re.fullmatch(r"(\d+)/(\d+)", text.strip())
    if match is None:
        raise pytest.UsageError(f"--slow-shard takes K/N (e.g. 3/8), got {text!r}")
    k, n = int(match[1]), int(match[2])
    if not 1 <= k <= n:
        raise pytest.UsageError(f"--slow-shard K/N needs 1 <= K <= N, got {text!r}")
    return k, n


def shard_of(nodeid: str, n: int) -> int:
    """The shard (1..n) a test's node id falls in (module doc)."""
    digest = hashlib.blake2b(_SEED.sub("", nodeid).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % n + 1


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    option = config.getoption("slow_shard")
    if option is None:
        return
    k, n = parse(option)
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        slow = item.get_closest_marker("slow") is not None
        (dropped if slow and shard_of(item.nodeid, n) != k else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
    slow_kept = sum(item.get_closest_marker("slow") is not None for item in kept)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"slow shard {k}/{n}: {slow_kept} slow test(s) kept")
