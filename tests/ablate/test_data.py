"""Corpora, tokenizers, the token cache and shards: the `data:` section on small generated corpora."""

import json
import os
import random
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from ablate.core.errors import UserError
from ablate.core.workspace import Workspace
from ablate.data import load_tokens, parse_data_config, prepare, vocab_size_for, vocab_size_of
from ablate.data.corpus import open_text_corpus
from ablate.data.shards import dtype_for, read_shards
from ablate.data.tokenizers import ByteTokenizer, bpe_cache_path, get_tokenizer

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "lambda", "theta", "sigma", "omega", "kappa"]


def make_folder(root: Path, n_files: int = 30, seed: int = 0, words=WORDS) -> Path:
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n_files):
        sub = root / ("sub" if i % 3 == 0 else "")
        sub.mkdir(exist_ok=True)
        text = "\n".join(" ".join(rng.choice(words) for _ in range(12)) for _ in range(20))
        (sub / f"doc{i:03d}.txt").write_text(text + f"\nfile {i}\n")
    return root


def corpus_of(path: Path, **cfg):
    return open_text_corpus(parse_data_config({"source": str(path), **cfg}))


def one_line_error(exc_info) -> str:
    msg = str(exc_info.value)
    assert "\n" not in msg
    return msg


# --- corpus: split and fingerprint -------------------------------------------------------------------


def test_val_split_by_file_is_disjoint_deterministic_and_stable(tmp_path):
    folder = make_folder(tmp_path / "c", n_files=40)
    corpus = corpus_of(folder, val_fraction=0.2)
    train, val = corpus.document_keys("train"), corpus.document_keys("val")
    assert val and train
    assert not set(train) & set(val)
    all_files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.txt"))
    assert sorted(train + val) == all_files  # one document per file, each in exactly one split
    assert corpus.fingerprint["val_documents"] == len(val) and corpus.fingerprint["documents"] == 40
    # deterministic, and a new file moves no existing document between the splits
    assert corpus_of(folder, val_fraction=0.2).document_keys("val") == val
    (folder / "zzz_new.txt").write_text("a new document\n")
    again = corpus_of(folder, val_fraction=0.2)
    assert set(again.document_keys("val")) - {"zzz_new.txt"} == set(val)
    # the texts of a split are the files' texts
    texts = list(corpus.documents("val"))
    assert texts == [(folder / k).read_text() for k in val]


def test_small_corpus_still_gets_one_val_document(tmp_path):
    folder = make_folder(tmp_path / "c", n_files=3)
    corpus = corpus_of(folder, val_fraction=0.01)
    assert len(corpus.document_keys("val")) == 1 and len(corpus.document_keys("train")) == 2


def test_fingerprint_changes_with_content_only(tmp_path):
    folder = make_folder(tmp_path / "c", n_files=10)
    fp = corpus_of(folder).fingerprint
    assert corpus_of(folder).fingerprint == fp
    assert len(fp["sha256"]) == 64 and fp["files"] == 10 and fp["source"] == str(folder)
    doc = folder / "doc004.txt"
    doc.write_text(doc.read_text().replace("file 4", "file 5"))  # same length, one byte differs
    changed = corpus_of(folder).fingerprint
    assert changed["sha256"] != fp["sha256"]
    assert {k: v for k, v in changed.items() if k != "sha256"} == {
        k: v for k, v in fp.items() if k != "sha256"
    }


def test_jsonl_and_separator_sources(tmp_path):
    jl = tmp_path / "d.jsonl"
    rows = [{"body": f"record {i} " * 3, "id": i} for i in range(8)]
    jl.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    corpus = corpus_of(jl, text_key="body", val_fraction=0.25)
    docs = list(corpus.documents("train")) + list(corpus.documents("val"))
    assert sorted(docs) == sorted(r["body"] for r in rows)
    assert all(k.startswith("d:") for k in corpus.document_keys("val"))  # records: file stem, then line
    assert corpus.fingerprint["text_key"] == "body"

    with pytest.raises(UserError) as e:
        corpus_of(jl)  # text_key defaults to "text"
    assert one_line_error(e).startswith("data.text_key: ") and "has no field 'text'" in str(e.value)

    txt = tmp_path / "stories.txt"
    txt.write_text("<|sep|>".join(f"story {i}" for i in range(10)))
    corpus = corpus_of(txt, separator="<|sep|>")
    assert corpus.fingerprint["documents"] == 10
    with pytest.raises(UserError) as e:
        corpus_of(txt)  # one document: nothing to hold out by document
    assert one_line_error(e).startswith("data.source: ") and "data.separator" in str(e.value)


