"""The out-of-band hang observer (paper §7): name the rank behind a hang, in another process.

Each trainer publishes cheap progress into a shared-memory record (:mod:`.progress`); a
separate CPU process per rank (:mod:`.process`) watches it, and on a silence past
``Config.hang_timeout_s`` the observers decide with C3 on their own Gloo group and
escalate. Healthy training exchanges nothing. Docs: docs/observer.md.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence

from scout_core.config import Config
from scout_core.observer.address import agree_started, locate
from scout_core.observer.escalation import (
    STACK_SIGNAL,
    VERDICT_MARGIN_S,
    check_watchdog,
    install_stack_dump,
)
from scout_core.observer.fingerprint import (
    Fingerprint,
    install_collective_fingerprints,
    use_layout,
)
from scout_core.observer.handle import MAX_RESTARTS, ObserverHandle, ObserverStats
from scout_core.observer.progress import ObserverState, ProgressRecord, Publisher, Stage
from scout_core.observer.spec import ObserverSpec, layout_to_json
from scout_core.observer.stages import (
    attach_progress_hooks,
    checkpoint_stage,
    watch_dataloader,
)
from scout_core.observer.verdict import Verdict
from scout_core.records.record import Record
from scout_core.topology.mesh import MeshLayout

__all__ = [
    "MAX_RESTARTS",
    "STACK_SIGNAL",
    "VERDICT_MARGIN_S",
    "Fingerprint",
    "ObserverHandle",
    "ObserverState",
    "ObserverStats",
    "Publisher",
    "Stage",
    "Verdict",
    "attach_progress_hooks",
    "check_watchdog",
    "checkpoint_stage",
    "install_collective_fingerprints",
    "start",
    "use_layout",
    "watch_dataloader",
]

_START_SLACK_S = 30.0  # interpreter + torch import of the observer on a loaded machine


def start(
    config: Config,
    *,
    rank: int,
    world_size: int,
    ranks: Sequence[int] | None = None,
    layout: MeshLayout | None = None,
    on_verdict: Callable[[Record], None] | None = None,
    environ: Mapping[str, str] | None = None,
) -> ObserverHandle:
    """Spawn this rank's observer and wait until it has joined its peers.

    Collective: every observed rank calls it with the same arguments. With ``layout`` each
    rank is compared only with its peer group; without it ``ranks`` (default: all of
    ``world_size``) are compared all together. ``on_verdict`` runs on a trainer thread for
    every verdict record of the job. Raises :class:`~scout_core.errors.ConfigError` when the
    store cannot be placed, and one identical :class:`~scout_core.errors.ScoutError` on
    every rank when any observer (or the store) cannot start.
    """
    if layout is not None:
        observed = layout.ranks
        peers = layout.peer_group(rank).ranks
    else:
        observed = tuple(range(world_size) if ranks is None else sorted(ranks))
        peers = observed
    if rank not in observed:
        raise ValueError(f"rank {rank} is not among the observed ranks {list(observed)}")
    located = locate(config, rank=rank, lowest=observed[0], observed=len(observed), environ=environ)
    record = ProgressRecord.create()
    spec = ObserverSpec(
        rank=rank,
        peers=tuple(peers),
        groups=len(observed) // len(peers),
        world_size=world_size,
        layout=layout_to_json(layout),
        store_addr=located.addr,
        store_port=located.port,
        trainer_pid=os.getpid(),
        fds=(record.mem_fd, record.event_r, record.event_w, -1),
        hang_timeout_s=config.hang_timeout_s,
        stage_timeout_s=config.resolved_stage_timeout_s(),
        join_timeout_s=config.observer_join_timeout_s,
        on_hang=config.on_hang,
        hang_exit_code=config.hang_exit_code,
        report_dir=config.report_dir,
        run_id=config.resolved_run_id(environ),
    )
    undo = install_stack_dump(config.report_dir, rank) if config.on_hang == "dump_stacks" else None
    handle = ObserverHandle(
        spec,
        record,
        [on_verdict] if on_verdict else [],
        host=located.host,
        undo_stacks=undo,
        close_timeout_s=config.observer_join_timeout_s + 5.0,
    )
    error = handle.wait_joined(config.observer_join_timeout_s + _START_SLACK_S)
    if error is not None:
        handle.abort()
    try:
        agree_started(
            located,
            rank=rank,
            observed=len(observed),
            error=error,
            timeout_s=config.observer_join_timeout_s + 2 * _START_SLACK_S,
        )
    except BaseException:
        handle.abort()
        raise
    handle.running()
    return handle
