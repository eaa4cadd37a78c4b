"""Text corpora: where documents come from, which ones are held out, and the fingerprint of it all.

Sources (`data.source`):

- `stdlib`: the .py files of the running Python's standard library, one document per file, without
  site-packages and the test suites and IDLE (test/, tests/, idlelib/: ~20 MB of repetitive text that
  would dominate the corpus); about 11 MB in 674 files on CPython 3.11. Needs no download.
- `pypi-sdists`: the code and documentation files of 21 pinned PyPI source distributions, about 550 MB
  of text; fetched from the package index pip uses and built once into a cache shared by workspaces (`ablate.data.builtin_corpus`,
  where its manifest records its token counts under the `cpu` scales' BPE-2048).
- a text file: one document, or several when `data.separator` splits it.
- a JSON-lines file (.jsonl, .jsonl.gz, .jsonl.zst, .json.gz, .json.zst): one document per non-empty
  line, the string under `data.text_key`; a parquet file: one document per row of column `data.text_key`
  (the readers, streaming, are `ablate.data.readers`).
- a folder: every file of those formats below it, hidden entries skipped; a Hugging Face `save_to_disk`
  folder, or a hub id when online (`ablate.data.hf_datasets`).

Files are read in sorted order of their relative paths. Documents are UTF-8; empty ones are skipped.

The validation split is held out by document, never by cutting a document: a document is in `val` when
a hash of its key (relative path, plus `#n` for separated pieces; for records the path without its
format suffixes plus `:n`, see `ablate.data.readers`) falls below
`data.val_fraction`, so adding a file moves no other document between the splits. When no key falls
below, the document with the smallest hash is `val`, so a small corpus still gets a validation split.

The fingerprint (recorded with every run, and the key of every cache built from the corpus) holds the
source, the counts, the split settings and a SHA-256 over the relative paths and raw bytes of the files
(read in blocks). It is the same for the same files however they are listed; adding a file changes it
(it keys the caches) but moves no other document between the splits.
(A folder holding train/*.bin shards is a pre-tokenised source: see `ablate.data.shards`.)
"""

from __future__ import annotations

import hashlib
import json
import platform
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from ablate.core.errors import UserError
from ablate.data import builtin_corpus
from ablate.data.config import DEFAULTS, DataConfig
from ablate.data.hf_datasets import is_saved_dataset, looks_like_hub_id, open_hub, open_saved
from ablate.data.readers import Progress, SourceFile, classify
from ablate.data.tokenizers import BpeTokenizer, parse_tokenizer_spec, tokenizer_label, train_bpe

# The tokenizer of the `cpu` scales (recipes/table6.yaml): a built-in download corpus counts its tokens
# under it when it is built, so a study can size its budgets from the corpus manifest.
CPU_TOKENIZER = {"name": "bpe", "vocab_size": 2048}
_COUNT_BATCH = 256
STDLIB_EXCLUDED_DIRS = frozenset({"site-packages", "test", "tests", "idlelib", "idle_test", "__pycache__"})
_SPLIT_SALT = b"ablate-val-split\0"


class Part(Protocol):
    """A file (`readers.SourceFile`) or a dataset split (`hf_datasets.DatasetSplit`) of a corpus."""

    rel: str

    @property
    def size(self) -> int: ...

    def update_hash(self, sha: Any) -> None: ...

    def documents(
        self, *, text_key: str, separator: str | None, progress: Progress | None = None
    ) -> Iterator[tuple[str, str]]: ...


