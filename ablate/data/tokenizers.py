"""Tokenizers (`data.tokenizer`): text -> token ids, each with an end-of-document token.

- `byte` (default): the UTF-8 bytes 0..255 and end-of-document 256; vocab_size 257; needs no files.
- `bpe` {vocab_size: 4096}: byte-level BPE trained with the `tokenizers` package on the TRAIN split
  only, cached under `<workspace>/cache/tokenizers/` keyed by the corpus fingerprint and the vocab
  size, so later runs load it. Token 0 is the end-of-document token `<|endoftext|>`. A tiny corpus may
  run out of merges before `vocab_size`: ids then stay below it, and the model keeps `vocab_size` rows.
- `tiktoken` {encoding: cl100k_base}: only when the encoding is already in tiktoken's cache (this code
  never downloads); its end-of-text token ends documents.
- `hf` {path: .../tokenizer.json, eos: null}: any Hugging Face `tokenizers` file (LLaMA, Mistral,
  GPT-NeoX, OLMo ship one), local only: a hub name is refused in one line. Documents end with `eos`, or
  with the first of the usual end tokens the file has (`EOS_CANDIDATES`). Special tokens are not added.

Text that happens to contain a special token's spelling is encoded as ordinary text.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ablate.core.errors import UserError, closest
from ablate.core.workspace import Workspace

EOD_TEXT = "<|endoftext|>"
TOKENIZERS: dict[str, dict[str, Any]] = {  # name -> its options and their defaults
    "byte": {},
    "bpe": {"vocab_size": 4096},
    "tiktoken": {"encoding": "cl100k_base"},
    "hf": {"path": None, "eos": None},
}
EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eot_id|>", "<|im_end|>")
_BPE_MIN_VOCAB = 257  # 256 byte symbols + end-of-document
_BPE_FORMAT = 1  # bump when training settings change, so old cached tokenizers are not reused


def parse_tokenizer_spec(spec: str | Mapping[str, Any]) -> dict[str, Any]:
    """A name or {name: ..., options} -> the canonical dict with every option filled in."""
    if isinstance(spec, str):
        name, options = spec, {}
    elif isinstance(spec, Mapping) and isinstance(spec.get("name"), str):
        name, options = spec["name"], {k: v for k, v in spec.items() if k != "name"}
    else:
        raise UserError(
            f"data.tokenizer: {spec!r} is not a tokenizer; give a name ({', '.join(TOKENIZERS)}) "
            "or {name: ..., options}"
        )
    if name not in TOKENIZERS:
        raise UserError(
            f"data.tokenizer: unknown tokenizer '{name}'{closest(name, TOKENIZERS)}; "
            f"known: {', '.join(TOKENIZERS)}"
        )
    allowed = TOKENIZERS[name]
    for key in options:
        if key not in allowed:
            what = ", ".join(allowed) or "none"
            raise UserError(f"data.tokenizer.{key}: not an option of '{name}'; allowed: {what}")
    spec = {"name": name, **allowed, **options}
    if name == "bpe":
        v = spec["vocab_size"]
        if isinstance(v, bool) or not isinstance(v, int) or not _BPE_MIN_VOCAB <= v < 2**32:
            raise UserError(
                f"data.tokenizer.vocab_size: {v!r} is not an integer in "
                f"[{_BPE_MIN_VOCAB}, 2**32) (256 bytes + end-of-document at least)"
            )
    if name == "tiktoken" and not isinstance(spec["encoding"], str):
        raise UserError(f"data.tokenizer.encoding: {spec['encoding']!r} is not an encoding name")
    if name == "hf":
        if not isinstance(spec["path"], str) or not spec["path"].strip():
            raise UserError(
                f"data.tokenizer.path: {spec['path']!r} is not a path; give a tokenizer.json file "
                "(or the folder that holds one)"
            )
        spec["path"] = str(hf_tokenizer_file(spec["path"]))
        if spec["eos"] is not None and not isinstance(spec["eos"], str):
            raise UserError(f"data.tokenizer.eos: {spec['eos']!r} is not a token (a string such as '</s>')")
    return spec


def hf_tokenizer_file(path: str) -> Path:
    """The local tokenizer.json `path` names (a file or a folder holding one), absolute; a name that
    exists nowhere here (a hub id such as meta-llama/Llama-2-7b-hf) is refused in one line."""
    file = Path(path).expanduser()
    if file.is_dir():
        file = file / "tokenizer.json"
    if not file.is_file():
        hub = "/" in path and not Path(path).expanduser().parent.exists()
        raise UserError(
            f"data.tokenizer.path: {path!r} is not a local tokenizer.json"
            + (
                "; ablate never downloads a tokenizer from a hub (this machine may be offline): download "
                "its tokenizer.json on a machine with network and give that file's path"
                if hub
                else "; give the tokenizer.json file or the folder that holds it"
            )
        )
    return file.resolve()


def tokenizer_label(spec: Mapping[str, Any]) -> str:
    """A short name for file names and run records: byte, bpe-4096, tiktoken-cl100k_base."""
    if spec["name"] == "bpe":
        return f"bpe-{spec['vocab_size']}"
    if spec["name"] == "tiktoken":
        return f"tiktoken-{spec['encoding']}"
    if spec["name"] == "hf":
        folder = Path(spec["path"]).parent.name or "tokenizer"
        return "hf-" + "".join(c if c.isalnum() or c in "_.-" else "_" for c in folder)[:48]
    return spec["name"]


def vocab_size_of(spec: str | Mapping[str, Any]) -> int:
    """The embedding rows the tokenizer needs, without training anything (tiktoken: loads the encoding)."""
    spec = parse_tokenizer_spec(spec)
    if spec["name"] == "byte":
        return ByteTokenizer.vocab_size
    if spec["name"] == "bpe":
        return spec["vocab_size"]
    if spec["name"] == "hf":
        return HfTokenizer(spec).vocab_size
    return _tiktoken_encoding(spec["encoding"]).n_vocab


class ByteTokenizer:
    """UTF-8 bytes; 256 ends a document."""

    vocab_size = 257
    eos_id = 256

    def __init__(self):
        self.spec = {"name": "byte"}
        self.label = "byte"

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint32)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class BpeTokenizer:
    """A `tokenizers.Tokenizer` (byte-level BPE) with `<|endoftext|>` as end-of-document."""

    def __init__(self, tokenizer: Any, spec: dict[str, Any]):
        self._tok = tokenizer
        self._tok.encode_special_tokens = True  # literal "<|endoftext|>" in a text is just text
        self.spec = spec
        self.label = tokenizer_label(spec)
        self.vocab_size = spec["vocab_size"]
        self.eos_id = tokenizer.token_to_id(EOD_TEXT)

    @classmethod
    def from_file(cls, path: Path, spec: dict[str, Any]) -> BpeTokenizer:
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_file(str(path)), spec)

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self._tok.encode(text, add_special_tokens=False).ids, dtype=np.uint32)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        # encode_batch_fast skips the offsets we never use (about twice as fast); tokenizers >= 0.21
        encode = getattr(self._tok, "encode_batch_fast", self._tok.encode_batch)
        encodings = encode(texts, add_special_tokens=False)
        return [np.asarray(e.ids, dtype=np.uint32) for e in encodings]

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def save(self, path: Path) -> None:
        self._tok.save(str(path))


class HfTokenizer:
    """A local Hugging Face `tokenizer.json`; documents end with its end-of-document token."""

    def __init__(self, spec: dict[str, Any]):
        from tokenizers import Tokenizer

        path = spec["path"]
        try:
            self._tok = Tokenizer.from_file(path)
        except Exception as e:  # tokenizers raises a plain Exception for a file it cannot parse
            raise UserError(
                f"data.tokenizer.path: {path} is not a readable tokenizer.json ({str(e).splitlines()[0][:200]})"
            ) from None
        self._tok.encode_special_tokens = True  # a literal "</s>" in a text is just text
        eos = spec["eos"] or next((c for c in EOS_CANDIDATES if self._tok.token_to_id(c) is not None), None)
        if eos is None or self._tok.token_to_id(eos) is None:
            raise UserError(
                f"data.tokenizer.eos: {path} has no token {eos!r}"
                if eos
                else f"data.tokenizer.eos: {path} has none of {', '.join(EOS_CANDIDATES)}; set "
                "data.tokenizer.eos to its end-of-document token"
            )
        self.spec = {**spec, "eos": eos}
        self.label = tokenizer_label(spec)
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.eos_id = self._tok.token_to_id(eos)

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self._tok.encode(text, add_special_tokens=False).ids, dtype=np.uint32)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        encode = getattr(self._tok, "encode_batch_fast", self._tok.encode_batch)
        return [np.asarray(e.ids, dtype=np.uint32) for e in encode(texts, add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)


def train_bpe(texts: Iterable[str], vocab_size: int) -> Any:
    """A byte-level BPE `tokenizers.Tokenizer` with `<|endoftext|>` as id 0."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOD_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte encodable, seen or not
        show_progress=sys.stderr.isatty(),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def tokenizer_from(spec: Mapping[str, Any], file: str | None = None) -> Any:
    """A tokenizer rebuilt from its spec (and, for bpe, its saved file): what prepare's workers load."""
    spec = dict(spec)
    if spec["name"] == "bpe":
        return BpeTokenizer.from_file(Path(file), spec)
    return get_tokenizer(spec)


