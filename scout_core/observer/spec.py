"""What a trainer tells its observer, and where the observers' store lives.

The observer is a fresh interpreter, so everything it needs travels as one JSON
object on its command line (:class:`ObserverSpec`); the descriptors it inherits
(the progress record, the progress event, the control pipe) are named there by
number. :func:`resolve_store` is the one place the store address rule lives.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass

from scout_core.config import Config
from scout_core.errors import ConfigError

__all__ = ["ObserverSpec", "resolve_store"]


def resolve_store(config: Config, environ: Mapping[str, str] | None = None) -> tuple[str, int]:
    """The observers' store address: config, else ``MASTER_ADDR``:``MASTER_PORT + 1``."""
    env = os.environ if environ is None else environ
    addr = config.observer_addr or env.get("MASTER_ADDR")
    port = config.observer_port
    if port is None and env.get("MASTER_PORT", "").isdigit():
        port = int(env["MASTER_PORT"]) + 1
    if addr is None or port is None:
        missing = "observer_addr" if addr is None else "observer_port"
        raise ConfigError(
            f"{missing} is not set and there is no torchrun environment to derive it from "
            "(MASTER_ADDR, MASTER_PORT + 1): set Config.observer_addr and observer_port"
        )
    if not 0 < port < 65536:
        raise ConfigError(f"observer_port {port} (MASTER_PORT + 1) is not a valid TCP port")
    return addr, port


@dataclass(frozen=True)
class ObserverSpec:
    """Everything an observer is told by its trainer, as JSON on its command line."""

    rank: int
    ranks: tuple[int, ...]
    world_size: int
    store_addr: str
    store_port: int
    trainer_pid: int
    fds: tuple[int, int, int, int]  # memory, event read, event write, control write
    hang_timeout_s: float
    stage_timeout_s: float
    join_timeout_s: float
    on_hang: str
    hang_exit_code: int
    report_dir: str
    run_id: str

    def to_json(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def from_json(cls, text: str) -> ObserverSpec:
        data = json.loads(text)
        data["ranks"] = tuple(data["ranks"])
        data["fds"] = tuple(data["fds"])
        return cls(**data)
