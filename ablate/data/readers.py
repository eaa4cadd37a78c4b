"""Documents out of the files a corpus ships as: one reader per format, each streaming (key, text) pairs.

Formats (by file name):

    .txt                                one document per file (or pieces, with data.separator)
    .jsonl  .jsonl.gz  .jsonl.zst       one JSON object per line, the text under data.text_key
    .json.gz  .json.zst                 the same (Dolma ships JSON lines as .json.gz)
    .parquet                            one row per document, the text in column data.text_key

Compressed files are decompressed as a stream (gzip from the standard library, zstd with `zstandard`);
parquet files are read one row group at a time, and only the text column (`pyarrow`): no reader holds
a whole file in memory. A file that cannot be read as its name says (corrupt, truncated, not UTF-8, not
JSON) is a `UserError` naming the file.

Document keys decide the validation split (`ablate.data.corpus`). A record's key is the file's path with
its format and compression suffixes dropped, then `:n` (the line, or the row counted from 1): so a
corpus converted from .jsonl to .jsonl.zst or .parquet keeps every document in its split.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ablate.core.errors import UserError

# suffix -> (format, compression); longest suffixes first so `.jsonl.gz` is not read as `.gz`
SUFFIXES: dict[str, tuple[str, str | None]] = {
    ".jsonl.zst": ("jsonl", "zstd"),
    ".jsonl.gz": ("jsonl", "gzip"),
    ".json.zst": ("jsonl", "zstd"),
    ".json.gz": ("jsonl", "gzip"),
    ".jsonl": ("jsonl", None),
    ".parquet": ("parquet", None),
    ".txt": ("text", None),
}
PARQUET_BATCH_ROWS = 1024
_HASH_BLOCK = 1 << 22


def classify(name: str) -> tuple[str, str | None, str] | None:
    """(format, compression, the name without those suffixes) of a file name, or None if unsupported."""
    lower = name.lower()
    for suffix, (fmt, compression) in SUFFIXES.items():
        if lower.endswith(suffix):
            return fmt, compression, name[: -len(suffix)]
    return None


@dataclass(frozen=True)
class SourceFile:
    """One file of a corpus: its path, its posix path relative to the source root (the key), its format."""

    path: Path
    rel: str
    format: str  # text | jsonl | parquet
    compression: str | None = None

    @classmethod
    def of(cls, path: Path, rel: str, *, default: str = "text") -> SourceFile:
        kind = classify(path.name)
        fmt, compression = (kind[0], kind[1]) if kind else (default, None)
        return cls(path, rel, fmt, compression)

    @property
    def record_stem(self) -> str:
        kind = classify(self.rel)
        return kind[2] if kind else self.rel

    @property
    def size(self) -> int:
        try:
            return self.path.stat().st_size
        except OSError:
            return 0

    def update_hash(self, sha: hashlib._Hash) -> None:
        """Feed the relative path, size and raw bytes into `sha`, in blocks."""
        sha.update(f"{self.rel}\0{self.size}\0".encode())
        hash_file(sha, self.path)

    def documents(
        self, *, text_key: str, separator: str | None, progress: Progress | None = None
    ) -> Iterator[tuple[str, str]]:
        """(key, text) of every non-empty document of the file, in file order."""
        try:
            if self.format == "parquet":
                yield from self._parquet(text_key, progress)
            elif self.format == "jsonl":
                yield from self._jsonl(text_key, progress)
            else:
                yield from self._text(separator, progress)
        except UserError:
            raise
        except _read_errors() as e:  # gzip, zstd, arrow: corrupt or truncated
            raise UserError(
                f"data.source: {self.path} cannot be read as {self._what()} "
                f"({type(e).__name__}: {_first_line(e)}); is it truncated or corrupt?"
            ) from None

    def _what(self) -> str:
        return {"parquet": "parquet", "jsonl": "JSON lines", "text": "text"}[self.format] + (
            f" ({self.compression}-compressed)" if self.compression else ""
        )

    def _text(self, separator: str | None, progress: Progress | None) -> Iterator[tuple[str, str]]:
        text = _utf8(self.path.read_bytes(), self.path)
        if progress:
            progress.read_bytes(self.size)
        if separator is None:
            if text:
                yield self.rel, text
            return
        for i, piece in enumerate(text.split(separator)):
            if piece:
                yield f"{self.rel}#{i}", piece

    def _jsonl(self, text_key: str, progress: Progress | None) -> Iterator[tuple[str, str]]:
        stem = self.record_stem
        raw = open(self.path, "rb")  # noqa: SIM115 (closed below)
        try:
            stream: BinaryIO = raw
            if self.compression == "gzip":
                stream = gzip.GzipFile(fileobj=raw, mode="rb")
            elif self.compression == "zstd":
                import zstandard

                stream = zstandard.ZstdDecompressor().stream_reader(raw)
            seen = 0
            lines = io.BufferedReader(stream) if stream is not raw else raw  # zstd's reader has no readline
            for lineno, line in enumerate(lines, start=1):
                if progress and lineno % 256 == 0:  # the file position, not on every line (a syscall)
                    position = raw.tell()
                    progress.read_bytes(position - seen)
                    seen = position
                text = _utf8(line, self.path, lineno).strip()
                if not text:
                    continue
                value = _json_text(text, text_key, self.path, lineno)
                if value:
                    yield f"{stem}:{lineno}", value
            if progress:
                progress.read_bytes(self.size - seen)
        finally:
            raw.close()

    def _parquet(self, text_key: str, progress: Progress | None) -> Iterator[tuple[str, str]]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        stem = self.record_stem
        try:
            reader = pq.ParquetFile(self.path)
        except (pa.ArrowException, OSError) as e:
            raise ValueError(_first_line(e)) from None
        columns = reader.schema_arrow.names
        if text_key not in columns:
            raise UserError(
                f"data.text_key: {self.path} has no column '{text_key}' (it has: {', '.join(columns)}); "
                "set data.text_key to the text column"
            )
        row = 0
        per_group = self.size / max(1, reader.num_row_groups)
        for group in range(reader.num_row_groups):  # one row group at a time, the text column only
            try:
                table = reader.read_row_group(group, columns=[text_key])
            except (pa.ArrowException, OSError) as e:
                raise ValueError(_first_line(e)) from None
            values = table.column(0)
            if not (pa.types.is_string(values.type) or pa.types.is_large_string(values.type)):
                raise UserError(
                    f"data.text_key: {self.path}: column '{text_key}' holds {values.type}, not strings"
                )
            for value in values.to_pylist():
                row += 1
                if value:
                    yield f"{stem}:{row}", value
            if progress:
                progress.read_bytes(per_group)


def hash_file(sha: hashlib._Hash, path: Path | str) -> None:
    """Feed a file's bytes into `sha` in blocks (never the whole file in memory)."""
    try:
        with open(path, "rb") as raw:
            while block := raw.read(_HASH_BLOCK):
                sha.update(block)
    except OSError as e:
        raise UserError(f"data.source: cannot read {path} ({e.strerror})") from None


