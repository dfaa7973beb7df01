"""A seeded random fuzz of every way a Config is built: only ConfigError, never a crash.

Hypothesis is not a dependency of SCOUT, so this is a plain seeded generator: the
same cases on every run, printed on failure with their index. Each case builds a
config from a mapping, a JSON or TOML file, or ``SCOUT_*`` variables, with values
chosen to hurt: huge and negative integers, infinities and NaN, deep nesting,
long or binary strings, wrong types, unknown keys. The only acceptable outcomes
are a valid :class:`Config` or a :class:`ConfigError` (unknown ``SCOUT_*``
variables: a logged warning).
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
from pathlib import Path
from typing import Any

import pytest

from scout_core.config import Config
from scout_core.errors import ConfigError

KEYS = [f.name for f in dataclasses.fields(Config)]
CASES = 600


def _nested(rng: random.Random, depth: int) -> Any:
    value: Any = rng.choice([1, "x", 1.5, None])
    for _ in range(depth):
        value = [value] if rng.random() < 0.5 else {"k": value}
    return value


def _value(rng: random.Random) -> Any:
    kind = rng.randrange(14)
    if kind == 0:
        return rng.choice([0, 1, -1, 2, 20, 65535, 65536])
    if kind == 1:
        return rng.choice([10**18, 10**400, -(10**400), 2**63, 1 << 26, 10**9])
    if kind == 2:
        return rng.choice([0.0, -0.0, 0.01, 1e-300, 1e300, 5.0, 60.0, 1e9])
    if kind == 3:
        return rng.choice([math.inf, -math.inf, math.nan])
    if kind == 4:
        return rng.choice([True, False, None])
    if kind == 5:
        return rng.choice(["", " ", "hidden", "report", "x" * 10_000, "a\x00b", "\udcff", ".."])
    if kind == 6:
        return [rng.choice(["hidden", "embedding", "router", 1, None]) for _ in range(3)]
    if kind == 7:
        return [rng.choice([0.1, 1.0, 10.0, -1.0, 1e9, math.nan]) for _ in range(rng.randrange(12))]
    if kind == 8:
        return _nested(rng, rng.choice([5, 50, 900]))
    if kind == 9:
        return {"nested": rng.randrange(10)}
    if kind == 10:
        return rng.choice(["model.layers", "model..layers", "a b", "layers"])
    if kind == 11:
        return rng.choice(["report", "dump_stacks", "terminate", "abort"])
    if kind == 12:
        return rng.choice([1, 86, 16, 93, 255, 256])
    return object()


def _mapping(rng: random.Random) -> dict[str, Any]:
    keys = rng.sample(KEYS, rng.randrange(1, 5))
    if rng.random() < 0.2:
        keys.append(rng.choice(["kapa", "replay_intervall", "", "x" * 300]))
    return {k: _value(rng) for k in keys}


def _env_text(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def _one(rng: random.Random, tmp: Path, index: int) -> None:
    how = rng.randrange(4)
    if how == 0:
        Config.from_mapping(_mapping(rng), source=f"case {index}")
    elif how == 1:
        path = tmp / f"case{index}.json"
        try:
            text = json.dumps(_mapping(rng), allow_nan=True)
        except (TypeError, ValueError, RecursionError):
            text = "{" * rng.choice([10, 100_000])
        path.write_text(text, encoding="utf-8", errors="surrogateescape")
        Config.from_file(path, environ={})
    elif how == 2:
        path = tmp / f"case{index}.toml"
        lines = []
        for key, value in _mapping(rng).items():
            if isinstance(value, bool):
                rendered = "true" if value else "false"
            elif isinstance(value, int | float) and not isinstance(value, bool):
                rendered = repr(value).replace("inf", "inf").replace("nan", "nan")
            else:
                rendered = json.dumps(str(value))[:20_000]
            lines.append(f"{key or 'k'} = {rendered}")
        path.write_text("\n".join(lines), encoding="utf-8", errors="surrogateescape")
        Config.from_file(path, environ={})
    else:
        environ = {
            f"SCOUT_{k.upper()}": _env_text(v).replace("\x00", "") for k, v in _mapping(rng).items()
        }
        if rng.random() < 0.3:
            environ[rng.choice(["SCOUT_KEY", "SCOUT_MONITOR", "SCOUT_NAME", "SCOUT_X"])] = "1"
        Config.from_env(environ=environ)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_config_fuzz_gives_config_errors_or_configs_only(seed: int, tmp_path: Path) -> None:
    rng = random.Random(seed)
    outcomes = {"config": 0, "error": 0}
    for index in range(CASES):
        try:
            _one(rng, tmp_path, index)
            outcomes["config"] += 1
        except ConfigError:
            outcomes["error"] += 1
        except BaseException as exc:  # the point: nothing else may escape
            raise AssertionError(f"seed {seed} case {index}: {type(exc).__name__}: {exc}") from exc
    # The generator must exercise both outcomes, or it tests nothing.
    assert outcomes["config"] >= 10 and outcomes["error"] > 100, outcomes
