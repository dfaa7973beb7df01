"""``scout.enable`` says what it found when a model has no repeated layers to replay.

Auto-detection looks for a ``ModuleList`` / ``ModuleDict`` of same-class blocks. A model
without one used to turn hidden-layer replay off in silence; now every rank logs a
WARNING naming what was found (the embedding and the LM head, which are still
replayed) and the config key that names the blocks.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import pytest

from scout_core.testing import run_ranks

pytestmark = pytest.mark.distributed


def flat_model_body(recipes: list[str]) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    import scout_core as scout
    from scout_core.testing import VOCAB

    class Flat(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(VOCAB, 16)
            self.head = nn.Linear(16, VOCAB)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.embed(x))

    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING:
                seen.append(record.getMessage())

    logging.getLogger("scout_core").addHandler(Keep())
    torch.manual_seed(0)
    model = DistributedDataParallel(Flat())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cfg = scout.Config(
        report_dir=os.path.join(os.environ["SCOUT_TEST_RANK_DIR"], "report"),
        run_id="guidance",
        recipes=tuple(recipes),
        observer=False,
    )
    session = scout.enable(model, opt, config=cfg)
    x = torch.randint(0, VOCAB, (4, 8), generator=torch.Generator().manual_seed(dist.get_rank()))
    loss = model(x).float().logsumexp(-1).mean()
    loss.backward()
    opt.step()
    session.close()
    return {"warnings": seen}


def test_no_repeated_layers_is_a_warning_naming_what_was_found() -> None:
    results = run_ranks(
        flat_model_body, 3, args=(["hidden", "embedding", "lm_head"],), timeout_s=240
    )
    for r in results:
        found = [w for w in r["warnings"] if "found no repeated layers" in w]
        assert len(found) == 1, r["warnings"]
        assert "hidden-layer replay is off" in found[0]
        assert "found embedding embed, LM head head" in found[0]
        assert "'layers'" in found[0]


def test_leaving_hidden_out_of_the_recipes_is_not_warned_about() -> None:
    results = run_ranks(flat_model_body, 3, args=(["embedding", "lm_head"],), timeout_s=240)
    for r in results:
        assert not [w for w in r["warnings"] if "repeated layers" in w], r["warnings"]
