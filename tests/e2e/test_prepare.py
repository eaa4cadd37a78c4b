"""`ablate prepare` as a preprocessing tool: every core, a progress line, a manifest, and a resume after
a kill that ends with the same shards as an uninterrupted run (real processes, real SIGKILL)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from mini_project import MINI, cli_command

from ablate.core.workspace import Workspace
from ablate.data import load_tokens

WORDS = [f"w{i}" for i in range(300)] + ["the", "of", "and", "über", "東京", "λ", "(", ")", ":"]


def write_corpus(folder: Path, n_docs: int, words_per_doc: int = 300, seed: int = 0) -> Path:
    """JSON lines, zstd-compressed, in three files (a folder source)."""
    import random

    import zstandard

    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for part in range(3):
        lines = [
            json.dumps({"text": " ".join(rng.choice(WORDS) for _ in range(words_per_doc))})
            for _ in range(n_docs // 3)
        ]
        (folder / f"part{part}.jsonl.zst").write_bytes(
            zstandard.ZstdCompressor().compress(("\n".join(lines) + "\n").encode())
        )
    return folder


def tokenizer_json(path: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=2000, special_tokens=["</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator([" ".join(WORDS * 3)] * 20, trainer=trainer)
    tok.save(str(path))
    return path


def recipe(tmp_path: Path, source: Path, tok: Path) -> Path:
    raw = json.loads(json.dumps(MINI))
    raw["base"]["model"]["vocab_size"] = 2048
    raw["base"]["data"] = {
        "source": str(source),
        "tokenizer": {"name": "hf", "path": str(tok)},
        "val_fraction": 0.1,
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def files_of(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


@pytest.mark.slow
def test_prepare_killed_midway_finishes_with_the_shards_of_an_uninterrupted_run(tmp_path):
    source = write_corpus(tmp_path / "corpus", n_docs=6000)
    path = recipe(tmp_path, source, tokenizer_json(tmp_path / "tokenizer.json"))

    def command(out: Path) -> list[str]:
        return cli_command(
            "prepare", str(path), "--out", str(out), "--workspace", str(tmp_path / "ws"),
            "--workers", "2", "--shard-tokens", "20000",
        )  # fmt: skip

    reference = tmp_path / "reference"
    done = subprocess.run(command(reference), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "[prepare]" in done.stderr and "tokens/s" in done.stderr and "MB read" in done.stderr
    manifest = json.loads((reference / "manifest.json").read_text())
    assert manifest["splits"]["train"]["shards"] > 10 and manifest["tokenizer"]["eos"] == "</s>"
    assert manifest["fingerprint"]["documents"] == 6000 and manifest["splits"]["val"]["tokens"] > 0

    out = tmp_path / "resumed"
    proc = subprocess.Popen(
        command(out), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    while not (out / "train" / "000003.json").exists() and proc.poll() is None:  # pytest's timeout: hangs
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL and not (out / "manifest.json").exists()  # killed mid-way
    kept = {p.name for p in (out / "train").glob("*.json")}
    assert len(kept) >= 4

    again = subprocess.run(command(out), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert files_of(out) == files_of(reference)  # byte for byte, every shard, sidecar and the manifest

    # `ablate train` on the shard folder reads the same tokens as on the raw source (the workspace cache
    # is built by the same code in one process)
    shards = load_tokens({"source": str(out)}, Workspace(tmp_path / "ws2"))
    raw = yaml.safe_load(path.read_text())["base"]["data"]
    direct = load_tokens(raw, Workspace(tmp_path / "ws3"))
    assert np.array_equal(np.asarray(shards.train), np.asarray(direct.train))
    assert np.array_equal(np.asarray(shards.val), np.asarray(direct.val))


def test_prepare_refuses_a_folder_of_another_preparation(tmp_path, capsys):
    from ablate.cli import main

    def run_cli(capsys, *argv):
        code = main([str(a) for a in argv])
        return (code, *capsys.readouterr())

    def assert_one_line_error(code, err, fragment):
        assert code == 2 and len(err.strip().splitlines()) == 1 and fragment in err, err

    source = write_corpus(tmp_path / "corpus", n_docs=30, words_per_doc=20)
    path = recipe(tmp_path, source, tokenizer_json(tmp_path / "tokenizer.json"))
    out = tmp_path / "out"
    out.mkdir()
    (out / "prepare.json").write_text(json.dumps({"format": 1, "fingerprint": {}, "tokenizer": {}}))
    (out / "train").mkdir()
    code, _, err = run_cli(
        capsys, "prepare", str(path), "--out", str(out), "--workspace", str(tmp_path / "ws")
    )
    assert_one_line_error(code, err, f"out_dir: {out} holds an unfinished `ablate prepare` of another corpus")
    for damaged in (b"\xff\xfe{", b"[]", b"{not json"):  # read as another preparation's, not a traceback
        (out / "prepare.json").write_bytes(damaged)
        code, _, err = run_cli(
            capsys, "prepare", str(path), "--out", str(out), "--workspace", str(tmp_path / "ws")
        )
        assert_one_line_error(code, err, f"out_dir: {out} holds an unfinished `ablate prepare`")
    code, _, err = run_cli(capsys, "prepare", str(path), "--out", str(out), "--workers", "0")
    assert_one_line_error(code, err, "--workers: 0 is not a positive integer")
