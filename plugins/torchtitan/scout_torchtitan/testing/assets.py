"""A tiny tokenizer and text dataset for TorchTitan on CPU, generated deterministically.

The torchtitan wheel ships neither ``tests/assets/tokenizer`` nor the ``c4_test``
data its debug configs point at, so tests and the CPU example write their own:

* a byte-level tokenizer (``tokenizer.json`` + ``tokenizer_config.json``) that
  TorchTitan's ``HuggingFaceTokenizer`` loads unchanged: the 256 byte symbols with
  no merges (every byte is a token), plus ``<|begin_of_text|>`` (id 256) and
  ``<|end_of_text|>`` (id 257) as BOS/EOS;
* a JSON-lines ``train.jsonl`` of ``{"text": ...}`` documents drawn from a fixed
  word list by a seeded ``random.Random``, which ``datasets.load_dataset(dir)``
  reads as the ``train`` split, like ``c4_test``.

Same arguments, same bytes: two runs train on identical data. Point TorchTitan at
them with ``--hf_assets_path <tokenizer dir> --dataloader.dataset c4_test
--dataloader.dataset_path <data dir>``.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["TitanAssets", "VOCAB_SIZE", "write_assets", "write_dataset", "write_tokenizer"]

BOS = "<|begin_of_text|>"
EOS = "<|end_of_text|>"
VOCAB_SIZE = 258
"""Token ids the tokenizer can produce (256 bytes + BOS + EOS)."""

_WORDS = tuple(
    " ".join(
        (
            "the a of and to in is was for on that with as by at from it this be are",
            "model layer rank step data replica shard tensor pipeline expert loss",
            "gradient optimizer checkpoint replay verdict peer group consensus fault",
            "silent corruption straggler hang training token sequence batch attention",
        )
    ).split(" ")
)


@dataclass(frozen=True)
class TitanAssets:
    """Where the generated assets are."""

    tokenizer_dir: Path
    """Pass as ``--hf_assets_path``."""
    dataset_dir: Path
    """Pass as ``--dataloader.dataset_path`` (with ``--dataloader.dataset c4_test``)."""

    def cli_args(self) -> list[str]:
        """The TorchTitan flags that point a config at these assets."""
        return [
            "--hf_assets_path",
            str(self.tokenizer_dir),
            "--dataloader.dataset",
            "c4_test",
            "--dataloader.dataset_path",
            str(self.dataset_dir),
        ]


def _byte_alphabet() -> list[str]:
    """GPT-2's printable stand-in for each byte, in byte order (what ByteLevel emits)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    keep += list(range(ord("®"), ord("ÿ") + 1))
    chars = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def write_tokenizer(directory: str | Path) -> Path:
    """Write the byte-level tokenizer into ``directory`` (created); return it."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    vocab = {ch: i for i, ch in enumerate(_byte_alphabet())}
    special = [
        {
            "id": 256 + i,
            "content": tok,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, tok in enumerate((BOS, EOS))
    ]
    spec: dict[str, Any] = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": special,
        "normalizer": None,
        "pre_tokenizer": {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": True,
            "use_regex": False,
        },
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "vocab": vocab,
            "merges": [],
        },
    }
    (out / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False, sort_keys=True))
    config = {"bos_token": BOS, "eos_token": EOS, "add_bos_token": True, "add_eos_token": True}
    (out / "tokenizer_config.json").write_text(json.dumps(config, sort_keys=True))
    return out


def write_dataset(directory: str | Path, *, documents: int = 400, seed: int = 0) -> Path:
    """Write ``documents`` seeded pseudo-English documents as ``train.jsonl``; return the dir."""
    if documents < 1:
        raise ValueError(f"documents must be >= 1, got {documents}")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    lines = []
    for _ in range(documents):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(8, 40))]
        lines.append(json.dumps({"text": " ".join(words) + "."}))
    (out / "train.jsonl").write_text("\n".join(lines) + "\n")
    return out


def write_assets(root: str | Path, *, documents: int = 400, seed: int = 0) -> TitanAssets:
    """Tokenizer under ``root/tokenizer``, dataset under ``root/c4_test``."""
    base = Path(root)
    return TitanAssets(
        tokenizer_dir=write_tokenizer(base / "tokenizer"),
        dataset_dir=write_dataset(base / "c4_test", documents=documents, seed=seed),
    )
