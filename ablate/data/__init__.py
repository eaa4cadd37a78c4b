"""Corpora, tokenizers and batches: the recipe's `data:` section -> the same micro-batches for every variant.

    data:
      source: stdlib        # 'stdlib' | .txt | .jsonl(.gz/.zst) | .json.gz | .parquet | a folder of them
                        #   | a datasets save_to_disk folder | a hub id (online) | a shard folder
      tokenizer: byte       # byte | bpe | tiktoken | hf | {name: bpe, vocab_size: 4096} | {name: hf, path: tokenizer.json}
      text_key: text        # .jsonl field holding the text
      separator: null       # split text files into documents on this string
      val_fraction: 0.05    # documents held out for validation

Modules: `config` (the keys), `readers` (file formats, streamed), `hf_datasets` (saved and hub datasets),
`corpus` (the by-document split, fingerprints), `tokenizers`, `shards` (the on-disk token format),
`prepare` (tokenizing into shards with every core, resumable), `tokens` (cache, `load_tokens`, `prepare`),
`loader` (batches), `task_batches` (a task's samples as batches), `tasks/` (kind `task`).
"""

from ablate.data.config import DEFAULTS, DataConfig, parse_data_config
from ablate.data.loader import TrainBatches, ValBatches, train_batch, val_starts
from ablate.data.tokenizers import get_tokenizer, parse_tokenizer_spec, vocab_size_of
from ablate.data.tokens import TokenData, load_tokens, prepare, vocab_size_for

__all__ = [
    "DEFAULTS",
    "DataConfig",
    "TokenData",
    "TrainBatches",
    "ValBatches",
    "get_tokenizer",
    "load_tokens",
    "parse_data_config",
    "parse_tokenizer_spec",
    "prepare",
    "train_batch",
    "val_starts",
    "vocab_size_for",
    "vocab_size_of",
]
