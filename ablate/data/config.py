"""The recipe's `data:` section: a `DataConfig` whose types jsonargparse checks (`ablate.core.config.load_section`).

data:
  source: stdlib        # 'stdlib' | 'pypi-sdists' (downloaded once) | .txt | .jsonl(.gz/.zst) | .json.gz
                        #   | .parquet | a folder of them | a datasets save_to_disk folder | a hub id (online) | a shard folder
  tokenizer: byte       # byte | bpe | tiktoken | {name: bpe, vocab_size: 4096}
                        #   | {name: tiktoken, encoding: cl100k_base} | {name: hf, path: tokenizer.json}; for a shard folder: null
                        #   (the default there) takes the shards' tokenizer
  text_key: text        # .jsonl / parquet / datasets: the field or column that holds a document
  separator: null       # text files: split each file into documents on this string (null: one
                        #   document per file)
  val_fraction: 0.05    # share of documents held out for validation (by document, by hash)
  task: null            # a task instead of a corpus (kind `task`): {name: multi_needle, ...}
  task_loss: answers    # with a task: train on the answer tokens only, or on all tokens ('all')
  repeat: ask           # a run past one pass over the training split: ask first (ask) or train (allow)
  sampling: permutation # training windows: each pass a seeded permutation of disjoint windows (permutation),
                        #   or windows at random offsets, which read text twice before one pass (random)
"""

from __future__ import annotations

import dataclasses
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from ablate.core.config import load_section
from ablate.core.errors import UserError
from ablate.core.registry import Spec
from ablate.data.tokenizers import parse_tokenizer_spec

# What a data.source that exists must not be: reading one never ends (/dev/zero) or waits for a writer.
SPECIAL_FILES = (
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
)

# How training windows are drawn (ablate.data.loader): `permutation` reads each pass over the training split
# as a seeded permutation of disjoint windows; `random`, the sampler before it, draws each window at a random
# offset and re-reads text before one pass.
Sampling = Literal["permutation", "random"]
SAMPLINGS: tuple[str, ...] = get_args(Sampling)
# Data keys added after runs were first keyed, with the value every run made before had: a run at that value
# hashes as before (ablate.recipe.schema.RunSpec.key), and a record without the key means that value.
DATA_KEYS_ADDED_LATER = {"sampling": "random"}


@dataclass(frozen=True)
class DataConfig:
    """The recipe's `data:` section.

    Attributes:
        source: 'stdlib' (the running Python's standard library), 'pypi-sdists' (21 pinned PyPI sdists, downloaded once; ablate.data.builtin_corpus), a .txt, .jsonl(.gz/.zst), .json.gz or .parquet file, a folder of them, a datasets save_to_disk folder, a hub id (online only), or a shard folder
        tokenizer: byte, bpe, tiktoken or hf ({name: hf, path: tokenizer.json}), or {name: ..., <options>}; null: the shards' tokenizer (byte for text)
        text_key: the JSON field, parquet or datasets column that holds a document's text
        separator: text files: split each file into documents on this string (null: one document per file)
        val_fraction: share of documents held out for validation, in (0, 0.5]
        task: a task instead of a corpus (kind task): a name, {name: ..., <options>} or class_path/init_args
        task_loss: with a task: train on the answer tokens only (answers) or on every token (all)
        repeat: a run whose tokens exceed the training split reads text again (ablate.data.passes): a sweep asks before training past one pass (ask) or trains (allow)
        sampling: training windows: each pass over the training split a seeded permutation of disjoint windows, nothing read twice below one pass (permutation); or windows at random offsets, which read text twice before one pass, the sampler of runs made before this key existed (random)
    """

    source: str | None = "stdlib"
    tokenizer: Spec | None = None
    text_key: str = "text"
    separator: str | None = None
    val_fraction: float = 0.05
    task: Spec | None = None
    task_loss: Literal["answers", "all"] = "answers"
    repeat: Literal["ask", "allow"] = "ask"
    sampling: Sampling = "permutation"

    def __post_init__(self) -> None:
        if self.source is None:
            object.__setattr__(self, "source", "stdlib")
        if not self.source.strip():
            raise UserError(
                "data.source: '' is not a path; give a text/.jsonl file, a folder, a shard folder or 'stdlib'"
            )
        if special := special_file(self.source):
            raise UserError(
                f"data.source: {self.source} is {special}, not a file or folder; give a text, .jsonl(.gz/.zst), "
                ".json.gz or parquet file, a folder of them, a saved dataset, a shard folder or 'stdlib'"
            )
        if not self.text_key:
            raise UserError("data.text_key: '' is not a field name; give a non-empty string")
        if self.separator == "":
            raise UserError("data.separator: '' splits nothing; give a non-empty string or null")
        if not 0 < self.val_fraction <= 0.5:
            raise UserError(f"data.val_fraction: {self.val_fraction!r} is not a number in (0, 0.5]")
        if self.tokenizer is not None:  # the canonical {name: ..., options} form
            object.__setattr__(self, "tokenizer", parse_tokenizer_spec(self.tokenizer))


def special_file(source: str) -> str | None:
    """What `source` is when it exists but is neither a regular file nor a folder (a device, a FIFO, a
    socket), else None. One `stat`: it never opens the file, so a FIFO with no writer cannot block it."""
    try:
        mode = os.stat(os.path.expanduser(source)).st_mode
    except (OSError, ValueError):  # not there (a hub id, a path on another machine), or not a path
        return None
    return next((what for test, what in SPECIAL_FILES if test(mode)), None)


DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(DataConfig)}


def parse_data_config(data_cfg: DataConfig | Mapping[str, Any] | None) -> DataConfig:
    """The `data:` section with every default filled in (null or missing: all defaults); a `DataConfig`
    (a resolved run's section) is already that."""
    if isinstance(data_cfg, DataConfig):
        return data_cfg
    if hasattr((data_cfg or {}).get("source") if isinstance(data_cfg, Mapping) else None, "__fspath__"):
        data_cfg = {**data_cfg, "source": str(data_cfg["source"])}
    return load_section(DataConfig, data_cfg, "data")
