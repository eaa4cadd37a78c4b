"""Corpus + tokenizer -> token arrays, cached; and `prepare`, which writes the same shards elsewhere.

`load_tokens` tokenises a text corpus once into `<workspace>/cache/tokens/<tokenizer>-<key>/` (a shard
folder, see `ablate.data.shards`), keyed by the corpus fingerprint and the tokenizer spec, and memory-maps
it on every later call. A shard-folder source is read in place. The cache folder appears atomically
(written beside it, then renamed), so concurrent runs on one machine never read half a cache.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ablate.core.errors import UserError
from ablate.core.workspace import Workspace
from ablate.data.builtin_corpus import BUILTIN_CORPORA
from ablate.data.config import parse_data_config
from ablate.data.corpus import TextCorpus, open_text_corpus
from ablate.data.preprocess import write_token_shards
from ablate.data.shards import is_shard_folder, read_shards, shard_fingerprint
from ablate.data.tokenizers import (
    BpeTokenizer,
    HfTokenizer,
    bpe_cache_path,
    get_tokenizer,
    tokenizer_from,
    tokenizer_label,
    vocab_size_of,
)

_CACHE_FORMAT = 1  # bump when the token layout changes, so old caches are not reused


@dataclass(frozen=True)
class TokenData:
    train: np.ndarray  # 1-D token ids, documents each followed by eos_id (memory-mapped)
    val: np.ndarray
    vocab_size: int
    eos_id: int
    tokenizer: str  # byte, bpe-4096, tiktoken-cl100k_base
    tokenizer_spec: dict[str, Any]
    fingerprint: dict[str, Any]  # of the corpus (text source) or of the shard folder

    def describe(self) -> dict[str, Any]:
        """What a run records about its data."""
        return {
            "tokenizer": self.tokenizer_spec,
            "vocab_size": self.vocab_size,
            "eos_id": self.eos_id,
            "train_tokens": int(len(self.train)),
            "val_tokens": int(len(self.val)),
            "fingerprint": self.fingerprint,
        }


def _shard_source(source: str) -> Path | None:
    if source == "stdlib" or source in BUILTIN_CORPORA:
        return None
    path = Path(source).expanduser()
    return path if is_shard_folder(path) else None


def vocab_size_for(data_cfg: Mapping[str, Any] | None) -> int:
    """The model's vocabulary size for this `data:` section, without tokenising anything."""
    cfg = parse_data_config(data_cfg)
    folder = _shard_source(cfg.source)
    if folder is None:
        return vocab_size_of(cfg.tokenizer or "byte")
    return _check_spec(cfg.tokenizer, read_shards(folder, check_ids=False).header, folder)["vocab_size"]


def _check_spec(spec: dict | None, header: dict, folder: Path) -> dict:
    if spec is not None and spec != header["tokenizer"]:
        raise UserError(
            f"data.tokenizer: {spec} differs from the tokenizer of the shards in {folder} "
            f"({header['tokenizer']}); drop data.tokenizer or set it to theirs"
        )
    return header


def load_tokens(data_cfg: Mapping[str, Any] | None, workspace: Workspace) -> TokenData:
    """Train and val token arrays for the `data:` section (tokenised once, then memory-mapped)."""
    cfg = parse_data_config(data_cfg)
    folder = _shard_source(cfg.source)
    if folder is not None:
        shards = read_shards(folder)
        _check_spec(cfg.tokenizer, shards.header, folder)
        fingerprint = shard_fingerprint(folder, shards)
    else:
        corpus = open_text_corpus(cfg)
        spec = cfg.tokenizer or {"name": "byte"}
        folder = _token_cache_dir(workspace, corpus.fingerprint, spec)
        shards = None
        if folder.exists():
            try:
                shards = read_shards(folder, key="workspace cache", check_ids=False)
            except UserError:  # a damaged cache is rebuilt, not reported
                shutil.rmtree(folder, ignore_errors=True)
        if shards is None:
            _build_atomically(folder, lambda tmp: _write_shard_folder(tmp, corpus, spec, workspace))
            shards = read_shards(folder, key="workspace cache", check_ids=False)
        fingerprint = corpus.fingerprint
    h = shards.header
    return TokenData(
        train=shards.train,
        val=shards.val,
        vocab_size=h["vocab_size"],
        eos_id=h["eos_id"],
        tokenizer=tokenizer_label(h["tokenizer"]),
        tokenizer_spec=h["tokenizer"],
        fingerprint=fingerprint,
    )