def bpe_cache_path(workspace: Workspace, fingerprint: Mapping[str, Any], vocab_size: int) -> Path:
    key = json.dumps({"corpus": fingerprint, "vocab_size": vocab_size, "format": _BPE_FORMAT}, sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return workspace.tokenizer_cache / f"bpe-{vocab_size}-{digest}.json"


def get_tokenizer(
    spec: str | Mapping[str, Any],
    *,
    workspace: Workspace | None = None,
    fingerprint: Mapping[str, Any] | None = None,
    train_documents: Callable[[], Iterable[str]] | None = None,
) -> ByteTokenizer | BpeTokenizer | TiktokenTokenizer | HfTokenizer:
    """The tokenizer `spec` names. `bpe` needs the workspace, the corpus fingerprint (the cache key)
    and `train_documents`, called only when no cached tokenizer exists."""
    spec = parse_tokenizer_spec(spec)
    if spec["name"] == "byte":
        return ByteTokenizer()
    if spec["name"] == "tiktoken":
        return TiktokenTokenizer(spec)
    if spec["name"] == "hf":
        return HfTokenizer(spec)
    if workspace is None or fingerprint is None or train_documents is None:
        raise ValueError("bpe needs workspace, fingerprint and train_documents")
    path = bpe_cache_path(workspace, fingerprint, spec["vocab_size"])
    if path.exists():
        try:
            return BpeTokenizer.from_file(path, spec)
        except Exception as e:  # noqa: BLE001 - the `tokenizers` library raises a bare Exception on a bad file
            # a cache, rebuilt from the corpus: a truncated or damaged file (a kill, a full disk) is trained again
            print(
                f"[data] the cached tokenizer {path} cannot be read ({str(e).splitlines()[0][:120]}); "
                "training it again from the corpus",
                flush=True,
            )
            path.unlink(missing_ok=True)
    tok = train_bpe(train_documents(), spec["vocab_size"])
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    os.close(fd)
    try:
        tok.save(tmp)
        os.replace(tmp, path)  # atomic: a concurrent run sees no file or a whole one
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return BpeTokenizer(tok, spec)


class TiktokenTokenizer:
    """A tiktoken encoding that is already in tiktoken's cache."""

    def __init__(self, spec: dict[str, Any]):
        self._enc = _tiktoken_encoding(spec["encoding"])
        self.spec = spec
        self.label = tokenizer_label(spec)
        self.vocab_size = self._enc.n_vocab
        self.eos_id = self._enc.eot_token

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self._enc.encode_ordinary(text), dtype=np.uint32)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.asarray(ids, dtype=np.uint32) for ids in self._enc.encode_ordinary_batch(texts)]

    def decode(self, ids: Iterable[int]) -> str:
        return self._enc.decode(list(ids))


