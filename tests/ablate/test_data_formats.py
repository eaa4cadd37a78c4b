"""Corpora as they are shipped: parquet, .jsonl.zst, .json.gz, a `datasets` folder, a tokenizer.json.

Every file is made here, with the libraries that make them in the wild (pyarrow, zstandard, gzip,
datasets, tokenizers). The reference is the same documents as a plain `train.jsonl`: each format must
give the same token arrays, train and val (record keys are the file stem and number, so the split is the
same). A corrupt or truncated file of each kind is one line naming it, exit 2.
"""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
import zstandard
from cli_helpers import assert_one_line_error, run_cli
from mini_project import MINI

from ablate.core.errors import UserError
from ablate.core.workspace import Workspace
from ablate.data import load_tokens, vocab_size_of
from ablate.data.readers import PARQUET_BATCH_ROWS

WORDS = ["the", "cat", "sat", "on", "a", "mat", "über", "naïve", "東京", "λ", "x = 1", "def", "return"]


def documents(n: int = 60, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 60))) for _ in range(n)]


def write_jsonl(path: Path, docs: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes("".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(docs)).encode())
    return path


def write_parquet(path: Path, docs: list[str], row_group_size: int = 7) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table({"id": list(range(len(docs))), "text": docs})
    pq.write_table(table, path, row_group_size=row_group_size)
    assert pq.ParquetFile(path).num_row_groups > 3  # several row groups, read one at a time
    return path


def write_zst(path: Path, docs: list[str]) -> Path:
    plain = write_jsonl(path.with_name("plain.tmp"), docs).read_bytes()
    path.write_bytes(zstandard.ZstdCompressor(level=3).compress(plain))
    path.with_name("plain.tmp").unlink()
    return path