def test_bad_jsonl_line_is_a_user_error(tmp_path):
    jl = tmp_path / "bad.jsonl"
    jl.write_text('{"text": "ok"}\n{"text": oops}\n')
    with pytest.raises(UserError) as e:
        corpus_of(jl)
    assert one_line_error(e).startswith(f"data.source: {jl} line 2 is not valid JSON")


def test_missing_and_empty_sources_are_user_errors(tmp_path):
    missing = tmp_path / "x" / "y"
    with pytest.raises(UserError) as e:
        load_tokens({"source": str(missing)}, Workspace(tmp_path / "ws"))
    assert one_line_error(e) == (
        f"data.source: {missing} does not exist; give a text, .jsonl(.gz/.zst), .json.gz or parquet file, "
        "a folder of them, a saved dataset, a shard folder or 'stdlib'"
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "a.txt").write_text("")
    (empty / "b.txt").write_text("")
    with pytest.raises(UserError) as e:
        load_tokens({"source": str(empty)}, Workspace(tmp_path / "ws"))
    assert one_line_error(e).startswith(f"data.source: {empty} holds no text")


def test_unknown_keys_and_tokenizers_are_user_errors():
    with pytest.raises(UserError) as e:
        parse_data_config({"sourse": "stdlib"})
    assert one_line_error(e).startswith("data.sourse: unknown key (did you mean 'source'?)")
    with pytest.raises(UserError) as e:
        parse_data_config({"tokenizer": "bytes"})
    assert one_line_error(e).startswith("data.tokenizer: unknown tokenizer 'bytes' (did you mean 'byte'?)")
    with pytest.raises(UserError) as e:
        parse_data_config({"tokenizer": {"name": "bpe", "vocab_size": 100}})
    assert one_line_error(e).startswith("data.tokenizer.vocab_size: 100 is not an integer in [257,")
    with pytest.raises(UserError) as e:
        parse_data_config({"tokenizer": {"name": "byte", "vocab_size": 300}})
    assert one_line_error(e).startswith("data.tokenizer.vocab_size: not an option of 'byte'")


# --- tokenizers ----------------------------------------------------------------------------------------


def test_byte_tokenizer_round_trip():
    tok = ByteTokenizer()
    text = "héllo wörld ✓ 𝄞 tabs\tand\nnewlines"
    ids = tok.encode(text)
    assert ids.tolist() == list(text.encode("utf-8"))
    assert tok.decode(ids.tolist()) == text
    assert (tok.vocab_size, tok.eos_id) == (257, 256)
    assert vocab_size_of("byte") == 257 and vocab_size_of({"name": "bpe", "vocab_size": 999}) == 999


def test_bpe_trains_on_train_split_only_caches_and_respects_vocab_size(tmp_path):
    folder = make_folder(tmp_path / "c", n_files=20)
    corpus = corpus_of(folder, val_fraction=0.2)
    val_key = corpus.document_keys("val")[0]
    (folder / val_key).write_text("zqxjv " * 2000)  # letters no train document has; the split stays
    corpus = corpus_of(folder, val_fraction=0.2)
    spec = {"name": "bpe", "vocab_size": 300}
    ws = Workspace(tmp_path / "ws")

    data = load_tokens({"source": str(folder), "tokenizer": spec, "val_fraction": 0.2}, ws)
    assert data.vocab_size == 300 and data.tokenizer == "bpe-300"
    assert int(data.train.max()) < 300 and int(data.val.max()) < 300
    cache = bpe_cache_path(ws, corpus.fingerprint, 300)
    assert cache.exists()
    vocab = json.loads(cache.read_text())["model"]["vocab"]
    assert len(vocab) == 300  # 256 bytes + <|endoftext|> + 43 merges
    merged = [tok for tok in vocab if len(tok) > 1 and tok != "<|endoftext|>"]
    assert not [tok for tok in merged if set(tok) & set("zqxjv")]  # val text made no merges

    def must_not_train():
        raise AssertionError("the cached tokenizer should have been loaded")

    mtime = cache.stat().st_mtime_ns
    tok = get_tokenizer(spec, workspace=ws, fingerprint=corpus.fingerprint, train_documents=must_not_train)
    assert tok.eos_id == data.eos_id == 0
    assert tok.decode(tok.encode("gamma delta\nfile 3")) == "gamma delta\nfile 3"
    assert load_tokens({"source": str(folder), "tokenizer": spec, "val_fraction": 0.2}, ws).val.tolist() == (
        data.val.tolist()
    )
    assert cache.stat().st_mtime_ns == mtime


