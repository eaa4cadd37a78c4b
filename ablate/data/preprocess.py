"""Tokenizing a corpus into shards: with every core, resumable, with a progress line.

One pass over the source reads both splits (`TextCorpus.records`); documents go in chunks of about
`CHUNK_CHARS` characters to `workers` processes (each with its own copy of the tokenizer, its internal
threads off so the cores are not oversubscribed), at most two chunks per worker in flight so memory stays
flat, and come back in corpus order: the token stream is the same for any number of workers, and the
same as the workspace cache `ablate train` builds from the raw source (both call `write_token_shards`).

Shards (`ablate.data.shards`) close at the first document boundary at or past `shard_tokens`, so where
they close depends on the documents alone. Each shard is committed by its sidecar `.json` (it records the
documents it holds) after its `.bin` is complete, both renamed into place. `ablate prepare` writes
`prepare.json` (what is being prepared) first and `manifest.json` (source fingerprint, tokenizer, tokens,
documents and shards per split) last; run again on a folder with `prepare.json` and no manifest, it keeps
the committed shards, skips their documents without tokenizing them, and writes the rest: the folder
ends byte-identical to an uninterrupted run's.

Written here rather than with `datasets.map(num_proc=...)`: that needs the corpus as an Arrow dataset
first (a full conversion, the step this avoids) and knows nothing of our shards or their resume.
"""

from __future__ import annotations

import collections
import json
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ablate.core import json_cache
from ablate.core.errors import UserError
from ablate.core.tables import format_seconds, si
from ablate.data.corpus import TextCorpus
from ablate.data.readers import Progress
from ablate.data.shards import SPLITS, dtype_for, dtype_name

STATE = "prepare.json"
MANIFEST = "manifest.json"
DEFAULT_SHARD_TOKENS = 1 << 26  # 64M tokens: 128 MB of uint16 per shard
CHUNK_CHARS = 1 << 20
PROGRESS_SECONDS = 5.0


# --- shards that close at document boundaries ---------------------------------------------------------
class SplitWriter:
    """Appends documents' tokens (eos added) to `folder/split/NNNNNN.bin` shards."""

    def __init__(self, folder: Path, split: str, header: dict[str, Any], shard_tokens: int | None):
        self.dir = Path(folder) / split
        self.dir.mkdir(parents=True, exist_ok=True)
        self.header, self.shard_tokens = header, shard_tokens
        self.dtype = dtype_for(header["vocab_size"])
        self.eos = np.asarray([header["eos_id"]], dtype=self.dtype)
        self.committed = self._committed()
        self.documents_done = sum(s["documents"] for s in self.committed)
        self.tokens_done = sum(s["count"] for s in self.committed)
        self._file = None
        self._count = self._docs = 0

    def _committed(self) -> list[dict[str, Any]]:
        """Sidecars of the shards a run before this one committed; anything else in the folder is dropped."""
        shards = []
        for sidecar in sorted(self.dir.glob("*.json")):
            header = json_cache.read(sidecar)  # a damaged sidecar reads as none: its shard is made again
            if "documents" not in header or not sidecar.with_suffix(".bin").is_file():
                break
            shards.append(header)
        keep = {f"{i:06d}{suffix}" for i in range(len(shards)) for suffix in (".bin", ".json")}
        for path in self.dir.iterdir():
            if path.name not in keep:
                path.unlink()
        return shards

    @property
    def next_path(self) -> Path:
        return self.dir / f"{len(self.committed):06d}.bin"

    def add(self, ids: np.ndarray) -> None:
        if self._file is None:
            self._file = open(self.next_path.with_suffix(".bin.tmp"), "wb")  # noqa: SIM115 (closed in _close)
            self._count = self._docs = 0
        np.asarray(ids).astype(self.dtype, copy=False).tofile(self._file)
        self.eos.tofile(self._file)
        self._count += len(ids) + 1
        self._docs += 1
        self.tokens_done += len(ids) + 1
        self.documents_done += 1
        if self.shard_tokens is not None and self._count >= self.shard_tokens:
            self._close()

    def finish(self) -> list[Path]:
        """Commit the open shard (or an empty one when the split has none); the .bin paths, in order."""
        if self._file is not None or not self.committed:
            if self._file is None:
                self._file = open(self.next_path.with_suffix(".bin.tmp"), "wb")  # noqa: SIM115
            self._close()
        return [self.dir / f"{i:06d}.bin" for i in range(len(self.committed))]

    def _close(self) -> None:
        path = self.next_path
        self._file.close()
        self._file = None
        os.replace(path.with_suffix(".bin.tmp"), path)
        sidecar = {**self.header, "count": self._count, "documents": self._docs}
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(sidecar, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, path.with_suffix(".json"))  # the commit: a shard without its sidecar is redone
        self.committed.append(sidecar)