def write_gz(path: Path, docs: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for i, d in enumerate(docs):
            f.write(json.dumps({"text": d, "id": i}) + "\n")
    return path


def write_saved_dataset(folder: Path, docs: list[str]) -> Path:
    datasets = pytest.importorskip("datasets")  # a dev dependency: installed wherever the suite runs
    datasets.disable_progress_bars()
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": docs})}).save_to_disk(str(folder))
    return folder


def train_tokenizer_json(path: Path, docs: list[str]) -> Path:
    """A byte-level BPE with `</s>` (LLaMA-style end token) saved as tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(docs, trainer=trainer)
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("formats")
    docs = documents()
    return {
        "jsonl": write_jsonl(root / "jsonl" / "train.jsonl", docs),
        "parquet": write_parquet(root / "parquet" / "train.parquet", docs),
        "jsonl.zst": write_zst(root / "zst" / "train.jsonl.zst", docs),
        "json.gz": write_gz(root / "gz" / "train.json.gz", docs),
        "datasets": write_saved_dataset(root / "saved", docs),
        "tokenizer": train_tokenizer_json(root / "tok" / "tokenizer.json", docs),
    }


@pytest.mark.parametrize("fmt", ["parquet", "jsonl.zst", "json.gz", "datasets"])
@pytest.mark.parametrize("tokenizer", ["byte", "hf"])
def test_each_format_gives_the_token_stream_of_the_same_jsonl(corpora, tmp_path, fmt, tokenizer):
    spec = "byte" if tokenizer == "byte" else {"name": "hf", "path": str(corpora["tokenizer"])}
    reference = load_tokens(
        {"source": str(corpora["jsonl"]), "tokenizer": spec, "val_fraction": 0.2}, Workspace(tmp_path)
    )
    data = load_tokens(
        {"source": str(corpora[fmt]), "tokenizer": spec, "val_fraction": 0.2}, Workspace(tmp_path)
    )
    assert len(reference.val) > 0 and len(reference.train) > 5 * len(reference.val) / 2
    assert np.array_equal(np.asarray(data.train), np.asarray(reference.train))
    assert np.array_equal(np.asarray(data.val), np.asarray(reference.val))
    assert (data.vocab_size, data.eos_id) == (reference.vocab_size, reference.eos_id)
    assert (
        data.fingerprint["documents"] == 60 and data.fingerprint["sha256"] != reference.fingerprint["sha256"]
    )


def test_a_tokenizer_json_ends_documents_with_its_eos_and_adds_no_specials(corpora, tmp_path):
    from tokenizers import Tokenizer

    own = Tokenizer.from_file(str(corpora["tokenizer"]))
    spec = {"name": "hf", "path": str(corpora["tokenizer"].parent)}  # a folder holding tokenizer.json
    data = load_tokens(
        {"source": str(corpora["jsonl"]), "tokenizer": spec, "val_fraction": 0.2}, Workspace(tmp_path)
    )
    eos = own.token_to_id("</s>")
    assert data.eos_id == eos and vocab_size_of(spec) == own.get_vocab_size() == data.vocab_size
    first = list(np.asarray(data.train[: list(np.asarray(data.train)).index(eos)]))
    train_docs = [d for d in documents() if d]  # the first train document, encoded by the library itself
    assert any(first == own.encode(d, add_special_tokens=False).ids for d in train_docs)
    assert own.token_to_id("<s>") not in set(np.asarray(data.train).tolist())


def test_parquet_is_read_one_row_group_at_a_time(tmp_path, monkeypatch):
    """The reader asks pyarrow for one row group (and one column) at a time, never the whole table."""
    path = write_parquet(
        tmp_path / "c" / "big.parquet", documents(200), row_group_size=PARQUET_BATCH_ROWS // 32
    )
    calls = []
    original = pq.ParquetFile.read_row_group

    def spy(self, i, columns=None, **kwargs):
        calls.append((i, tuple(columns or ())))
        return original(self, i, columns=columns, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", spy)
    monkeypatch.setattr(pq.ParquetFile, "read", lambda *a, **k: pytest.fail("read the whole file"))
    load_tokens({"source": str(path.parent), "val_fraction": 0.1}, Workspace(tmp_path / "ws"))
    groups = pq.ParquetFile(path).num_row_groups
    assert {c[1] for c in calls} == {("text",)} and sorted({c[0] for c in calls}) == list(range(groups))


def _recipe(tmp_path: Path, source: Path | str, tokenizer=None, vocab_size: int = 512) -> Path:
    recipe = json.loads(json.dumps(MINI))
    recipe["base"]["data"] = {"source": str(source), "val_fraction": 0.2}
    if tokenizer is not None:
        recipe["base"]["data"]["tokenizer"] = tokenizer
    recipe["base"]["model"]["vocab_size"] = vocab_size
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def _truncate(path: Path) -> Path:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def _garble(path: Path) -> Path:
    data = bytearray(path.read_bytes())
    for i in range(len(data) // 3, len(data) // 3 + 64):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize(
    ("fmt", "damage"),
    [
        ("parquet", _truncate),
        ("parquet", _garble),
        ("jsonl.zst", _truncate),
        ("jsonl.zst", _garble),
        ("json.gz", _truncate),
        ("json.gz", _garble),
        ("datasets", _truncate),
    ],
)
def test_a_corrupt_or_truncated_file_is_one_line_naming_it(tmp_path, capsys, fmt, damage):
    docs = documents(200)
    made = {
        "parquet": lambda: write_parquet(tmp_path / "c" / "train.parquet", docs),
        "jsonl.zst": lambda: write_zst(tmp_path / "c" / "train.jsonl.zst", docs),
        "json.gz": lambda: write_gz(tmp_path / "c" / "train.json.gz", docs),
        "datasets": lambda: write_saved_dataset(tmp_path / "c", docs),
    }[fmt]()
    victim = made if made.is_file() else max(made.rglob("*.arrow"), key=lambda p: p.stat().st_size)
    damage(victim)
    code, _, err = run_cli(
        capsys,
        "prepare",
        str(_recipe(tmp_path, made)),
        "--out",
        str(tmp_path / "out"),
        "--workspace",
        str(tmp_path / "ws"),
        "--workers",
        "1",
    )
    assert_one_line_error(code, err, "data.source:", str(made))


def test_a_corrupt_tokenizer_json_is_one_line(tmp_path, capsys, corpora):
    bad = tmp_path / "tokenizer.json"
    bad.write_text('{"version": "1.0", "model": {"type": "BPE", "vocab": ')
    code, _, err = run_cli(
        capsys, "check", str(_recipe(tmp_path, corpora["jsonl"], {"name": "hf", "path": str(bad)}))
    )
    assert_one_line_error(code, err, "data.tokenizer.path:", str(bad), "not a readable tokenizer.json")


def test_the_vocabulary_is_checked_against_the_tokenizer_json_at_load(tmp_path, capsys, corpora):
    from tokenizers import Tokenizer

    need = Tokenizer.from_file(str(corpora["tokenizer"])).get_vocab_size()
    spec = {"name": "hf", "path": str(corpora["tokenizer"])}
    code, _, err = run_cli(
        capsys, "check", str(_recipe(tmp_path, corpora["jsonl"], spec, vocab_size=need - 1))
    )
    assert_one_line_error(
        code, err, f"model.vocab_size: {need - 1} is smaller than the vocabulary of", f"({need} tokens)"
    )
    code, out, _ = run_cli(capsys, "check", str(_recipe(tmp_path, corpora["jsonl"], spec, vocab_size=need)))
    assert code == 0 and "within tolerance" in out


def test_offline_hub_names_are_one_line_naming_the_local_alternatives(tmp_path, capsys, corpora, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # and no connection is tried: this machine has no network
    code, _, err = run_cli(
        capsys,
        "prepare",
        str(_recipe(tmp_path, "HuggingFaceFW/fineweb-edu")),
        "--out",
        str(tmp_path / "o"),
        "--workspace",
        str(tmp_path / "ws"),
    )
    assert_one_line_error(
        code,
        err,
        "data.source: 'HuggingFaceFW/fineweb-edu' is a Hugging Face hub id",
        "offline",
        "save_to_disk folder, parquet",
    )
    tok = {"name": "hf", "path": "meta-llama/Llama-2-7b-hf"}
    code, _, err = run_cli(capsys, "check", str(_recipe(tmp_path, corpora["jsonl"], tok)))
    assert_one_line_error(
        code,
        err,
        "data.tokenizer.path: 'meta-llama/Llama-2-7b-hf' is not a local",
        "never downloads a tokenizer",
    )


def test_unknown_text_column_names_the_columns(tmp_path):
    path = write_parquet(tmp_path / "c.parquet", documents(30))
    with pytest.raises(
        UserError, match=r"data.text_key: .*c.parquet has no column 'body' \(it has: id, text\)"
    ):
        load_tokens({"source": str(path), "text_key": "body"}, Workspace(tmp_path / "ws"))
