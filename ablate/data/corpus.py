"""Text corpora: where documents come from, which ones are held out, and the fingerprint of it all.

Sources (`data.source`):

- `stdlib`: the .py files of the running Python's standard library, one document per file, without
  site-packages and the test suites and IDLE (test/, tests/, idlelib/: ~20 MB of repetitive text that
  would dominate the corpus); about 11 MB in 674 files on CPython 3.11. Needs no download.
- a text file: one document, or several when `data.separator` splits it.
- a .jsonl file: one document per non-empty line, the string under `data.text_key`.
- a folder: every .txt and .jsonl file below it, hidden entries skipped.

Files are read in sorted order of their relative paths. Documents are UTF-8; empty ones are skipped.

The validation split is held out by document, never by cutting a document: a document is in `val` when
a hash of its key (relative path, plus `:line` for .jsonl and `#n` for separated pieces) falls below
`data.val_fraction`, so adding a file moves no other document between the splits. When no key falls
below, the document with the smallest hash is `val`, so a small corpus still gets a validation split.

The fingerprint (recorded with every run, and the key of every cache built from the corpus) holds the
source, the counts, the split settings and a SHA-256 over the relative paths and raw bytes of the files.
(A folder holding train/*.bin shards is a pre-tokenised source: see `ablate.data.shards`.)
"""

from __future__ import annotations

import hashlib
import json
import platform
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ablate.core.errors import UserError
from ablate.data.config import DataConfig

STDLIB_EXCLUDED_DIRS = frozenset({"site-packages", "test", "tests", "idlelib", "idle_test", "__pycache__"})
FOLDER_SUFFIXES = (".txt", ".jsonl")
_SPLIT_SALT = b"ablate-val-split\0"


@dataclass(frozen=True)
class _File:
    path: Path
    rel: str  # posix path relative to the source root: the document keys and the hash use it
    jsonl: bool


def _unit_hash(key: str) -> float:
    digest = hashlib.sha256(_SPLIT_SALT + key.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


class TextCorpus:
    """The documents of a text source, split into train and val; scanned once on construction."""

    def __init__(
        self,
        files: list[_File],
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
            data = self._read(f)
            sha.update(f"{f.rel}\0{len(data)}\0".encode())
            sha.update(data)
            for key, _ in self._documents_of(f, data):
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

    def documents(self, split: str) -> Iterator[str]:
        """The texts of the split ('train' or 'val'), in corpus order."""
        if split not in ("train", "val"):
            raise ValueError(f"split must be 'train' or 'val', not {split!r}")
        want_val = split == "val"
        for f in self._files:
            for key, text in self._documents_of(f, self._read(f)):
                if self.is_val(key) == want_val:
                    yield text

    def n_documents(self, split: str) -> int:
        val = self.fingerprint["val_documents"]
        return val if split == "val" else self.fingerprint["documents"] - val

    def document_keys(self, split: str) -> list[str]:
        """The keys of the split's documents (relative path, `:line` for .jsonl, `#n` for pieces)."""
        want_val = split == "val"
        return [
            key
            for f in self._files
            for key, _ in self._documents_of(f, self._read(f))
            if self.is_val(key) == want_val
        ]

    @staticmethod
    def _read(f: _File) -> bytes:
        try:
            return f.path.read_bytes()
        except OSError as e:
            raise UserError(f"data.source: cannot read {f.path} ({e.strerror})") from None

    def _documents_of(self, f: _File, data: bytes) -> Iterator[tuple[str, str]]:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise UserError(
                f"data.source: {f.path} is not UTF-8 text (byte {e.start}); convert it to UTF-8"
            ) from None
        if f.jsonl:
            yield from self._jsonl_documents(f, text)
        elif self._separator is None:
            if text:
                yield f.rel, text
        else:
            for i, piece in enumerate(text.split(self._separator)):
                if piece:
                    yield f"{f.rel}#{i}", piece

    def _jsonl_documents(self, f: _File, text: str) -> Iterator[tuple[str, str]]:
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise UserError(
                    f"data.source: {f.path} line {lineno} is not valid JSON ({e.msg}); "
                    "give one JSON object per line"
                ) from None
            if not isinstance(record, dict) or self._text_key not in record:
                keys = ", ".join(map(str, record)) if isinstance(record, dict) else type(record).__name__
                raise UserError(
                    f"data.text_key: {f.path} line {lineno} has no field "
                    f"'{self._text_key}' (it has: {keys}); set data.text_key to the text field"
                )
            value = record[self._text_key]
            if not isinstance(value, str):
                raise UserError(
                    f"data.text_key: {f.path} line {lineno}: field '{self._text_key}' is "
                    f"a {type(value).__name__}, not a string"
                )
            if value:
                yield f"{f.rel}:{lineno}", value


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path | None = None) -> list[_File]:
    root = root or stdlib_root()
    files = []
    for p in root.rglob("*.py"):
        rel = p.relative_to(root)
        if STDLIB_EXCLUDED_DIRS.isdisjoint(rel.parts[:-1]) and p.is_file():
            files.append(_File(p, rel.as_posix(), jsonl=False))
    return sorted(files, key=lambda f: f.rel)


def _folder_files(root: Path) -> list[_File]:
    files = []
    for p in root.rglob("*"):
        rel = p.relative_to(root)
        if any(part.startswith(".") for part in rel.parts) or not p.is_file():
            continue
        if p.suffix.lower() in FOLDER_SUFFIXES:
            files.append(_File(p, rel.as_posix(), jsonl=p.suffix.lower() == ".jsonl"))
    return sorted(files, key=lambda f: f.rel)


def open_text_corpus(cfg: DataConfig) -> TextCorpus:
    """The text corpus `cfg.source` names (not a shard folder: the caller checks that first)."""
    options = {"text_key": cfg.text_key, "separator": cfg.separator, "val_fraction": cfg.val_fraction}
    if cfg.source == "stdlib":
        root = stdlib_root()
        files = stdlib_files(root)
        fingerprint = {"source": "stdlib", "python": platform.python_version()}
        if cfg.separator is not None:
            fingerprint["separator"] = cfg.separator
        return TextCorpus(files, fingerprint, description=f"the standard library at {root}", **options)
    path = Path(cfg.source).expanduser()
    if not path.exists():
        raise UserError(
            f"data.source: {cfg.source} does not exist; give a text/.jsonl file, a folder, "
            "a shard folder or 'stdlib'"
        )
    if path.is_dir():
        files = _folder_files(path)
        if not files:
            raise UserError(
                f"data.source: folder {cfg.source} has no .txt or .jsonl files (and no "
                "train/ shards); give a text/.jsonl file, a folder of them, a shard folder "
                "or 'stdlib'"
            )
    else:
        jsonl = path.suffix.lower() == ".jsonl"
        files = [_File(path, path.name, jsonl=jsonl)]
    fingerprint: dict = {"source": cfg.source}
    if any(f.jsonl for f in files):
        fingerprint["text_key"] = cfg.text_key
    if cfg.separator is not None:
        fingerprint["separator"] = cfg.separator
    return TextCorpus(files, fingerprint, description=cfg.source, **options)
