"""`attention_backend: auto` and `train.compile: auto` on CUDA: every candidate (backend x compiled) timed
once per card and shape, the fastest kept, cached in the workspace (a real file) and recorded in the run's
tags; off CUDA `compile: auto` trains eager. Driven on a CPU
through the timer seam with injected timings; the real timer runs on CUDA only."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from ablate.core.workspace import Workspace
from ablate.model.config import ModelConfig
from ablate.model.decoder import build_model
from ablate.train.choices.attention import BACKENDS, choose_attention, training_config
from ablate.train.config import TrainConfig

MODEL = ModelConfig(vocab_size=64, d_model=16, n_layers=1, head_dim=8)
TRAIN = TrainConfig(seq_len=32, micro_batch_size=2, batch_tokens=512, steps=4, lr=1e-3, compile=True)
CARD = "NVIDIA H200|sm90|torch=2.11"


class Timings:
    """Injected step seconds per (backend, compiled); a missing entry cannot run (None)."""

    def __init__(self, seconds: dict[tuple[str, bool], float]):
        self.seconds = seconds
        self.calls: list[tuple] = []

    def __call__(self, model, train, precision, device):
        backend, compiled = model.attention_backend, train.compile
        self.calls.append((backend, compiled, train.seq_len, train.micro_batch_size, precision, device))
        return self.seconds.get((backend, compiled))


def choose(timer, cache, model=MODEL, train=TRAIN, device="cuda", card=CARD):
    return choose_attention(model, train, device, "bf16-mixed", cache, timer=timer, device_key=card)


def everything(**faster: float) -> dict[tuple[str, bool], float]:
    seconds = {(b, c): 0.100 for b in BACKENDS for c in (False, True)}
    for key, value in faster.items():
        backend, _, compiled = key.partition("__")
        seconds[(backend, compiled == "compiled")] = value
    return seconds


def test_the_fastest_whole_step_of_every_candidate_trains(tmp_path):
    timer = Timings(everything(sdpa_cudnn__compiled=0.040, triton=0.050, sdpa_flash=0.060))
    choice = choose(timer, tmp_path / "choices.json")
    assert (choice.backend, choice.compiled, choice.cached) == ("sdpa_cudnn", True, False)
    assert sorted((b, c) for b, c, *_ in timer.calls) == sorted(
        (b, c) for b in BACKENDS for c in (False, True)
    )
    assert {call[2:] for call in timer.calls} == {(32, 2, "bf16-mixed", "cuda")}  # the run's own step
    assert choice.model(MODEL).attention_backend == "sdpa_cudnn" and choice.train(TRAIN).compile is True
    assert build_model(choice.model(MODEL), seed=0) is not None
    tags = choice.tags()
    assert tags["ablate.attention_choice"] == "sdpa_cudnn+compile (fastest whole step, measured)"
    ms = json.loads(tags["ablate.attention_timings_ms"])
    assert len(ms) == 8 and ms["sdpa_cudnn+compile"] == 40.0 and ms["triton"] == 50.0


def test_a_candidate_that_cannot_run_is_left_out(tmp_path):
    seconds = everything(triton=0.010)
    del seconds[("triton", False)]  # no kernel here: the timer says None
    choice = choose(Timings(seconds), tmp_path / "choices.json")
    assert (
        choice.backend != "triton"
        and json.loads(choice.tags()["ablate.attention_timings_ms"])["triton"] is None
    )
    assert choose(Timings({}), tmp_path / "none.json") is None  # nothing ran: auto's rule stays


def test_measured_once_per_card_and_shape_then_read_from_the_workspace(tmp_path):
    cache = Workspace(tmp_path).attention_choices
    assert choose(Timings(everything(triton=0.010)), cache).backend == "triton"
    stored = json.loads(cache.read_text())
    (key,) = stored
    assert (
        key.startswith(CARD)
        and key.endswith("|seq=32|batch=2|bf16-mixed|compile=True")
        and stored[key]["triton"] == 0.010
    )
    again = Timings(everything(sdpa_flash=0.001))
    choice = choose(again, cache)
    assert (choice.backend, choice.cached, again.calls) == ("triton", True, [])
    assert choice.tags()["ablate.attention_choice"].endswith("cached in the workspace)")
    assert choose(again, cache, train=replace(TRAIN, seq_len=64)).backend == "sdpa_flash"  # another shape
    assert choose(again, cache, card="NVIDIA H100|sm90|torch=2.11").backend == "sdpa_flash"  # another card
    assert len(json.loads(cache.read_text())) == 3


def test_a_run_not_asking_for_compile_times_the_eager_candidates_only(tmp_path):
    timer = Timings(everything(sdpa_cudnn__compiled=0.001, sdpa_efficient=0.050))
    choice = choose(timer, tmp_path / "choices.json", train=replace(TRAIN, compile=False))
    assert (choice.backend, choice.compiled) == ("sdpa_efficient", False)
    assert sorted(b for b, c, *_ in timer.calls) == sorted(BACKENDS) and not any(
        c for _, c, *_ in timer.calls
    )
    assert choice.train(TRAIN).compile is False  # a compiled run trains eager where eager measured faster


def test_cpu_runs_and_explicit_backends_are_not_second_guessed(tmp_path):
    timer = Timings(everything())
    assert choose(timer, tmp_path / "c.json", device="cpu") is None
    assert choose(timer, tmp_path / "c.json", model=replace(MODEL, attention_backend="sdpa_flash")) is None
    assert timer.calls == [] and not (tmp_path / "c.json").exists()


def test_compile_auto_times_eager_and_compiled_of_an_explicit_backend(tmp_path):
    """The default `compile: auto` on CUDA: the run's own backend, eager and compiled; the faster trains."""
    timer = Timings(everything(sdpa_cudnn__compiled=0.030, sdpa_flash__compiled=0.001))
    cudnn = replace(MODEL, attention_backend="sdpa_cudnn")
    choice = choose(timer, tmp_path / "c.json", model=cudnn, train=replace(TRAIN, compile="auto"))
    assert sorted((b, c) for b, c, *_ in timer.calls) == [("sdpa_cudnn", False), ("sdpa_cudnn", True)]
    assert (choice.backend, choice.compiled) == ("sdpa_cudnn", True)
    assert training_config(TrainConfig(**{**TRAIN.__dict__, "compile": "auto"}), choice).compile is True
    slower = Timings(everything(sdpa_cudnn=0.020, sdpa_cudnn__compiled=0.030))
    choice = choose(slower, tmp_path / "d.json", model=cudnn, train=replace(TRAIN, compile="auto"))
    assert (choice.backend, choice.compiled) == ("sdpa_cudnn", False)  # compiling measured slower: eager
    both = Timings(everything(triton__compiled=0.010))
    choice = choose(both, tmp_path / "e.json", train=replace(TRAIN, compile="auto"))
    assert len(both.calls) == 8 and (choice.backend, choice.compiled) == ("triton", True)


