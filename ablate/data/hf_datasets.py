"""Hugging Face `datasets` as a corpus: a `save_to_disk` folder, or a hub id on a machine that is online.

A `save_to_disk` folder (it holds `dataset_info.json`, or `dataset_dict.json` for several splits) is
opened with `datasets.load_from_disk`: memory-mapped Arrow, read in batches of rows. Each of its splits
(in name order; a lone dataset counts as the split `train`) is one part of the corpus, and a document's
key is `<split>:<row counted from 1>`, so the same documents as `train.jsonl` get the same keys. Our own
validation split is held out from all of them by key, as for files.

A hub id (`owner/name`) is read with `datasets.load_dataset(..., streaming=True)` only when the machine
is online; offline (HF_HUB_OFFLINE set, or the hub's name does not resolve) it is one line that names the
local alternatives, before `datasets` spends its retries. Folders that `datasets` reads from data files
(parquet, JSON lines) are read by ablate's own readers (`ablate.data.readers`): same documents, no hub.

`datasets` is an optional extra (`pip install 'ablate[hf]'`): heavy, and needed only here.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ablate.core.errors import UserError
from ablate.data.readers import Progress, hash_file

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
BATCH_ROWS = 1000
LOCAL_ALTERNATIVES = (
    "a save_to_disk folder, parquet or .jsonl(.gz/.zst) files, or a folder of them (download the "
    "dataset's files on a machine with network and copy them here)"
)


def is_saved_dataset(path: Path) -> bool:
    return path.is_dir() and (
        (path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file()
    )


def looks_like_hub_id(source: str) -> bool:
    return bool(HUB_ID.match(source)) and not Path(source).expanduser().exists()


@dataclass(frozen=True)
class DatasetSplit:
    """One split of a Hugging Face dataset, read in batches of rows."""

    dataset: Any
    split: str
    rel: str  # what the fingerprint names it by

    @property
    def size(self) -> int:
        return sum(_file_size(f["filename"]) for f in getattr(self.dataset, "cache_files", None) or [])

    def update_hash(self, sha: hashlib._Hash) -> None:
        """Its split name and rows, and the bytes of its Arrow files (a streamed hub dataset: its id)."""
        sha.update(f"{self.rel}\0{self.split}\0".encode())
        for f in getattr(self.dataset, "cache_files", None) or []:
            hash_file(sha, f["filename"])

    def documents(
        self, *, text_key: str, separator: str | None = None, progress: Progress | None = None
    ) -> Iterator[tuple[str, str]]:
        columns = list(getattr(self.dataset, "column_names", None) or [])
        if columns and text_key not in columns:
            raise UserError(
                f"data.text_key: dataset {self.rel} split {self.split} has no column '{text_key}' "
                f"(it has: {', '.join(columns)}); set data.text_key to the text column"
            )
        row = 0
        total = max(1, getattr(self.dataset, "num_rows", 0) or 0)
        for batch in self.dataset.iter(batch_size=BATCH_ROWS):
            texts = batch[text_key]
            for value in texts:
                row += 1
                if value is not None and not isinstance(value, str):
                    raise UserError(
                        f"data.text_key: dataset {self.rel} split {self.split} row {row}: column "
                        f"'{text_key}' holds {type(value).__name__}, not strings"
                    )
                if value:
                    yield f"{self.split}:{row}", value
            if progress:
                progress.read_bytes(self.size * len(texts) / total)


def open_saved(path: Path) -> list[DatasetSplit]:
    """The splits of a `save_to_disk` folder, in name order."""
    datasets = _import_datasets(str(path))
    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as e:  # corrupt or truncated Arrow files, a half-written folder
        raise UserError(
            f"data.source: {path} cannot be read as a saved dataset ({type(e).__name__}: "
            f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}); is it truncated or corrupt?"
        ) from None
    if hasattr(loaded, "keys"):  # DatasetDict
        return [DatasetSplit(loaded[name], name, path.name) for name in sorted(loaded.keys())]
    return [DatasetSplit(loaded, "train", path.name)]


def open_hub(source: str) -> list[DatasetSplit]:
    """A hub dataset streamed (online only); every split it has, in name order."""
    if not hub_online():
        raise UserError(
            f"data.source: {source!r} is a Hugging Face hub id, and this machine is offline "
            f"(HF_HUB_OFFLINE is set or huggingface.co does not resolve); give {LOCAL_ALTERNATIVES}"
        )
    datasets = _import_datasets(source)
    try:
        loaded = datasets.load_dataset(source, streaming=True)
    except Exception as e:
        raise UserError(
            f"data.source: cannot load {source!r} from the hub ({type(e).__name__}); give {LOCAL_ALTERNATIVES}"
        ) from None
    return [DatasetSplit(loaded[name], name, source) for name in sorted(loaded.keys())]


def hub_online() -> bool:
    """False when HF_HUB_OFFLINE says so or the hub's host name does not resolve (no connection is made)."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return False
    try:
        socket.getaddrinfo("huggingface.co", 443)
    except OSError:
        return False
    return True


def _import_datasets(source: str) -> Any:
    try:
        import datasets
    except ImportError:
        raise UserError(
            f"data.source: reading {source} needs the `datasets` package: pip install 'ablate[hf]'"
        ) from None
    datasets.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    return datasets


def _file_size(name: str) -> int:
    try:
        return os.path.getsize(name)
    except OSError:
        return 0