def prepare(
    data_cfg: Mapping[str, Any] | None,
    out_dir: Path,
    workspace: Workspace,
    shard_tokens: int | None = None,
    *,
    workers: int | None = None,
    say: Callable[[str], None] | None = None,
) -> list[Path]:
    """Tokenise the corpus into a shard folder `out_dir` (readable as `data.source`), or finish one an
    interrupted call left (`ablate.data.preprocess`); returns the .bin paths, train then val.
    `shard_tokens` caps a shard (it closes at the next document end; None: 64M tokens); `workers`
    processes tokenize (None: one per core)."""
    from ablate.data.preprocess import DEFAULT_SHARD_TOKENS, prepare_folder

    cfg = parse_data_config(data_cfg)
    if _shard_source(cfg.source) is not None:
        raise UserError(f"data.source: {cfg.source} is already a shard folder; give a text source to prepare")
    for name, value in (("shard_tokens", shard_tokens), ("workers", workers)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise UserError(f"--{name.replace('_', '-')}: {value!r} is not a positive integer")
    corpus = open_text_corpus(cfg)
    spec = cfg.tokenizer or {"name": "byte"}
    tok, make = _tokenizer_for(spec, corpus, workspace)
    kwargs = {"say": say} if say else {}
    paths = prepare_folder(
        Path(out_dir),
        corpus,
        tok,
        source=cfg.source,
        shard_tokens=shard_tokens or DEFAULT_SHARD_TOKENS,
        workers=workers or os.cpu_count() or 1,
        make=make,
        **kwargs,
    )
    _save_tokenizer_file(tok, Path(out_dir).expanduser())
    return paths


def _tokenizer_for(spec: dict, corpus: TextCorpus, workspace: Workspace) -> tuple[Any, Callable[[], Any]]:
    """The tokenizer (bpe: trained on the train split once, cached) and a picklable way to build it again
    in another process."""
    tok = get_tokenizer(
        spec,
        workspace=workspace,
        fingerprint=corpus.fingerprint,
        train_documents=lambda: corpus.documents("train"),
    )
    file = (
        str(bpe_cache_path(workspace, corpus.fingerprint, spec["vocab_size"]))
        if spec["name"] == "bpe"
        else None
    )
    return tok, functools.partial(tokenizer_from, tok.spec, file)


def _save_tokenizer_file(tok: Any, folder: Path) -> None:
    """bpe and hf shard folders keep their tokenizer.json beside the shards (to decode samples)."""
    if isinstance(tok, BpeTokenizer):
        tok.save(folder / "tokenizer.json")
    elif isinstance(tok, HfTokenizer):
        shutil.copyfile(tok.spec["path"], folder / "tokenizer.json")


def _token_cache_dir(workspace: Workspace, fingerprint: dict, spec: dict) -> Path:
    identity = dict(spec)
    if spec["name"] == "hf":  # the file at that path may change: its bytes are part of the key
        identity["sha256"] = hashlib.sha256(Path(spec["path"]).read_bytes()).hexdigest()
    key = json.dumps({"corpus": fingerprint, "tokenizer": identity, "format": _CACHE_FORMAT}, sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return workspace.token_cache / f"{tokenizer_label(spec)}-{digest}"


def _build_atomically(folder: Path, build) -> None:
    """Run build(tmp) in a sibling temp folder, then rename it to `folder` (the loser of a race drops its copy)."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.tmp-"))
    except OSError as e:
        raise UserError(
            f"workspace: cannot write {folder.parent} ({e.strerror}); give a writable folder"
        ) from None
    try:
        build(tmp)
        try:
            os.rename(tmp, folder)
        except OSError:
            if not folder.exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _write_shard_folder(folder: Path, corpus: TextCorpus, spec: dict, workspace: Workspace) -> None:
    """The workspace cache: the same tokens `ablate prepare` writes, one shard per split, in this process."""
    tok, _ = _tokenizer_for(spec, corpus, workspace)
    write_token_shards(folder, corpus, tok)
    _save_tokenizer_file(tok, folder)