class _WouldDownload(Exception):
    pass


_tiktoken_lock = threading.Lock()


def _tiktoken_cache_dir() -> str:
    for var in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"):  # tiktoken's own lookup order
        if var in os.environ:
            return os.environ[var] or "(caching disabled: the variable is empty)"
    return os.path.join(tempfile.gettempdir(), "data-gym-cache")


def _tiktoken_encoding(name: str) -> Any:
    """tiktoken's encoding `name`, loaded from its cache; never from the network (it could hang)."""
    try:
        import tiktoken
        import tiktoken.load
    except ImportError:
        raise UserError(
            "data.tokenizer: tiktoken is not installed; pip install 'ablate[tiktoken]', "
            "or use 'byte' or 'bpe'"
        ) from None
    known = tiktoken.list_encoding_names()
    if name not in known:
        raise UserError(
            f"data.tokenizer.encoding: unknown tiktoken encoding '{name}'; known: {', '.join(known)}"
        )
    if not callable(getattr(tiktoken.load, "read_file", None)):  # the seam below moved: refuse to guess
        raise UserError(
            "data.tokenizer: this tiktoken version cannot be kept offline by ablate; use 'byte' or 'bpe'"
        )
    read_file = tiktoken.load.read_file

    def offline_read_file(blobpath: str) -> bytes:
        if "://" in blobpath:
            raise _WouldDownload(blobpath)
        return read_file(blobpath)

    # tiktoken downloads a missing encoding file with no timeout; swap its fetcher for one that
    # refuses, so a missing cache is a clear error instead of a hang.
    with _tiktoken_lock:
        tiktoken.load.read_file = offline_read_file
        try:
            return tiktoken.get_encoding(name)
        except _WouldDownload:
            cache = _tiktoken_cache_dir()
            raise UserError(
                f"data.tokenizer: tiktoken encoding '{name}' is not available offline (not in tiktoken's "
                f'cache {cache}; on a machine with network run python -c "import tiktoken; '
                f"tiktoken.get_encoding('{name}')\" and copy its cache folder here, or point "
                "TIKTOKEN_CACHE_DIR at a copy); use 'byte' or 'bpe'"
            ) from None
        finally:
            tiktoken.load.read_file = read_file