def test_compile_auto_off_cuda_and_compile_false_train_eager_untimed(tmp_path):
    timer = Timings(everything())
    auto = replace(TRAIN, compile="auto")
    assert TrainConfig(seq_len=32, micro_batch_size=2, batch_tokens=512, steps=4, lr=1e-3).compile == "auto"
    assert choose(timer, tmp_path / "c.json", train=auto, device="cpu") is None
    assert training_config(auto, None).compile is False and training_config(TRAIN, None).compile is True
    explicit = replace(MODEL, attention_backend="sdpa_flash")
    assert choose(timer, tmp_path / "c.json", model=explicit, train=replace(TRAIN, compile=False)) is None
    assert timer.calls == []


def test_compile_takes_true_false_or_auto_and_says_so_otherwise():
    from ablate.core.config import load_section
    from ablate.core.errors import UserError

    raw = {"seq_len": 8, "batch_tokens": 16, "micro_batch_size": 2, "steps": 1, "lr": 1e-3}
    for value in (True, False, "auto"):
        assert load_section(TrainConfig, {**raw, "compile": value}, "train").compile == value
    for value in ("yes", 1, "Auto"):
        with pytest.raises(UserError, match=r"^train\.compile: expected bool or auto, got "):
            load_section(TrainConfig, {**raw, "compile": value}, "train")
