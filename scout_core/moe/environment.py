"""The environment a shape catalog is valid for, and how drift is named.

Offline discovery is only valid for the environment that decides kernel selection: device,
software stack, model configuration and profiler. :class:`Environment` records it in the
catalog; :meth:`Environment.drift` lists, field by field, what differs now, so a stale
catalog is refused with a message that says exactly what changed. Versions come from
package metadata, never by importing Triton (absent, or slow to import, on CPU hosts).
Docs: docs/moe.md, "Environment binding and drift".
"""

from __future__ import annotations

import importlib.metadata
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Environment", "current_environment", "device_name", "package_version"]


def package_version(*distributions: str) -> str | None:
    """The installed version of the first of ``distributions`` present, else None."""
    for dist in distributions:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def device_name(device: str | None = None) -> str:
    """The accelerator's name, or ``"cpu"``; ``device`` overrides it (a catalog discovered
    on a CPU host for a target GPU names the target)."""
    if device:
        return device
    import torch

    if torch.cuda.is_available():
        return str(torch.cuda.get_device_name(torch.cuda.current_device()))
    return "cpu"


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


@dataclass(frozen=True, slots=True, kw_only=True)
class Environment:
    """Device, software stack, model configuration and profiler of one catalog."""

    device: str
    """The device type kernels were selected for, e.g. ``"NVIDIA A100-SXM4-80GB"``."""
    torch: str | None
    cuda: str | None
    """CUDA version torch was built with (``torch.version.cuda``); None for CPU builds."""
    triton: str | None
    """Triton version (``triton`` or ``pytorch-triton``), None when not installed."""
    model: Mapping[str, Any] = field(default_factory=dict)
    """The expert class (:meth:`ExpertClass.describe`)."""
    profiler: Mapping[str, Any] = field(default_factory=dict)
    """The profiler and its settings (:meth:`ShapeProfiler.describe`)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "torch": self.torch,
            "cuda": self.cuda,
            "triton": self.triton,
            "model": dict(self.model),
            "profiler": dict(self.profiler),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Environment:
        return cls(
            device=str(data["device"]),
            torch=data["torch"],
            cuda=data["cuda"],
            triton=data["triton"],
            model=dict(data["model"]),
            profiler=dict(data["profiler"]),
        )

    def drift(self, now: Environment) -> list[str]:
        """What differs from ``now``, one line per field (empty: no drift)."""
        lines = []
        mine, theirs = self.to_json(), now.to_json()
        for key in ("device", "torch", "cuda", "triton"):
            if mine[key] != theirs[key]:
                lines.append(
                    f"{key}: {_short(mine[key])} in the catalog, {_short(theirs[key])} now"
                )
        for section in ("model", "profiler"):
            a, b = mine[section], theirs[section]
            for key in sorted(set(a) | set(b)):
                if a.get(key) != b.get(key):
                    lines.append(
                        f"{section}.{key}: {_short(a.get(key))} in the catalog, "
                        f"{_short(b.get(key))} now"
                    )
        return lines


def current_environment(
    model: Mapping[str, Any], profiler: Mapping[str, Any], *, device: str | None = None
) -> Environment:
    """The environment this process runs in, for ``model`` profiled by ``profiler``."""
    import torch

    return Environment(
        device=device_name(device),
        torch=package_version("torch") or str(torch.__version__),
        cuda=torch.version.cuda,
        triton=package_version("triton", "pytorch-triton"),
        model=_plain(model),
        profiler=_plain(profiler),
    )


def _plain(value: Mapping[str, Any]) -> dict[str, Any]:
    # Through JSON once, so tuples become lists and a loaded catalog compares equal.
    out: dict[str, Any] = json.loads(json.dumps(dict(value), sort_keys=True))
    return out
