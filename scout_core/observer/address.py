"""Where the observers' store is, told through the training job's own store, and agreed.

Contract: the lowest observed rank starts the store host and publishes its address, or why
it could not start, in the training job's own c10d store (via the private
``distributed_c10d._get_default_store``); every other rank reads it there. Without a process
group the port must be configured. Docs: docs/observer.md, "Store address rule".
"""

from __future__ import annotations

import itertools
import os
import socket
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import torch.distributed as dist

# Public as torch.distributed.PrefixStore, but torch's stubs declare it only here.
from torch._C._distributed_c10d import PrefixStore

from scout_core.config import Config
from scout_core.errors import ConfigError, ScoutError
from scout_core.observer.store_host import StoreHost

__all__ = ["Located", "agree_started", "job_store", "locate"]

_starts = itertools.count()


def job_store() -> Any | None:
    """The training job's c10d store (None without an initialised process group)."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    try:
        store = dist.distributed_c10d._get_default_store()
    except (RuntimeError, ValueError, AttributeError):
        return None
    return PrefixStore("scout/observer", store)


def _reachable_address(master: str | None) -> str:
    """This host's address on the route to ``master`` (loopback stays loopback)."""
    if master:
        try:
            family = socket.getaddrinfo(master, None)[0][0]
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.connect((master, 1))  # UDP: picks the route, sends nothing
                found: str = s.getsockname()[0]
                return found
        except OSError:
            pass
    return socket.gethostname()


class Located:
    """The store address every rank agreed on, and the host process on the lowest rank."""

    def __init__(self, addr: str, port: int, host: StoreHost | None, key: str | None) -> None:
        self.addr = addr
        self.port = port
        self.host = host
        self.key = key
        """The job-store key prefix of this start (None without a job store)."""


def locate(
    config: Config,
    *,
    rank: int,
    lowest: int,
    observed: int,
    environ: Mapping[str, str] | None = None,
) -> Located:
    """Start the store host (on ``lowest``) and learn its address (every rank).

    Collective over the observed ranks. Raises :class:`ConfigError` when no address can be
    derived, and the same :class:`ScoutError` on every rank when the host cannot start."""
    env = os.environ if environ is None else environ
    store = job_store()
    fixed = config.observer_port
    if store is None and fixed is None:
        raise ConfigError(
            "observer_port is not set and torch.distributed is not initialised, so there "
            "is no job store to publish an OS-chosen port through: set Config.observer_port "
            "(and observer_addr) or call scout after init_process_group"
        )
    restart = env.get("TORCHELASTIC_RESTART_COUNT", "0")
    key = f"{config.resolved_run_id(environ)}/{restart}/{next(_starts)}"
    wait = timedelta(seconds=config.observer_join_timeout_s + 60.0)
    host: StoreHost | None = None
    if rank == lowest:
        addr = config.observer_addr or _reachable_address(env.get("MASTER_ADDR"))
        try:
            host = StoreHost.start(addr, fixed or 0, observed=observed)
            where = f"ok {addr} {host.port}"
        except ScoutError as exc:
            where = f"error {exc}"
        if store is not None:
            store.set(f"{key}/store", where)
    elif store is not None:
        store.wait([f"{key}/store"], wait)
        where = store.get(f"{key}/store").decode()
    else:
        addr = config.observer_addr or env.get("MASTER_ADDR") or ""
        if not addr:
            raise ConfigError(
                "observer_addr is not set and there is no MASTER_ADDR to derive it from: "
                "set Config.observer_addr"
            )
        where = f"ok {addr} {fixed}"
    if where.startswith("error "):
        raise ScoutError(f"the hang observer cannot start: {where.removeprefix('error ')}")
    _, addr, port = where.split(" ")
    return Located(addr, int(port), host, None if store is None else key)


def agree_started(
    located: Located, *, rank: int, observed: int, error: str | None, timeout_s: float
) -> None:
    """Every observed rank says whether its observer started; all raise alike if one did not.

    Collective. Without a job store only this rank's own failure is raised."""
    store = job_store()
    if store is None or located.key is None:
        if error is not None:
            raise ScoutError(f"the hang observer cannot start: rank {rank}: {error}")
        return
    key = located.key
    if error is not None:
        store.compare_set(f"{key}/failure", "", f"rank {rank}: {error}")
    if store.add(f"{key}/arrived", 1) >= observed:
        store.set(f"{key}/all", "1")
    try:
        store.wait([f"{key}/all"], timedelta(seconds=timeout_s))
    except (RuntimeError, dist.DistStoreError) as exc:
        raise ScoutError(
            f"the hang observer cannot start: not every rank reported its observer within "
            f"{timeout_s:g} s ({exc})"
        ) from None
    if store.check([f"{key}/failure"]):
        first = store.get(f"{key}/failure").decode()
        raise ScoutError(f"the hang observer cannot start: {first}")