@pytest.mark.timeout(60)  # the code must never reach for the network; if it ever does, fail, don't hang
def test_tiktoken_unavailable_offline_is_a_user_error(tmp_path, monkeypatch):
    pytest.importorskip("tiktoken")
    import tiktoken.load

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty-cache"))
    read_file = tiktoken.load.read_file
    with pytest.raises(UserError) as e:
        load_tokens(
            {"source": str(make_folder(tmp_path / "c", 4)), "tokenizer": "tiktoken"},
            Workspace(tmp_path / "ws"),
        )
    msg = one_line_error(e)
    assert msg.startswith("data.tokenizer: tiktoken encoding 'cl100k_base' is not available offline (")
    assert str(tmp_path / "empty-cache") in msg and msg.endswith("use 'byte' or 'bpe'")
    assert tiktoken.load.read_file is read_file  # the offline guard is undone
    with pytest.raises(UserError):
        vocab_size_of({"name": "tiktoken", "encoding": "cl100k_base"})
    assert not (tmp_path / "ws" / "cache" / "tokens").exists() or not any(
        (tmp_path / "ws" / "cache" / "tokens").iterdir()
    )


def test_tiktoken_not_installed_is_a_user_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "tiktoken", None)  # what `import tiktoken` sees when it is absent
    with pytest.raises(UserError) as e:
        vocab_size_of("tiktoken")
    assert one_line_error(e).startswith("data.tokenizer: tiktoken is not installed;")


# --- token cache, prepare and shards ---------------------------------------------------------------------


def test_byte_tokens_join_documents_with_eos_and_hit_the_cache(tmp_path):
    folder = make_folder(tmp_path / "c", n_files=12)
    cfg = {"source": str(folder), "val_fraction": 0.2}
    data = load_tokens(cfg, Workspace(tmp_path / "ws"))
    corpus = corpus_of(folder, val_fraction=0.2)
    for split, tokens in (("train", data.train), ("val", data.val)):
        expected = []
        for text in corpus.documents(split):
            expected += list(text.encode()) + [256]
        assert tokens.tolist() == expected
    assert isinstance(data.train, np.memmap) and data.train.dtype == np.uint16
    assert data.fingerprint == corpus.fingerprint and (data.vocab_size, data.eos_id) == (257, 256)

    bins = list((tmp_path / "ws" / "cache" / "tokens").rglob("*.bin"))
    assert len(bins) == 2
    mtimes = [b.stat().st_mtime_ns for b in bins]
    again = load_tokens(cfg, Workspace(tmp_path / "ws"))
    assert [b.stat().st_mtime_ns for b in bins] == mtimes  # read, not rewritten
    assert again.train.tolist() == data.train.tolist()
    # a change of content is a new cache entry
    (folder / "doc001.txt").write_text("changed")
    load_tokens(cfg, Workspace(tmp_path / "ws"))
    assert len(list(Workspace(tmp_path / "ws").token_cache.rglob("*.bin"))) == 4


def test_prepare_writes_shards_that_read_back_identically(tmp_path):
    folder = make_folder(tmp_path / "c", n_files=12)
    cfg = {"source": str(folder), "val_fraction": 0.2}
    direct = load_tokens(cfg, Workspace(tmp_path / "ws"))
    out = tmp_path / "shards"
    paths = prepare(cfg, out, Workspace(tmp_path / "ws"), shard_tokens=1000)
    assert len(paths) > 2 and all(p.exists() and p.with_suffix(".json").exists() for p in paths)
    assert {p.parent.name for p in paths} == {"train", "val"}
    data = load_tokens({"source": str(out)}, Workspace(tmp_path / "ws2"))
    assert data.train.tolist() == direct.train.tolist() and data.val.tolist() == direct.val.tolist()
    assert (data.vocab_size, data.eos_id, data.tokenizer) == (257, 256, "byte")
    assert data.fingerprint["corpus"] == direct.fingerprint and len(data.fingerprint["sha256"]) == 64
    assert vocab_size_for({"source": str(out)}) == 257

    with pytest.raises(UserError) as e:
        prepare(cfg, out, Workspace(tmp_path / "ws"))
    assert one_line_error(e).startswith(f"out_dir: {out} exists and is not an empty folder")
    with pytest.raises(UserError) as e:
        load_tokens(
            {"source": str(out), "tokenizer": {"name": "bpe", "vocab_size": 512}}, Workspace(tmp_path / "ws2")
        )
    assert one_line_error(e).startswith("data.tokenizer: {'name': 'bpe', 'vocab_size': 512} differs from")


