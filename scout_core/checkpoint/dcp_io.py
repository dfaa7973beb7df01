"""DCP storage for one rank's shard, with its metadata as JSON: nothing is unpickled.

DCP pickles its metadata (which tensor lives at which byte range of which file). SCOUT
keeps DCP's writer (the standard ``.metadata`` stays for other tools), also writes the
metadata as ``.metadata.json`` and reads only that; DCP reads tensor data with
``torch.load(weights_only=True)``. Gate checkpoints put only tensors into DCP, so the JSON
has one kind of entry: a tensor's dtype, global size and chunks, and where their bytes are.
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter, _StorageInfo
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)

from scout_core.checkpoint.validate import dtype_named
from scout_core.errors import CheckpointError

__all__ = [
    "JSON_METADATA",
    "JsonMetadataReader",
    "JsonMetadataWriter",
    "metadata_to_json",
    "metadata_from_json",
    "fsync_dir",
    "per_rank_dcp",
    "read_json",
    "write_json",
]

JSON_METADATA = ".metadata.json"


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically: temp file, fsync, rename, fsync the directory."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a value a checkpoint file may hold")


def read_json(path: Path, what: str) -> Any:
    """Parse a JSON file; :class:`CheckpointError` when it is missing, corrupt, truncated or
    holds what no SCOUT writer writes (``NaN``, nesting that exhausts the parser, huge ints)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"), parse_constant=_no_constant)
    except FileNotFoundError:
        raise CheckpointError(f"{what} {path} is missing") from None
    except RecursionError:
        raise CheckpointError(f"{what} {path} is nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise CheckpointError(f"{what} {path} is corrupt or truncated: {exc}") from None
    except OSError as exc:
        raise CheckpointError(f"{what} {path} cannot be read: {exc.strerror or exc}") from None


@contextlib.contextmanager
def per_rank_dcp() -> Iterator[None]:
    """Mute DCP's ``no_dist=True`` single-process warning: one checkpoint per rank is meant."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=r"torch\.distributed is .*assuming the intent", category=UserWarning
        )
        yield


def metadata_to_json(md: Metadata) -> dict[str, Any]:
    """DCP ``Metadata`` (tensor entries only) as a JSON-safe dict."""
    tensors = {}
    for fqn, item in md.state_dict_metadata.items():
        if not isinstance(item, TensorStorageMetadata):
            raise CheckpointError(f"gate checkpoints store tensors only; {fqn!r} is not one")
        tensors[fqn] = {
            "dtype": str(item.properties.dtype).removeprefix("torch."),
            "size": list(item.size),
            "chunks": [{"offsets": list(c.offsets), "sizes": list(c.sizes)} for c in item.chunks],
        }
    storage = []
    for index, info in (md.storage_data or {}).items():
        storage.append(
            {
                "fqn": index.fqn,
                "offset": None if index.offset is None else list(index.offset),
                "index": index.index,
                "path": info.relative_path,
                "file_offset": info.offset,
                "length": info.length,
                "transforms": None
                if info.transform_descriptors is None
                else list(info.transform_descriptors),
            }
        )
    return {"version": md.version, "tensors": tensors, "storage": storage}


def metadata_from_json(data: Any, where: Path) -> Metadata:
    """Inverse of :func:`metadata_to_json`; :class:`CheckpointError` if malformed."""
    try:
        sd_md: dict[str, Any] = {
            fqn: TensorStorageMetadata(
                properties=TensorProperties(dtype=dtype_named(t["dtype"])),
                size=torch.Size(t["size"]),
                chunks=[
                    ChunkStorageMetadata(
                        offsets=torch.Size(c["offsets"]), sizes=torch.Size(c["sizes"])
                    )
                    for c in t["chunks"]
                ],
            )
            for fqn, t in data["tensors"].items()
        }
        storage = {
            MetadataIndex(
                fqn=s["fqn"],
                offset=None if s["offset"] is None else torch.Size(s["offset"]),
                index=s["index"],
            ): _StorageInfo(
                relative_path=str(s["path"]),
                offset=int(s["file_offset"]),
                length=int(s["length"]),
                transform_descriptors=s["transforms"],
            )
            for s in data["storage"]
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"DCP metadata {where} is malformed: {exc!r}") from None
    return Metadata(
        state_dict_metadata=sd_md,
        storage_data=storage,
        storage_meta=StorageMeta(),
        version=data.get("version"),
    )


class JsonMetadataWriter(FileSystemWriter):
    """DCP's filesystem writer, plus a JSON copy of the metadata SCOUT reads back."""

    def finish(self, metadata: Metadata, results: Any) -> None:
        super().finish(metadata, results)  # fills metadata.storage_data
        write_json(Path(self.path) / JSON_METADATA, metadata_to_json(metadata))


class JsonMetadataReader(FileSystemReader):
    """DCP's filesystem reader that reads the JSON metadata and never unpickles."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = Path(self.path) / JSON_METADATA
        md = metadata_from_json(read_json(path, "DCP metadata"), path)
        if md.storage_meta is not None:
            md.storage_meta.load_id = self.load_id
        return md
