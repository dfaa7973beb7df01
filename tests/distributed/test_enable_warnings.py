"""``scout.enable`` on a Gloo job emits no warning: every rank runs with warnings as errors.

pytest's ``filterwarnings = error`` reaches only the harness process, not the ranks it
spawns, so the rank body turns warnings into errors itself (and ``PYTHONWARNINGS`` does
the same from interpreter start). A DDP job (2 ranks) enables SCOUT with every recipe,
runs replay rounds of each kind (the host exchange at enable, readiness, payload and
result exchanges, the gate's capture) and closes the session. A deprecated collective
(``all_gather_into_tensor`` is a ``FutureWarning`` in torch 2.13) would fail a rank.
"""

from __future__ import annotations

import os
from typing import Any

from scout_core.testing import run_ranks


def warnings_as_errors_body() -> dict[str, Any]:
    import warnings

    warnings.simplefilter("error")
    # torch.distributed emits this on Gloo init on machines without a GPU (as pyproject).
    warnings.filterwarnings("ignore", ".*TypedStorage is deprecated.*", UserWarning)

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import scout_core as scout
    from scout_core.testing import TinyLM, train_step

    rank = dist.get_rank()
    torch.manual_seed(0)
    ddp = DistributedDataParallel(TinyLM())
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    cfg = scout.Config(
        report_dir=os.path.join(os.environ["SCOUT_TEST_RANK_DIR"], "report"),
        run_id="warnings",
        replay_interval=2,
        embedding_interval=2,
        lm_head_interval=2,
        optimizer_interval=2,
        observer=False,
    )
    session = scout.enable(ddp, opt, config=cfg)
    kinds: set[str] = set()
    session.on_boundary(lambda b: kinds.update(r.recipe.kind for r in b.rounds))
    for step in range(8):
        train_step(ddp, opt, step, rank)
    out = {"step": session.step, "kinds": sorted(kinds), "verdicts": len(session.verdicts)}
    session.close()
    return out


def test_enable_on_gloo_emits_no_warning() -> None:
    results = run_ranks(
        warnings_as_errors_body,
        2,
        timeout_s=300,
        env={"PYTHONWARNINGS": "error,ignore:TypedStorage is deprecated:UserWarning"},
    )
    for r in results:
        assert r["step"] == 8
        # Every recipe kind ran at least one round under warnings-as-errors.
        assert {"hidden", "embedding", "lm_head", "optimizer"} <= set(r["kinds"])
        assert r["verdicts"] == 0