def test_dtype_follows_vocab_size(tmp_path):
    assert dtype_for(257) == np.uint16 and dtype_for(65536) == np.uint16 and dtype_for(65537) == np.uint32
    folder = make_folder(tmp_path / "c", n_files=6)
    for vocab, dtype, itemsize in ((300, "uint16", 2), (70000, "uint32", 4)):
        out = tmp_path / f"shards{vocab}"
        spec = {"name": "bpe", "vocab_size": vocab}
        paths = prepare({"source": str(folder), "tokenizer": spec}, out, Workspace(tmp_path / "ws"))
        header = json.loads(paths[0].with_suffix(".json").read_text())
        assert header["dtype"] == dtype and header["vocab_size"] == vocab
        assert paths[0].stat().st_size == header["count"] * itemsize
        assert read_shards(out).train.dtype.itemsize == itemsize
        assert (out / "tokenizer.json").exists()


def test_truncated_or_unreadable_shard_is_a_user_error(tmp_path):
    folder = make_folder(tmp_path / "c", n_files=6)
    out = tmp_path / "shards"
    train_bin = prepare({"source": str(folder)}, out, Workspace(tmp_path / "ws"))[0]
    count = json.loads(train_bin.with_suffix(".json").read_text())["count"]
    with open(train_bin, "r+b") as f:
        f.truncate(2 * count - 2)
    with pytest.raises(UserError) as e:
        load_tokens({"source": str(out)}, Workspace(tmp_path / "ws"))
    msg = one_line_error(e)
    assert msg.startswith(
        f"data.source: shard {train_bin} has {2 * count - 2} bytes but its header says {count}"
    )
    assert "truncated or corrupt" in msg

    train_bin.with_suffix(".json").write_text("{not json")
    with pytest.raises(UserError) as e:
        load_tokens({"source": str(out)}, Workspace(tmp_path / "ws"))
    assert one_line_error(e).startswith(
        f"data.source: shard header {train_bin.with_suffix('.json')} is unreadable"
    )
    os.remove(train_bin.with_suffix(".json"))
    with pytest.raises(UserError) as e:
        load_tokens({"source": str(out)}, Workspace(tmp_path / "ws"))
    assert one_line_error(e).startswith(
        f"data.source: shard header {train_bin.with_suffix('.json')} is missing"
    )


def test_damaged_workspace_cache_is_rebuilt(tmp_path):
    folder = make_folder(tmp_path / "c", n_files=6)
    data = load_tokens({"source": str(folder)}, Workspace(tmp_path / "ws"))
    expected = data.train.tolist()
    del data
    (bin_path,) = (tmp_path / "ws" / "cache" / "tokens").rglob("train/*.bin")
    with open(bin_path, "r+b") as f:
        f.truncate(10)
    assert load_tokens({"source": str(folder)}, Workspace(tmp_path / "ws")).train.tolist() == expected


def test_stdlib_corpus_with_byte_tokenizer(tmp_path):
    data = load_tokens({}, Workspace(tmp_path / "ws"))
    fp = data.fingerprint
    assert fp["source"] == "stdlib" and fp["python"] == ".".join(map(str, sys.version_info[:3]))
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [
        p
        for p in root.rglob("*.py")
        if not {"site-packages", "test", "tests", "idlelib"} & set(p.relative_to(root).parts[:-1])
    ]
    sizes = [p.stat().st_size for p in files]
    assert fp["files"] == len(files) > 300
    # every non-empty file is one document of UTF-8 bytes, each followed by the end-of-document token
    assert len(data.train) + len(data.val) == sum(sizes) + sum(s > 0 for s in sizes)
    assert int(np.count_nonzero(data.val == 256)) == fp["val_documents"]
    assert 0.01 < len(data.val) / (len(data.train) + len(data.val)) < 0.1