def _unit_hash(key: str) -> float:
    digest = hashlib.sha256(_SPLIT_SALT + key.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


class TextCorpus:
    """The documents of a text source, split into train and val; scanned once on construction."""

    def __init__(
        self,
        files: list[Part],
        fingerprint: dict,
        *,
        description: str,
        text_key: str,
        separator: str | None,
        val_fraction: float,
    ):
        self.description = description
        self._files = files
        self._text_key = text_key
        self._separator = separator
        self._val_fraction = val_fraction
        self._fallback_val_key: str | None = None
        self.fingerprint = self._scan(fingerprint)

    def _scan(self, fingerprint: dict) -> dict:
        sha = hashlib.sha256()
        n_docs = n_val = 0
        min_key, min_hash = None, 2.0
        for f in self._files:
            f.update_hash(sha)
            for key, _ in self._documents_of(f):
                n_docs += 1
                h = _unit_hash(key)
                n_val += h < self._val_fraction
                if h < min_hash:
                    min_key, min_hash = key, h
        if n_docs == 0:
            raise UserError(
                f"data.source: {self.description} holds no text (no non-empty documents); "
                "give a text/.jsonl file, a folder of them, a shard folder or 'stdlib'"
            )
        if n_docs < 2:
            raise UserError(
                f"data.source: {self.description} holds 1 document, but validation is held "
                "out by document; give at least 2 (a folder, a .jsonl, or data.separator to "
                "split a text file)"
            )
        if n_val == 0:
            self._fallback_val_key, n_val = min_key, 1
        if n_val == n_docs:  # possible only with a handful of documents and a large fraction
            raise UserError(
                f"data.val_fraction: {self._val_fraction} holds out all {n_docs} documents of "
                f"{self.description}; lower it or give more documents"
            )
        return {
            **fingerprint,
            "files": len(self._files),
            "documents": n_docs,
            "val_documents": n_val,
            "val_fraction": self._val_fraction,
            "sha256": sha.hexdigest(),
        }

    def is_val(self, key: str) -> bool:
        return key == self._fallback_val_key or _unit_hash(key) < self._val_fraction

    @property
    def size(self) -> int:
        """Bytes of the source (compressed files as stored): what a progress line counts against."""
        return sum(f.size for f in self._files)

    def documents(self, split: str) -> Iterator[str]:
        """The texts of the split ('train' or 'val'), in corpus order."""
        if split not in ("train", "val"):
            raise ValueError(f"split must be 'train' or 'val', not {split!r}")
        want_val = split == "val"
        for is_val, text in self.records():
            if is_val == want_val:
                yield text

    def records(self, progress: Progress | None = None) -> Iterator[tuple[bool, str]]:
        """(is it val, text) of every document, in corpus order: both splits in one pass over the source."""
        for f in self._files:
            for key, text in self._documents_of(f, progress):
                yield self.is_val(key), text

    def n_documents(self, split: str) -> int:
        val = self.fingerprint["val_documents"]
        return val if split == "val" else self.fingerprint["documents"] - val

    def document_keys(self, split: str) -> list[str]:
        """The keys of the split's documents (relative path, `:line` for .jsonl, `#n` for pieces)."""
        want_val = split == "val"
        return [key for f in self._files for key, _ in self._documents_of(f) if self.is_val(key) == want_val]

    def _documents_of(self, f: Part, progress: Progress | None = None) -> Iterator[tuple[str, str]]:
        return f.documents(text_key=self._text_key, separator=self._separator, progress=progress)


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path | None = None) -> list[SourceFile]:
    root = root or stdlib_root()
    files = []
    for p in root.rglob("*.py"):
        rel = p.relative_to(root)
        if STDLIB_EXCLUDED_DIRS.isdisjoint(rel.parts[:-1]) and p.is_file():
            files.append(SourceFile(p, rel.as_posix(), "text"))
    return sorted(files, key=lambda f: f.rel)


def _folder_files(root: Path) -> list[SourceFile]:
    files = []
    for p in root.rglob("*"):
        rel = p.relative_to(root)
        if any(part.startswith(".") for part in rel.parts) or not p.is_file():
            continue
        if classify(p.name) is not None:
            files.append(SourceFile.of(p, rel.as_posix()))
    return sorted(files, key=lambda f: f.rel)


def builtin_parts(folder: Path) -> list[SourceFile]:
    """The .jsonl files of a built download corpus, in name order."""
    return [SourceFile.of(p, f"documents/{p.name}") for p in sorted((folder / "documents").glob("*.jsonl"))]


def _builtin_corpus(name: str, folder: Path, manifest_sha256: str, val_fraction: float) -> TextCorpus:
    return TextCorpus(
        builtin_parts(folder),
        {"source": name, "manifest": manifest_sha256},
        description=f"the built-in corpus {name} at {folder}",
        text_key="text",
        separator=None,
        val_fraction=val_fraction,
    )


