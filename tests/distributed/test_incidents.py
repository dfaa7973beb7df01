"""Incidents on real multi-rank runs (issue 10, item 4), Gloo on CPU.

The finding: under HSDP a corrupted shard on one rank gave an ``sdc`` naming that rank
in its replica group and an ``inconclusive`` ("a shard partner's shard differs") in the
partner's replica group, and nothing tied them together. Now the job writes one
incident (``scout.incident/1``) naming the rank, and every other record of the failure
is cited by it: none is left unexplained.
"""

from __future__ import annotations

from typing import Any

import pytest

from scout_core.testing.harness import run_ranks

pytestmark = pytest.mark.distributed

ENV = {"OMP_NUM_THREADS": "1"}


@pytest.mark.timeout(400)
def test_hsdp_corrupted_shard_is_one_incident_naming_the_rank() -> None:
    from incident_scenarios import run

    faults = [
        {
            "rank": 3,
            "step": 4,
            "kind": "param",
            "target": "layers.1.fc1.weight",
            "how": ["bitflip", 0, 3],
        }
    ]
    results: list[dict[str, Any]] = run_ranks(
        run, 6, args=("hsdp", faults, 6, {"recipes": ["hidden"]}), timeout_s=350, env=ENV
    )
    # Every rank merged the same incidents; rank 0 wrote them.
    ids = [[i["id"] for i in r["incidents"]] for r in results]  # ids leave out the time
    assert ids[0] and all(i == ids[0] for i in ids)
    sdc = [i for i in results[0]["on_disk"] if i["failure"] == "sdc"]
    (incident,) = sdc  # one incident (its newest revision)
    assert incident["failure"] == "sdc" and incident["outliers"] == [3]
    assert incident["scope"] == "rank" and incident["detail"]["first_step"] == 5
    cited = set(incident["detail"]["corroborating"]) | set(incident["detail"]["explained"])
    verdicts = {
        v["id"]: v
        for r in results
        for v in r["verdicts"]
        if v["failure"] == "sdc" or v["status"] == "inconclusive"  # (timing noise aside)
    }
    assert verdicts, "the corrupted shard was never reported"
    assert set(verdicts) <= cited, "a record of the failure is left unexplained"
    explained = [verdicts[i] for i in incident["detail"]["explained"]]
    assert explained and all(v["status"] == "inconclusive" for v in explained)
    assert all(v["group"] == [0, 2, 4] for v in explained)  # the partner's replica group
    assert all(3 in verdicts[i]["outliers"] for i in incident["detail"]["corroborating"])
    assert "SDC on rank 3" in incident["detail"]["summary"]
