"""Every measurement cache reads a malformed file as absent, through one helper (ablate.core.json_cache):
the helper on real files of every wrong kind, then each cache that uses it (the CPU's matmul rates, a
step's precision timings, `auto`'s attention choice, the `triton` launch configurations), each given a
damaged real file: measured again, rewritten, the good entries of the file kept, nothing left beside it."""

from __future__ import annotations

import json
import math
import os
from dataclasses import astuple
from pathlib import Path

import pytest
import torch

from ablate.core import json_cache
from ablate.core.workspace import Workspace
from ablate.hardware.precision import choose_precision, machine_key, measured_rates
from ablate.model.config import ModelConfig
from ablate.train.choices.attention import choose_attention
from ablate.train.choices.precision import shape_key, step_timings
from ablate.train.config import TrainConfig
from components.attention.triton.configs import FILE, Chooser, Config, Key, candidates

FLAGGED = "flags\t\t: fpu avx2 avx512f avx512_bf16\n"  # a CPU whose flags claim native bf16
MODEL = ModelConfig(vocab_size=64, d_model=16, n_layers=1, head_dim=8)
TRAIN = TrainConfig(seq_len=32, micro_batch_size=2, batch_tokens=512, steps=4, lr=1e-3, compile=False)
CARD = "NVIDIA H200|sm90|torch=2.11"

DAMAGED = {  # file bytes a cache must read as holding nothing
    "empty": b"",
    "not json": b"{not json",
    "a list": b"[]",
    "null": b"null",
    "a string": b'"precision"',
    "not utf-8": b'{"k": "\xff\xfe"}',
    "too deep": b"[" * 100_000 + b"]" * 100_000,
}


def rates(entry):
    return json_cache.numbers(entry, ("float32", "bfloat16"))


def files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.parametrize("data", DAMAGED.values(), ids=DAMAGED.keys())
def test_a_damaged_file_reads_as_empty_and_is_rewritten_whole(tmp_path, data):
    path = tmp_path / "cache.json"
    path.write_bytes(data)
    assert json_cache.read(path) == {}
    value, cached = json_cache.measured_once(path, "k", lambda: {"float32": 1.0, "bfloat16": 2.0}, rates)
    assert (value, cached) == ({"float32": 1.0, "bfloat16": 2.0}, False)
    assert json.loads(path.read_text()) == {"k": value} and files(tmp_path) == ["cache.json"]
    assert json_cache.measured_once(path, "k", lambda: pytest.fail("measured twice"), rates) == (value, True)


def test_what_is_no_regular_file_reads_as_absent_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "fifo.json")  # opened for reading, a FIFO without a writer would block forever
    (tmp_path / "folder.json").mkdir()
    (tmp_path / "real.json").write_text('{"k": {"float32": 1, "bfloat16": 2}}')
    (tmp_path / "link.json").symlink_to(tmp_path / "real.json")
    for name in ("fifo.json", "folder.json", "link.json", "missing.json"):
        assert json_cache.read(tmp_path / name) == {}, name
    assert json_cache.read(tmp_path / "real.json") == {"k": {"float32": 1, "bfloat16": 2}}


def test_a_file_over_the_bound_reads_as_absent(tmp_path, monkeypatch):
    path = tmp_path / "cache.json"
    path.write_text(json.dumps({"k": "x" * 100}))
    assert json_cache.read(path) != {}
    monkeypatch.setattr(json_cache, "MAX_BYTES", 50)
    assert json_cache.read(path) == {}


BAD_ENTRIES = [
    [],
    "fast",
    {"float32": 1.0},  # one rate missing
    {"float32": 1.0, "bfloat16": 2.0, "float16": 3.0},
    {"float32": "1.0", "bfloat16": 2.0},  # a number as a string
    {"float32": True, "bfloat16": 2.0},
    {"float32": math.nan, "bfloat16": 2.0},
    {"float32": math.inf, "bfloat16": 2.0},
    {"float32": -1.0, "bfloat16": 2.0},
    {"float32": None, "bfloat16": 2.0},
]


@pytest.mark.parametrize("entry", BAD_ENTRIES, ids=[json.dumps(e) for e in BAD_ENTRIES])
def test_a_malformed_entry_is_measured_again_and_dropped_the_good_ones_kept(tmp_path, entry):
    path = tmp_path / "cache.json"
    good = {"float32": 3.0, "bfloat16": 4}
    path.write_text(json.dumps({"k": entry, "bad": entry, "good": good}))
    value, cached = json_cache.measured_once(path, "k", lambda: {"float32": 1.0, "bfloat16": 2.0}, rates)
    assert (value, cached) == ({"float32": 1.0, "bfloat16": 2.0}, False)
    assert json.loads(path.read_text()) == {"k": value, "good": good}
    assert json_cache.measured_once(path, "good", lambda: pytest.fail("measured"), rates) == (
        {"float32": 3.0, "bfloat16": 4.0},
        True,
    )


def test_none_is_a_value_only_where_the_cache_allows_it():
    assert json_cache.numbers({"a": None, "b": 1}, ["a", "b"], none=True) == {"a": None, "b": 1.0}
    with pytest.raises(ValueError):
        json_cache.numbers({"a": None, "b": 1}, ["a", "b"])


