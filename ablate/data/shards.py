"""Token shards on disk: what `ablate prepare` writes, what a shard-folder `data.source` reads, and the
format of the workspace token cache.

A shard folder (written by `ablate.data.preprocess`):

    <folder>/
      train/000000.bin  train/000000.json    (a long split may have 000001.bin, ...: read in name order)
      val/000000.bin    val/000000.json
      tokenizer.json                         (bpe and hf: the tokenizer, to decode samples)
      manifest.json                          (`ablate prepare`: source fingerprint, tokenizer, counts)

Each `.bin` is a raw little-endian array of token ids and nothing else: uint16 when the vocabulary has at
most 65536 ids, else uint32. Every document is followed by the end-of-document id. Its sidecar `.json`:

    {"tokenizer": {"name": "bpe", "vocab_size": 4096}, "vocab_size": 4096, "eos_id": 0,
     "count": 1234567, "dtype": "uint16", "corpus": {<fingerprint of the text it was made from>}}

`count` is the number of tokens: the `.bin` holds exactly `count * itemsize` bytes, or it is corrupt;
`documents` (shards written since prepare resumes) the documents it holds: shards end between documents.
All shards of a folder agree on tokenizer, vocab_size, eos_id and dtype. A split with one shard is
memory-mapped; several are concatenated in memory.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ablate.core.errors import UserError

SPLITS = ("train", "val")
_DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
_SHARED_FIELDS = ("tokenizer", "vocab_size", "eos_id", "dtype")


def dtype_for(vocab_size: int) -> np.dtype:
    """uint16 when every id fits in it, else uint32."""
    if vocab_size <= 2**16:
        return _DTYPES["uint16"]
    if vocab_size <= 2**32:
        return _DTYPES["uint32"]
    raise ValueError(f"vocab_size {vocab_size} does not fit in uint32")


def dtype_name(dtype: np.dtype) -> str:
    return {v: k for k, v in _DTYPES.items()}[np.dtype(dtype)]


def is_shard_folder(path: Path) -> bool:
    train = Path(path) / "train"
    return train.is_dir() and any(train.glob("*.bin"))


def _read_header(sidecar: Path, key: str) -> dict[str, Any]:
    try:
        header = json.loads(sidecar.read_text())
    except FileNotFoundError:
        raise UserError(
            f"{key}: shard header {sidecar} is missing; every .bin needs its .json "
            "sidecar (re-run `ablate prepare`)"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(
            f"{key}: shard header {sidecar} is unreadable ({e}); re-run `ablate prepare`"
        ) from None
    missing = [k for k in ("tokenizer", "vocab_size", "eos_id", "count", "dtype") if k not in header]
    if not isinstance(header, dict) or missing:
        raise UserError(
            f"{key}: shard header {sidecar} lacks {', '.join(missing) or 'fields'}; re-run `ablate prepare`"
        )
    if header["dtype"] not in _DTYPES:
        raise UserError(
            f"{key}: shard header {sidecar} has dtype {header['dtype']!r}; allowed: {', '.join(_DTYPES)}"
        )
    ints = ("vocab_size", "eos_id", "count")
    if any(isinstance(header[k], bool) or not isinstance(header[k], int) or header[k] < 0 for k in ints):
        raise UserError(
            f"{key}: shard header {sidecar}: vocab_size, eos_id and count must be non-negative integers"
        )
    if header["vocab_size"] > np.iinfo(_DTYPES[header["dtype"]]).max + 1:
        raise UserError(
            f"{key}: shard header {sidecar}: vocab_size {header['vocab_size']} does not fit "
            f"in {header['dtype']}"
        )
    return header


def read_split(folder: Path, split: str, key: str = "data.source") -> tuple[np.ndarray, dict[str, Any]]:
    """The split's tokens (memory-mapped when there is one shard) and the shared header fields."""
    bins = sorted((Path(folder) / split).glob("*.bin"))
    if not bins:
        raise UserError(
            f"{key}: shard folder {folder} has no {split}/*.bin shards; it needs train/ and "
            "val/ (see `ablate prepare`)"
        )
    arrays, shared = [], None
    for path in bins:
        header = _read_header(path.with_suffix(".json"), key)
        dtype = _DTYPES[header["dtype"]]
        try:
            size = path.stat().st_size
        except OSError as e:
            raise UserError(f"{key}: cannot read shard {path} ({e.strerror})") from None
        if size != header["count"] * dtype.itemsize:
            raise UserError(
                f"{key}: shard {path} has {size} bytes but its header says {header['count']} "
                f"{header['dtype']} tokens ({header['count'] * dtype.itemsize} bytes); it is "
                "truncated or corrupt: re-run `ablate prepare`"
            )
        this = {k: header[k] for k in _SHARED_FIELDS}
        if shared is not None and this != shared:
            raise UserError(
                f"{key}: shard {path} disagrees with the others of {folder} ({this} vs "
                f"{shared}); one folder holds one tokenisation"
            )
        shared = this
        if header["count"]:
            try:
                arrays.append(np.memmap(path, dtype=dtype, mode="r", shape=(header["count"],)))
            except OSError as e:
                raise UserError(f"{key}: cannot read shard {path} ({e.strerror})") from None
    tokens = arrays[0] if len(arrays) == 1 else np.concatenate(arrays) if arrays else None
    if tokens is None:
        raise UserError(f"{key}: the {split} shards of {folder} hold no tokens; give a larger corpus")
    return tokens, {**shared, "corpus": header.get("corpus")}


@dataclass(frozen=True)
class ShardSet:
    train: np.ndarray
    val: np.ndarray
    header: dict[str, Any]  # tokenizer, vocab_size, eos_id, dtype, corpus (the text's fingerprint)


def read_shards(folder: Path, key: str = "data.source", check_ids: bool = True) -> ShardSet:
    """Both splits of a shard folder, checked against each other (and every id < vocab_size)."""
    train, header = read_split(folder, "train", key)
    val, val_header = read_split(folder, "val", key)
    if any(header[k] != val_header[k] for k in _SHARED_FIELDS):
        raise UserError(
            f"{key}: the train and val shards of {folder} disagree on the tokenizer; "
            "one folder holds one tokenisation"
        )
    if check_ids:
        for split, tokens in (("train", train), ("val", val)):
            top = int(tokens.max())
            if top >= header["vocab_size"]:
                raise UserError(
                    f"{key}: {split} shards of {folder} hold id {top} >= vocab_size "
                    f"{header['vocab_size']}; they are corrupt: re-run `ablate prepare`"
                )
    return ShardSet(train, val, header)


def shard_fingerprint(folder: Path, shards: ShardSet) -> dict[str, Any]:
    """Source, counts and a SHA-256 over every shard's bytes (in split and name order)."""
    sha = hashlib.sha256()
    for split in SPLITS:
        for path in sorted((Path(folder) / split).glob("*.bin")):
            sha.update(f"{split}/{path.name}\0".encode())
            with open(path, "rb") as f:
                while chunk := f.read(1 << 24):
                    sha.update(chunk)
    return {
        "source": str(folder),
        "kind": "shards",
        "train_tokens": int(len(shards.train)),
        "val_tokens": int(len(shards.val)),
        "sha256": sha.hexdigest(),
        "corpus": shards.header["corpus"],
    }