# --- encoding in order, with every core -------------------------------------------------------------------
_WORKER_TOKENIZER: Any = None


def _start_worker(make: Callable[[], Any]) -> None:
    global _WORKER_TOKENIZER
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per worker process: workers are the cores
    _WORKER_TOKENIZER = make()


def _encode_chunk(texts: list[str]) -> list[np.ndarray]:
    return _WORKER_TOKENIZER.encode_batch(texts)


def _chunks(
    records: Iterator[tuple[bool, str]], skip: Mapping[bool, int]
) -> Iterator[tuple[list[bool], list[str]]]:
    """Records in chunks of about CHUNK_CHARS characters; the first `skip[is_val]` documents of each split
    (committed by an earlier run) are passed over without being tokenized."""
    seen = {False: 0, True: 0}
    flags: list[bool] = []
    texts: list[str] = []
    size = 0
    for is_val, text in records:
        seen[is_val] += 1
        if seen[is_val] <= skip[is_val]:
            continue
        flags.append(is_val)
        texts.append(text)
        size += len(text)
        if size >= CHUNK_CHARS:
            yield flags, texts
            flags, texts, size = [], [], 0
    if texts:
        yield flags, texts


def encoded(
    chunks: Iterator[tuple[list[bool], list[str]]], tok: Any, workers: int, make: Callable[[], Any] | None
) -> Iterator[tuple[list[bool], list[np.ndarray]]]:
    """The chunks' token arrays, in order: in this process (workers <= 1), or in `workers` processes."""
    if workers <= 1 or make is None:
        for flags, texts in chunks:
            yield flags, tok.encode_batch(texts)
        return
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no forked tokenizer threads
    with context.Pool(workers, initializer=_start_worker, initargs=(make,)) as pool:
        pending: collections.deque = collections.deque()
        for flags, texts in chunks:
            pending.append((flags, pool.apply_async(_encode_chunk, (texts,))))
            if len(pending) >= 2 * workers:  # back-pressure: the source is not read ahead of the workers
                done_flags, result = pending.popleft()
                yield done_flags, result.get()
        while pending:
            done_flags, result = pending.popleft()
            yield done_flags, result.get()


def write_token_shards(
    folder: Path,
    corpus: TextCorpus,
    tok: Any,
    *,
    shard_tokens: int | None = None,
    workers: int = 1,
    make: Callable[[], Any] | None = None,
    say: Callable[[str], None] | None = None,
) -> dict[str, SplitWriter]:
    """Tokenize the corpus into `folder`'s train/ and val/ shards (resuming committed ones); the writers."""
    header = {
        "tokenizer": tok.spec,
        "vocab_size": tok.vocab_size,
        "eos_id": tok.eos_id,
        "dtype": dtype_name(dtype_for(tok.vocab_size)),
        "corpus": corpus.fingerprint,
    }
    writers = {split: SplitWriter(folder, split, header, shard_tokens) for split in SPLITS}
    skip = {False: writers["train"].documents_done, True: writers["val"].documents_done}
    progress = Progress()
    line = ProgressLine(corpus, writers, progress, say) if say else None
    for flags, arrays in encoded(_chunks(corpus.records(progress), skip), tok, workers, make):
        for is_val, ids in zip(flags, arrays):
            writers["val" if is_val else "train"].add(ids)
        if line:
            line.tick()
    for writer in writers.values():
        writer.finish()
    if line:
        line.tick(final=True)
    return writers


