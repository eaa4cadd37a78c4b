"""Corpora, tokenizers and batches: the recipe's `data:` section -> the same micro-batches for every variant.

    data:
      source: stdlib        # 'stdlib' | .txt | .jsonl(.gz/.zst) | .json.gz | .parquet | a folder of them
                        #   | a datasets save_to_disk folder | a hub id (online) | a shard folder
      tokenizer: byte       # byte | bpe | tiktoken | hf | {name: bpe, vocab_size: 4096} | {name: hf, path: tokenizer.json}
      text_key: text        # .jsonl field holding the text
      separator: null       # split text files into documents on this string
      val_fraction: 0.05    # documents held out for validation

Modules: `config` (the keys), `readers` (file formats, streamed), `hf_datasets` (saved and hub datasets),
`corpus` (the by-document split, fingerprints), `builtin_corpus` (pinned download corpora, built once into a shared cache), `tokenizers`, `shards` (the on-disk token format),
`preprocess` (tokenizing into shards with every core, resumable), `tokens` (cache, `load_tokens`, `prepare`),
`loader` (batches), `task_batches` (a task's samples as batches), `tasks/` (kind `task`).
"""

import importlib
from typing import Any

# Names this package exports, and the module each lives in. Imported on first use (PEP 562), so a
# process that needs only a reader or a tokenizer (prepare's workers) does not import torch.
_EXPORTS = {
    "DEFAULTS": "config",
    "DataConfig": "config",
    "parse_data_config": "config",
    "SAMPLINGS": "config",
    "TrainBatches": "loader",
    "micro_batch": "loader",
    "ValBatches": "loader",
    "train_batch": "loader",
    "val_starts": "loader",
    "get_tokenizer": "tokenizers",
    "parse_tokenizer_spec": "tokenizers",
    "vocab_size_of": "tokenizers",
    "TokenData": "tokens",
    "load_tokens": "tokens",
    "prepare": "tokens",
    "vocab_size_for": "tokens",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'ablate.data' has no attribute {name!r}")
    return getattr(importlib.import_module(f"ablate.data.{_EXPORTS[name]}"), name)
