"""Replay payloads as bytes, and surface signatures over few tensors.

:func:`pack` / :func:`unpack` turn a list of tensors into one ``uint8`` buffer (host memory,
or the device for a device payload group) and back, so one broadcast carries a whole recipe's
inputs (no pickle). :func:`sign` is :func:`scout_core.decision.signature.signature_many` over a
surface's tensors with consecutive tensors of one dtype and device concatenated first: a
layer's parameter gradients are dozens of small tensors and a signature's fixed cost is per
tensor; concatenating keeps every byte and its position, so one flipped bit still changes the
result. Shapes do not enter (peers agreed on every shape in the readiness C3 before this runs).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from scout_core.decision.signature import signature_many

__all__ = ["pack", "sign", "unpack"]


def pack(tensors: Sequence[torch.Tensor], *, device: torch.device | None = None) -> torch.Tensor:
    """Tensors' bytes as one ``uint8`` buffer on ``device`` (default: host memory, for Gloo)."""
    where = torch.device("cpu") if device is None else device
    parts = [t.detach().contiguous().to(where).reshape(-1).view(torch.uint8) for t in tensors]
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8, device=where)


def unpack(buf: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Split :func:`pack`'s buffer back into tensors shaped, typed and placed like ``like``."""
    out: list[torch.Tensor] = []
    at = 0
    for t in like:
        n = t.numel() * t.element_size()
        piece = buf[at : at + n].clone().view(t.dtype).reshape(t.shape)
        out.append(piece.to(t.device))
        at += n
    return out


def sign(tensors: Iterable[torch.Tensor | None]) -> int:
    """Order-sensitive signature of a surface; ``None`` entries stay distinct markers."""
    groups: list[torch.Tensor | None] = []
    run: list[torch.Tensor] = []

    def flush() -> None:
        if run:
            flat = [t.reshape(-1) for t in run]
            groups.append(flat[0] if len(flat) == 1 else torch.cat(flat))
            run.clear()

    with torch.no_grad():
        for item in tensors:
            if item is None:
                flush()
                groups.append(None)
                continue
            t = item.detach()
            if run and (t.dtype != run[0].dtype or t.device != run[0].device):
                flush()
            run.append(t)
        flush()
    return signature_many(groups)