def build_builtin(name: str, *, say: Any = None, **build_options: Any) -> Path:
    """The folder of the built-in download corpus `name`, built on first use (`builtin_corpus.build`;
    `build_options`: its manifest_path, root and fetch), with its fingerprint and its train and val
    tokens under the `cpu` tokenizer in its manifest.json."""
    say = say or builtin_corpus.say_stderr
    manifest_path = build_options.get("manifest_path") or builtin_corpus.BUILTIN_CORPORA[name]
    manifest_sha256 = builtin_corpus.manifest_hash(builtin_corpus.load_manifest(manifest_path))

    def measure(folder: Path) -> dict:
        corpus = _builtin_corpus(name, folder, manifest_sha256, DEFAULTS["val_fraction"])
        spec = parse_tokenizer_spec(CPU_TOKENIZER)
        label = tokenizer_label(spec)
        say(f"{name}: training {label} on the train split, to count tokens")
        tok = BpeTokenizer(train_bpe(corpus.documents("train"), spec["vocab_size"]), spec)
        say(f"{name}: counting {label} tokens")
        return {"fingerprint": corpus.fingerprint, "tokens": {label: count_tokens(corpus, tok)}}

    return builtin_corpus.build(name, measure=measure, say=say, **build_options)


def count_tokens(corpus: TextCorpus, tok: Any) -> dict[str, Any]:
    """Train and val tokens of the corpus under `tok`, an end-of-document token after each document (as
    the token arrays of `ablate.data.tokens` hold them)."""
    counts = {"train": 0, "val": 0}
    batch: list[tuple[bool, str]] = []

    def flush() -> None:
        for (is_val, _), ids in zip(batch, tok.encode_batch([text for _, text in batch]), strict=True):
            counts["val" if is_val else "train"] += len(ids) + 1
        batch.clear()

    for record in corpus.records():
        batch.append(record)
        if len(batch) == _COUNT_BATCH:
            flush()
    flush()
    return {**counts, "tokenizer": tok.spec, "val_fraction": corpus.fingerprint["val_fraction"]}


def open_text_corpus(cfg: DataConfig) -> TextCorpus:
    """The text corpus `cfg.source` names (not a shard folder: the caller checks that first)."""
    options = {"text_key": cfg.text_key, "separator": cfg.separator, "val_fraction": cfg.val_fraction}
    if cfg.source in builtin_corpus.BUILTIN_CORPORA:
        folder = build_builtin(cfg.source)
        manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
        return _builtin_corpus(cfg.source, folder, manifest["manifest_sha256"], cfg.val_fraction)
    if cfg.source == "stdlib":
        root = stdlib_root()
        files = stdlib_files(root)
        fingerprint = {"source": "stdlib", "python": platform.python_version()}
        if cfg.separator is not None:
            fingerprint["separator"] = cfg.separator
        return TextCorpus(files, fingerprint, description=f"the standard library at {root}", **options)
    path = Path(cfg.source).expanduser()
    parts: list[Part]
    if not path.exists() and looks_like_hub_id(cfg.source):
        parts = list(open_hub(cfg.source))
    elif not path.exists():
        raise UserError(
            f"data.source: {cfg.source} does not exist; give a text, .jsonl(.gz/.zst), .json.gz or parquet "
            "file, a folder of them, a saved dataset, a shard folder or 'stdlib'"
        )
    elif is_saved_dataset(path):
        parts = list(open_saved(path))
    elif path.is_dir():
        parts = list(_folder_files(path))
        if not parts:
            raise UserError(
                f"data.source: folder {cfg.source} has no .txt, .jsonl(.gz/.zst), .json.gz or .parquet "
                "files (and no train/ shards); give a file, a folder of them, a saved dataset, a shard "
                "folder or 'stdlib'"
            )
    else:
        parts = [SourceFile.of(path, path.name)]
    fingerprint: dict = {"source": cfg.source}
    if any(getattr(f, "format", "records") != "text" for f in parts):
        # records are keyed by file stem and number since 2026-11 (a .jsonl's split moved then): the
        # marker keeps caches built under the old keys from being reused
        fingerprint.update({"text_key": cfg.text_key, "record_keys": "stem:n"})
    if cfg.separator is not None:
        fingerprint["separator"] = cfg.separator
    return TextCorpus(parts, fingerprint, description=cfg.source, **options)
