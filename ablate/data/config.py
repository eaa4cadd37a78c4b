"""The recipe's `data:` section, checked once into a `DataConfig`.

Keys and defaults (every other key is a `UserError` naming the closest allowed one):

    data:
      source: stdlib        # 'stdlib' | a text file | a .jsonl file | a folder of them | a shard folder
      tokenizer: byte       # byte | bpe | tiktoken | {name: bpe, vocab_size: 4096}
                            #   | {name: tiktoken, encoding: cl100k_base}; for a shard folder: null
                            #   (the default there) takes the shards' tokenizer
      text_key: text        # .jsonl: the field that holds a document's text
      separator: null       # text files: split each file into documents on this string (null: one
                            #   document per file)
      val_fraction: 0.05    # share of documents held out for validation (by document, by hash)
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ablate.data.tokenizers import parse_tokenizer_spec
from ablate.errors import UserError

DEFAULTS: dict[str, Any] = {
    "source": "stdlib",
    "tokenizer": None,
    "text_key": "text",
    "separator": None,
    "val_fraction": 0.05,
}


@dataclass(frozen=True)
class DataConfig:
    source: str
    tokenizer: dict | None  # canonical spec; None: the shards' tokenizer (or 'byte' for text)
    text_key: str
    separator: str | None
    val_fraction: float


def parse_data_config(data_cfg: Mapping[str, Any] | None) -> DataConfig:
    """Check the `data:` section and fill in the defaults."""
    data_cfg = dict(data_cfg or {})
    unknown = sorted(set(data_cfg) - set(DEFAULTS))
    if unknown:
        close = difflib.get_close_matches(unknown[0], list(DEFAULTS), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise UserError(f"data.{unknown[0]}: unknown key{hint}; allowed: {', '.join(DEFAULTS)}")
    cfg = {**DEFAULTS, **data_cfg}

    source = cfg["source"]
    if source is None:
        source = "stdlib"
    if hasattr(source, "__fspath__"):
        source = str(source)
    if not isinstance(source, str) or not source.strip():
        raise UserError(
            f"data.source: {source!r} is not a path; give a text/.jsonl file, a folder, "
            "a shard folder or 'stdlib'"
        )
    text_key = cfg["text_key"]
    if not isinstance(text_key, str) or not text_key:
        raise UserError(f"data.text_key: {text_key!r} is not a field name; give a non-empty string")
    separator = cfg["separator"]
    if separator is not None and (not isinstance(separator, str) or not separator):
        raise UserError(f"data.separator: {separator!r} is not a string; give a non-empty string or null")
    frac = cfg["val_fraction"]
    if isinstance(frac, bool) or not isinstance(frac, int | float) or not 0 < frac <= 0.5:
        raise UserError(f"data.val_fraction: {frac!r} is not a number in (0, 0.5]")
    tok = cfg["tokenizer"]
    spec = None if tok is None else parse_tokenizer_spec(tok)
    return DataConfig(source, spec, text_key, separator, float(frac))
