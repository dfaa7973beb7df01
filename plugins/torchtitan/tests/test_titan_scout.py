"""SCOUT on a real TorchTitan Trainer: dp_replicate 3 x TP 2 on CPU, Gloo, observer on.

Switched on with the override (``--override.imports scout_torchtitan.overrides.scout``),
replaying every recipe every step. One rank misbehaves through SCOUT's own injectors
(:mod:`scout_torchtitan.testing.faults`):

* a compute SDC in rank 2's blocks → ``sdc`` naming rank 2 (and the plugin and its
  adapter pass the shared conformance checks on the live trainer);
* a 200 ms straggler on rank 3 → ``straggler`` naming rank 3;
* rank 4 frozen with SIGSTOP → ``hang`` within ``hang_timeout_s`` + 2 s, naming rank 4
  only: its TP partner 5, held up in a DTensor collective the observer cannot see, is
  recorded as waiting for it (``scout_core/observer/roots.py``), never named;
* 30 clean steps → no record that names a rank or is inconclusive.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from scout_torchtitan.testing import TitanAssets, titan_argv

from scout_core.testing import BUSY_HOST, run_ranks

pytestmark = pytest.mark.distributed

HANG_S = 20.0
FREEZE_HANG_S = 4.0  # the SIGSTOP test: short, so the verdict lands well before the resume
SETTINGS: dict[str, Any] = {
    "replay_interval": 1,
    "embedding_interval": 1,
    "lm_head_interval": 1,
    "optimizer_interval": 1,
    "hang_timeout_s": HANG_S,
    **BUSY_HOST,
}


def _run(
    assets: TitanAssets,
    env: dict[str, str],
    tmp: Path,
    *,
    steps: int,
    inject: str = "",
    timeout_s: float = 400,
    settings: dict[str, Any] | None = None,
    **extra_env: str,
) -> list[dict[str, Any]]:
    settings = {**SETTINGS, **(settings or {}), "report_dir": str(tmp / "report")}
    argv = titan_argv(
        assets,
        steps=steps,
        dp_replicate=3,
        tp=2,
        dump_folder=str(tmp / "dump"),
        extra=["--override.imports", f"scout_torchtitan.overrides.scout={json.dumps(settings)}"],
    )
    results = run_ranks(
        "scout_torchtitan.testing.runner:run_trainer",
        6,
        args=(argv,),
        kwargs={"train": False, "inspect": "titan_scenarios:train_with_fault"},
        timeout_s=timeout_s,
        init_process_group=False,
        env={**env, "SCOUT_TITAN_INJECT": inject, **extra_env},
    )
    return [r["inspect"] for r in results]


def _verdicts(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [v for r in results for v in r["verdicts"]]


@pytest.mark.timeout(420)
def test_a_compute_sdc_is_named_and_the_plugin_conforms(
    titan_assets: TitanAssets, titan_env: dict[str, str], tmp_path: Path
) -> None:
    results = _run(
        titan_assets,
        titan_env,
        tmp_path,
        steps=5,
        inject="sdc:rank=2,step=2",
        SCOUT_TITAN_CONFORMANCE="1",
    )
    for rank, out in enumerate(results):
        assert out["conformance"] == {"plugin": True, "adapter": "TitanAdapter"}
        assert out["seen"]["peers"] == [rank % 2, rank % 2 + 2, rank % 2 + 4]
        assert out["step"] == 5
    sdc = [v for v in _verdicts(results) if v["failure"] == "sdc"]
    assert sdc and min(v["step"] for v in sdc) == 2
    assert all(v["status"] == "attributed" and v["outliers"] == [2] for v in sdc), sdc
    assert all(v["scope"] == "rank" and v["group"] == [0, 2, 4] for v in sdc)
    assert {v["surface"] for v in sdc} >= {"layer/layers.2/forward", "layer/layers.3/forward"}
    named = {r for v in _verdicts(results) for r in v["outliers"]}
    assert named == {2}, _verdicts(results)
    assert results[2]["fired"] and all(not out["fired"] for i, out in enumerate(results) if i != 2)


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_200ms_straggler_is_named(
    titan_assets: TitanAssets, titan_env: dict[str, str], tmp_path: Path
) -> None:
    results = _run(titan_assets, titan_env, tmp_path, steps=7, inject="straggler:rank=3,step=2")
    verdicts = _verdicts(results)
    slow = [v for v in verdicts if v["failure"] == "straggler"]
    assert slow and all(v["outliers"] == [3] and v["group"] == [1, 3, 5] for v in slow), slow
    assert all(v["failure"] == "straggler" and v["outliers"] == [3] for v in verdicts), verdicts
    assert min(v["step"] for v in slow) in (2, 3)  # two slow rounds confirm it


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_sigstopped_rank_is_a_hang_within_the_timeout(
    titan_assets: TitanAssets, titan_env: dict[str, str], tmp_path: Path
) -> None:
    freeze = tmp_path / "freeze"
    results = _run(
        titan_assets,
        titan_env,
        tmp_path,
        steps=6,
        inject="hang:rank=4,step=3",
        settings={"hang_timeout_s": FREEZE_HANG_S},
        SCOUT_TITAN_FREEZE_FILE=str(freeze),
    )
    frozen_at = float(freeze.read_text())
    for out in results:
        # one record for the job, from the frozen rank's peer group, on every rank
        (hang,) = out["verdicts"]
        latency = hang["time"] - frozen_at
        print(f"rank {out['seen']['rank']}: SIGSTOP -> hang verdict {latency:.2f} s")
        assert latency <= FREEZE_HANG_S + 2.0
        assert (hang["failure"], hang["status"], hang["step"]) == ("hang", "attributed", 3)
        assert hang["outliers"] == [4] and hang["group"] == [0, 2, 4]
        assert hang["detail"]["stages"]["4"] == "idle"
        # Its TP partner 5 is behind its own peers (1, 3), inside a DTensor collective
        # the observer cannot see (last published stage: a layer): held up, not named.
        assert hang["detail"]["waiting"] == {"5": {"for": [4], "pending": {}, "stage": "layer"}}
        named = {r for v in out["verdicts"] for r in v["outliers"]}
        assert named == {4}, out["verdicts"]
    assert results[4]["fired"] == [["hang", None, 3]]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_thirty_clean_steps_name_no_rank(
    titan_assets: TitanAssets, titan_env: dict[str, str], tmp_path: Path
) -> None:
    results = _run(titan_assets, titan_env, tmp_path, steps=30, timeout_s=560)
    for out in results:
        assert out["step"] == 30 and len(out["rounds"]) == 120
        assert all(o["ready"] for o in out["rounds"])
    bad = [v for v in _verdicts(results) if v["outliers"] or v["status"] == "inconclusive"]
    assert bad == [], bad
