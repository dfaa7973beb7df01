"""``scout.enable`` starts the hang observer and hands its verdicts to the session.

A DDP job (4 ranks, Gloo) trains a tiny model with SCOUT enabled and the observer on.
One rank stalls before a step while its peers wait inside DDP's gradient all-reduce
(a C++ collective SCOUT's patch cannot see: the layer and optimizer progress hooks
still show the lagging rank). The observers must name exactly that rank, the
session must receive the verdict, and closing the session must stop the observer.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

import pytest

HANG_S = 2.0
CULPRIT = 2


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2] != "Z"


def stalled_rank_body(report_dir: str) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    import scout_core as scout

    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Embedding(16, 8), nn.ModuleList([nn.Linear(8, 8) for _ in range(3)]), nn.Linear(8, 16)
    )

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb, self.blocks, self.head = model[0], model[1], model[2]

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.emb(x)
            for b in self.blocks:
                h = torch.tanh(b(h))
            out: torch.Tensor = self.head(h)
            return out

    train = dist.new_group(backend="gloo", timeout=timedelta(seconds=30))
    net = DistributedDataParallel(Net(), process_group=train)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    cfg = scout.Config(
        report_dir=report_dir,
        run_id="enable-observer",
        hang_timeout_s=HANG_S,
        observer_join_timeout_s=30.0,
        replay_interval=1000,
        recipes=("hidden",),
    )
    seen: list[Any] = []
    session = scout.enable(net, opt, config=cfg, callback=seen.append)
    pid = session.observer.pid
    gen = torch.Generator().manual_seed(rank)
    stalled_at = None
    for step in range(6):
        if step == 3 and rank == CULPRIT:
            stalled_at = time.monotonic()
            time.sleep(HANG_S + 3.0)  # a CPU-side stall: this rank publishes nothing
        x = torch.randint(0, 16, (4, 5), generator=gen)
        loss = net(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    deadline = time.monotonic() + 10
    while not seen and time.monotonic() < deadline:
        time.sleep(0.05)
    session.close()
    time.sleep(0.5)
    return {
        "verdicts": [
            {"failure": r.failure.value if r.failure else None, "outliers": list(r.outliers)}
            for r in seen
        ],
        "observer_alive_after_close": _alive(pid),
        "stalled_at": stalled_at,
    }


@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_enable_starts_the_observer_and_a_stall_names_the_rank(tmp_path: Any) -> None:
    from scout_core.records.evidence import load_report
    from scout_core.testing.harness import run_ranks

    # Three ranks: the stalled one against a strict majority of two (no layout needed).
    results = run_ranks(stalled_rank_body, 3, args=(str(tmp_path),), timeout_s=180)
    for rank, res in enumerate(results):
        assert {"failure": "hang", "outliers": [CULPRIT]} in res["verdicts"], (rank, res)
        assert not res["observer_alive_after_close"], rank
    hangs = load_report(tmp_path).verdicts("hang")
    assert hangs and all(list(r.outliers) == [CULPRIT] for r in hangs)
    assert not [r for r in load_report(tmp_path).records if r.failure and r.failure.value != "hang"]
