"""A run's tokenizer as a `tokenizers` object, to be written as the export's `tokenizer.json`.

- `bpe` and `hf`: the run's own `tokenizer.json` (the workspace's cached BPE, the recipe's file, or the one
  beside a shard folder), as it is;
- `byte`: written here, since it is no file in ablate (ablate.data.tokenizers.ByteTokenizer): a BPE model
  with no merges over the 256 byte-level symbols, symbol of byte b at id b, `<|endoftext|>` at 256, and
  byte-level pre-tokenization without splitting, so every text encodes to its UTF-8 bytes, as ablate's does;
- `tiktoken`: refused in one line (its encodings are no `tokenizers` file).

The end-of-document token is the export's eos token; there is no BOS, so the harness conditions an empty
context on eos, as ablate's harness model does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ablate.core.errors import UserError
from ablate.core.workspace import Workspace
from ablate.data.tokenizers import EOD_TEXT, HfTokenizer, bpe_cache_path


def byte_tokenizer() -> Any:
    """ablate's `byte` tokenizer as a `tokenizers.Tokenizer` (module docstring)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = _bytes_to_unicode()
    vocab = {alphabet[b]: b for b in range(256)}
    vocab[EOD_TEXT] = 256
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([EOD_TEXT])
    assert len(ByteLevel.alphabet()) == 256
    return tok


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table, the one `tokenizers`' ByteLevel pre-tokenizer uses."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def run_tokenizer(data: Any, workspace: Workspace) -> tuple[Any, str]:
    """(the `tokenizers.Tokenizer`, its end-of-document token) of a run's `data:` section."""
    from tokenizers import Tokenizer

    from ablate.data.config import parse_data_config
    from ablate.data.corpus import open_text_corpus
    from ablate.data.shards import is_shard_folder
    from ablate.data.tokenizers import get_tokenizer, parse_tokenizer_spec

    cfg = parse_data_config(data)
    folder = Path(cfg.source).expanduser()
    if is_shard_folder(folder):
        if (folder / "tokenizer.json").is_file():
            return _with_eos(Tokenizer.from_file(str(folder / "tokenizer.json")), cfg.tokenizer, folder)
        spec = parse_tokenizer_spec(cfg.tokenizer or "byte")
    else:
        spec = parse_tokenizer_spec(cfg.tokenizer or "byte")
    if spec["name"] == "tiktoken":
        raise UserError(
            "data.tokenizer: tiktoken encodings have no tokenizer.json, so a run trained on one cannot be exported"
        )
    if spec["name"] == "byte":
        return byte_tokenizer(), EOD_TEXT
    if spec["name"] == "hf":
        tok = HfTokenizer(spec)
        return Tokenizer.from_file(spec["path"]), tok.spec["eos"]
    corpus = open_text_corpus(cfg)
    # the run's BPE, trained once on the train split and cached (trained again only if the cache is gone)
    get_tokenizer(
        spec,
        workspace=workspace,
        fingerprint=corpus.fingerprint,
        train_documents=lambda: corpus.documents("train"),
    )
    return Tokenizer.from_file(
        str(bpe_cache_path(workspace, corpus.fingerprint, spec["vocab_size"]))
    ), EOD_TEXT


def _with_eos(tok: Any, spec: Any, folder: Path) -> tuple[Any, str]:
    from ablate.data.tokenizers import EOS_CANDIDATES

    eos = (spec or {}).get("eos") if isinstance(spec, dict) else None
    eos = eos or next((c for c in EOS_CANDIDATES if tok.token_to_id(c) is not None), None)
    if eos is None:
        raise UserError(f"data.source: {folder / 'tokenizer.json'} has none of {', '.join(EOS_CANDIDATES)}")
    return tok, eos