def test_an_unwritable_cache_costs_a_measurement_and_nothing_else(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    path = tmp_path / "file" / "cache.json"  # its folder cannot be made (root writes anywhere else)
    for _ in range(2):
        assert (
            json_cache.measured_once(path, "k", lambda: {"float32": 1.0, "bfloat16": 2.0}, rates)[1] is False
        )
    assert files(tmp_path) == ["file"] and (tmp_path / "file").read_text() == "not a folder"


def test_a_write_goes_through_a_new_partial_file_never_a_planted_link(tmp_path):
    path = tmp_path / "cache.json"
    target = tmp_path / "elsewhere"
    target.write_text("kept")
    for pid_name in (f"cache.json.{os.getpid()}.partial", f".cache.json.{os.getpid()}.partial"):
        (tmp_path / pid_name).symlink_to(target)
    json_cache.add(path, {"k": 1})
    assert json.loads(path.read_text()) == {"k": 1} and target.read_text() == "kept"
    assert not path.is_symlink() and len(files(tmp_path)) == 4  # the two links, the target, the cache


def test_the_precision_cache_holding_a_list_is_measured_again(tmp_path, monkeypatch):
    """A cache holding `[]` ended `auto`'s choice on a bf16-flagged CPU in an AttributeError."""
    monkeypatch.setenv("ABLATE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("ABLATE_NATIVE_BF16", raising=False)
    (tmp_path / "precision.json").write_text("[]")
    precision, why = choose_precision("auto", "cpu", cpuinfo=FLAGGED, environ={})
    assert precision in ("32-true", "bf16-mixed") and "measured 512x512 matmul" in why
    stored = json.loads((tmp_path / "precision.json").read_text())
    assert list(stored) == [machine_key()] and set(stored[machine_key()]) == {"float32", "bfloat16"}
    (tmp_path / "precision.json").write_text(json.dumps({machine_key(): {"float32": 5.0}}))  # one rate
    assert set(measured_rates(tmp_path)) == {"float32", "bfloat16"}


def test_the_step_precision_cache_reads_a_damaged_entry_as_absent(tmp_path):
    key = f"{machine_key()}|{shape_key(MODEL, TRAIN.seq_len, TRAIN.micro_batch_size)}"
    (tmp_path / "step_precision.json").write_text(json.dumps({key: {"32-true": "slow", "bf16-mixed": 1}}))
    calls = []

    def timer(model, train, precision):
        calls.append(precision)
        return 0.5

    assert step_timings(MODEL, TRAIN, timer=timer, folder=tmp_path) == {"32-true": 0.5, "bf16-mixed": 0.5}
    assert sorted(calls) == ["32-true", "bf16-mixed"]
    assert json.loads((tmp_path / "step_precision.json").read_text()) == {
        key: {"32-true": 0.5, "bf16-mixed": 0.5}
    }


@pytest.mark.parametrize("stored", ["[]", "{}", '{"sdpa_flash": 0.001}', '{"sdpa_flash": "fast"}'])
def test_the_attention_choice_cache_reads_a_damaged_entry_as_absent(tmp_path, stored):
    cache = Workspace(tmp_path).attention_choices
    key = f"{CARD}|{shape_key(MODEL, TRAIN.seq_len, TRAIN.micro_batch_size)}|bf16-mixed|compile=False"
    cache.parent.mkdir(parents=True)
    cache.write_text(stored if stored == "[]" else f'{{"{key}": {stored}}}')
    timed = []

    def timer(model, train, precision, device):
        timed.append(model.attention_backend)
        return 0.001 if model.attention_backend == "sdpa_cudnn" else 0.002

    choice = choose_attention(MODEL, TRAIN, "cuda", "bf16-mixed", cache, timer=timer, device_key=CARD)
    assert (choice.backend, choice.cached, len(timed)) == ("sdpa_cudnn", False, 4)
    assert list(json.loads(cache.read_text())) == [key]  # the one key, step_precision's shape inside it
    again = choose_attention(MODEL, TRAIN, "cuda", "bf16-mixed", cache, timer=timer, device_key=CARD)
    assert (again.backend, again.cached, len(timed)) == ("sdpa_cudnn", True, 4)


def triton_key() -> Key:
    return Key("forward", 2, 64, 128, torch.bfloat16, 2048, (9, 0))


def chosen_by_block(config: Config) -> float:
    return float(config.block_m)


@pytest.mark.parametrize(
    "entry",
    [[], {"config": [7, 7, 7, 7]}, {"config": [0, 64, 4, 2]}, {"config": [64, 64, 4]},
     {"config": [64.5, 64, 4, 2]}, {"config": [64, 64, 4, 2], "ms": []}],
    ids=["a list", "no candidate", "a zero tile", "three numbers", "a float", "ms a list"],
)  # fmt: skip
def test_the_triton_launch_cache_reads_a_damaged_entry_as_absent(tmp_path, entry):
    name = triton_key().name()
    (tmp_path / FILE).write_text(json.dumps({name: entry}))
    calls = []

    def timer(run):
        calls.append(1)
        return chosen_by_block(run())

    best = Chooser(timer=timer, folder=tmp_path).choose(triton_key(), lambda config: config)
    wanted = min(candidates("forward", torch.bfloat16, 128), key=chosen_by_block)
    assert best == wanted and len(calls) == len(candidates("forward", torch.bfloat16, 128))
    assert json.loads((tmp_path / FILE).read_text())[name]["config"] == list(astuple(wanted))
    assert files(tmp_path) == [FILE]
    assert (
        Chooser(timer=lambda run: pytest.fail("timed"), folder=tmp_path).choose(
            triton_key(), lambda config: config
        )
        == wanted
    )