class ProgressLine:
    """`[prepare] 12,345 docs  3.40M tokens  120/1.02K MB read  1.21M tok/s  ETA 12m`, every few seconds."""

    def __init__(self, corpus: TextCorpus, writers: dict[str, SplitWriter], progress: Progress, say):
        self.corpus, self.writers, self.progress, self.say = corpus, writers, progress, say
        self.total = corpus.size
        self.start = self.last = time.monotonic()
        self.tokens0 = sum(w.tokens_done for w in writers.values())

    def tick(self, final: bool = False) -> None:
        now = time.monotonic()
        if not final and now - self.last < PROGRESS_SECONDS:
            return
        self.last = now
        docs = sum(w.documents_done for w in self.writers.values())
        tokens = sum(w.tokens_done for w in self.writers.values())
        elapsed = max(now - self.start, 1e-9)
        read = min(self.progress.bytes, self.total) if self.total else self.progress.bytes
        rate = (tokens - self.tokens0) / elapsed
        text = (
            f"[prepare] {docs:,} documents  {si(tokens)} tokens  {read / 1e6:,.1f}"
            + (f"/{self.total / 1e6:,.1f}" if self.total else "")
            + f" MB read  {si(rate)} tokens/s"
        )
        if final:
            text += f"  done in {format_seconds(elapsed)}"
        elif self.total and read > 0:
            text += f"  ETA {format_seconds(elapsed * (self.total - read) / read)}"
        self.say(text)


# --- `ablate prepare` ------------------------------------------------------------------------------------
def prepare_folder(
    out_dir: Path,
    corpus: TextCorpus,
    tok: Any,
    *,
    source: str,
    shard_tokens: int,
    workers: int,
    make: Callable[[], Any] | None,
    say: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
) -> list[Path]:
    """Write (or resume) a shard folder with its manifest; the .bin paths, train then val."""
    out_dir = Path(out_dir).expanduser()
    state = {
        "format": 1,
        "fingerprint": corpus.fingerprint,
        "tokenizer": tok.spec,
        "shard_tokens": shard_tokens,
    }
    _claim(out_dir, state)
    say(
        f"[prepare] {corpus.description}: {corpus.fingerprint['documents']:,} documents, "
        f"{corpus.size / 1e6:,.1f} MB; tokenizer {tok.label}; {workers} worker(s)"
    )
    writers = write_token_shards(
        out_dir, corpus, tok, shard_tokens=shard_tokens, workers=workers, make=make, say=say
    )
    manifest = {
        "source": source,
        "fingerprint": corpus.fingerprint,
        "tokenizer": tok.spec,
        "vocab_size": tok.vocab_size,
        "eos_id": tok.eos_id,
        "shard_tokens": shard_tokens,
        "splits": {
            split: {"tokens": w.tokens_done, "documents": w.documents_done, "shards": len(w.committed)}
            for split, w in writers.items()
        },
    }
    tmp = out_dir / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, out_dir / MANIFEST)
    return [p for split in SPLITS for p in writers[split].finish()]


def _claim(out_dir: Path, state: dict[str, Any]) -> None:
    """Start a new folder, or resume one this same preparation left unfinished; refuse anything else."""
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"out_dir: {out_dir} exists and is not an empty folder; give a new or empty folder")
    if out_dir.is_dir() and any(out_dir.iterdir()):
        saved = out_dir / STATE
        if (out_dir / MANIFEST).exists() or not saved.is_file():
            raise UserError(
                f"out_dir: {out_dir} exists and is not an empty folder"
                + (" (a finished `ablate prepare`)" if (out_dir / MANIFEST).exists() else "")
                + "; give a new or empty folder"
            )
        before = json_cache.read(saved)  # not JSON, not UTF-8 or not an object: another preparation's
        if before != json.loads(json.dumps(state)):
            raise UserError(
                f"out_dir: {out_dir} holds an unfinished `ablate prepare` of another corpus, tokenizer or "
                "shard size; give a new folder, or remove that one"
            )
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / STATE).write_text(json.dumps(state, indent=1, sort_keys=True) + "\n")
