"""Wire the hang observer into a session: what ``scout.enable`` does when ``observer`` is on.

It checks the watchdog rule, starts this rank's observer with the adapter's mesh layout
(each rank is compared with its equivalent ranks only), publishes progress at the adapter's
layers and optimizer steps, takes the step from the replay driver's boundary events (the
job's one step clock), fingerprints collectives, and hands every verdict to the session's
verdict path. The session's ``close`` undoes all of it, in reverse order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from scout_core.observer import (
    ObserverHandle,
    attach_progress_hooks,
    check_watchdog,
    install_collective_fingerprints,
    start,
    use_layout,
)

if TYPE_CHECKING:
    from scout_core.config import Config
    from scout_core.integration.adapter import FrameworkAdapter
    from scout_core.records.record import Record
    from scout_core.replay.boundary import Boundary

__all__ = ["attach_observer"]


def attach_observer(
    adapter: FrameworkAdapter,
    config: Config,
    *,
    on_verdict: Callable[[Record], None],
    add_closer: Callable[[Callable[[], None]], None],
    on_boundary: Callable[[Callable[[Boundary], None]], Callable[[], None]],
) -> ObserverHandle:
    """Start and hook up this rank's observer; register its undo steps with ``add_closer``.

    Collective over the job: every rank calls it at the same point. Raises
    :class:`~scout_core.errors.ConfigError`, before starting anything, when the watchdog
    rule fails or the observers' store address cannot be derived.
    """
    check_watchdog(config)
    layout = adapter.layout()
    rank = adapter.rank()
    handle = start(
        config, rank=rank, world_size=layout.world_size, layout=layout, on_verdict=on_verdict
    )
    add_closer(handle.close)
    add_closer(use_layout(layout, rank))
    add_closer(install_collective_fingerprints(handle.publisher))
    layers = [ref.module for ref in adapter.repeated_layers()]
    optimizers = list(adapter.optimizers())
    add_closer(attach_progress_hooks(handle.publisher, layers, optimizers, advance_step=False))
    publisher = handle.publisher
    on_boundary(lambda boundary: publisher.set_step(boundary.step + 1))
    return handle