class Progress:
    """What a reader reports as it goes (bytes of the source consumed); `ablate.data.preprocess` shows it."""

    def __init__(self) -> None:
        self.bytes = 0.0

    def read_bytes(self, n: float) -> None:
        self.bytes += n


def _utf8(data: bytes, path: Path, lineno: int | None = None) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        where = f" line {lineno}" if lineno else ""
        raise UserError(
            f"data.source: {path}{where} is not UTF-8 text (byte {e.start}); convert it to UTF-8"
        ) from None


def _json_text(line: str, text_key: str, path: Path, lineno: int) -> str:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise UserError(
            f"data.source: {path} line {lineno} is not valid JSON ({e.msg}); give one JSON object per line"
        ) from None
    if not isinstance(record, dict) or text_key not in record:
        keys = ", ".join(map(str, record)) if isinstance(record, dict) else type(record).__name__
        raise UserError(
            f"data.text_key: {path} line {lineno} has no field '{text_key}' (it has: {keys}); "
            "set data.text_key to the text field"
        )
    value = record[text_key]
    if not isinstance(value, str):
        raise UserError(
            f"data.text_key: {path} line {lineno}: field '{text_key}' is a {type(value).__name__}, not a string"
        )
    return value


def _read_errors() -> tuple[type[BaseException], ...]:
    errors: tuple[type[BaseException], ...] = (OSError, EOFError, zlib.error, ValueError)
    try:
        import zstandard

        errors += (zstandard.ZstdError,)
    except ImportError:
        pass
    return errors


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
