"""The MoE case of ``docs/deepspeed.md`` gives one incident naming the culprit only.

MoE ep_size=2 x DP=3 under ZeRO-1 (expert-parallel pairs ``[0,1] [2,3] [4,5]``, replica
peers ``[0,2,4]`` and ``[1,3,5]``). Rank 4's expert computes with a corrupted weight.
Its replica group names rank 4 (its own parameters differ, and what they compute);
rank 5, its expert partner, received the corrupted expert output through the
all-to-all and is named by its replica group on the computed surfaces only. The
job's incident names rank 4 and explains rank 5's records: the partner is not named.

Six DeepSpeed ranks are costly on CI's two cores, so this run is marked ``slow``; the
rule it exercises (a partner that only received corrupted data is not named) is in CI
through ``tests/unit/test_incident_merge.py`` and the 3x2 HSDP run of
``tests/distributed/test_incidents.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

from scout_core.testing import run_ranks

pytestmark = pytest.mark.distributed

ENV = {"OMP_NUM_THREADS": "1"}


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_moe_coupled_fault_is_one_incident_naming_the_culprit_only() -> None:
    from ds_incident_scenarios import moe_expert_weight

    results: list[dict[str, Any]] = run_ranks(
        moe_expert_weight, 6, args=(4, 1, 4), timeout_s=170, env=ENV
    )
    verdicts = {v["id"]: v for r in results for v in r["verdicts"] if v["failure"] == "sdc"}
    named = {o for v in verdicts.values() for o in v["outliers"]}
    assert named == {4, 5}, named  # the finding: both replica groups name their member
    assert any(v["surface"].endswith("/params") for v in verdicts.values() if v["outliers"] == [4])
    ids = [[i["id"] for i in r["incidents"]] for r in results]
    assert ids[0] and all(i == ids[0] for i in ids)  # every rank merged the same
    current = {i["detail"]["key"]: i for i in results[0]["incidents"]}  # newest revisions
    (incident,) = current.values()
    assert incident["failure"] == "sdc" and incident["outliers"] == [4]
    explained = set(incident["detail"]["explained"])
    assert {i for i, v in verdicts.items() if v["outliers"] == [5]} <= explained
    cited = set(incident["detail"]["corroborating"]) | explained
    assert set(verdicts) <= cited
