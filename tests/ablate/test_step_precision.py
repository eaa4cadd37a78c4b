"""`auto` on a CPU that claims native bf16 picks the precision by the run's whole training step, timed both
ways (injected timings here; the real timer once, at a toy size), cached per machine and shape in real
files, and named in the reason; `ablate bench` prints the timings it chose by."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import ablate.hardware.precision as precision_module
from ablate.hardware.precision import ENV
from ablate.model.config import ModelConfig
from ablate.train.choices.precision import choose_step_precision, step_timings, time_step
from ablate.train.config import TrainConfig
from ablate.verbs.bench import run_bench

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "table6.yaml"
FLAGGED = "flags\t\t: fpu avx2 avx512f avx512_bf16\n"  # a CPU whose flags claim native bf16
PLAIN = "flags\t\t: fpu avx2\n"
MODEL = ModelConfig(vocab_size=64, d_model=16, n_layers=1, head_dim=8)


class Timings:
    """An injected step timer: seconds per precision, and every call it got."""

    def __init__(self, **seconds: float):
        self.seconds = {"32-true": seconds["f32"], "bf16-mixed": seconds["bf16"]}
        self.calls: list[tuple] = []

    def __call__(self, model, train, precision):
        self.calls.append((train.seq_len, train.micro_batch_size, precision))
        return self.seconds[precision]


def choose(timer, tmp_path, cpuinfo=FLAGGED, requested="auto", device="cpu", seq_len=32, batch=2, **env):
    return choose_step_precision(
        requested,
        device,
        MODEL,
        _train(seq_len, batch),
        timer=timer,
        folder=tmp_path,
        environ=env,
        cpuinfo=cpuinfo,
    )


def _train(seq_len: int, batch: int) -> TrainConfig:
    return TrainConfig(
        seq_len=seq_len, micro_batch_size=batch, batch_tokens=seq_len * batch, steps=4, lr=1e-3
    )


@pytest.mark.parametrize("f32, bf16, chosen", [(0.010, 0.004, "bf16-mixed"), (0.010, 0.012, "32-true")])
def test_auto_keeps_the_faster_whole_step(tmp_path, f32, bf16, chosen):
    timer = Timings(f32=f32, bf16=bf16)
    precision, why, timings = choose(timer, tmp_path)
    assert precision == chosen and timings == {"32-true": f32, "bf16-mixed": bf16}
    assert sorted(timer.calls) == [(32, 2, "32-true"), (32, 2, "bf16-mixed")]
    assert "CPU has AMX/AVX512-BF16: avx512_bf16; measured one training step (32 x 2, " in why
    assert f"32-true {f32 * 1e3:.1f} ms, bf16-mixed {bf16 * 1e3:.1f} ms" in why
    assert why.endswith(("bf16" if chosen == "bf16-mixed" else "float32") + " is faster")


def test_the_timings_are_cached_per_shape_in_real_files(tmp_path):
    timer = Timings(f32=0.010, bf16=0.004)
    assert choose(timer, tmp_path)[0] == "bf16-mixed"
    cached = json.loads((tmp_path / "step_precision.json").read_text())
    (key,) = cached
    assert "|seq=32|batch=2" in key and cached[key] == {"32-true": 0.010, "bf16-mixed": 0.004}
    slower = Timings(f32=0.001, bf16=0.004)  # the same shape again: the cache answers, nothing is timed
    assert choose(slower, tmp_path)[0] == "bf16-mixed" and slower.calls == []
    assert choose(slower, tmp_path, seq_len=64)[0] == "32-true" and len(slower.calls) == 2  # a new shape
    cached[key] = {"32-true": 0.001, "bf16-mixed": 0.002}  # the file is what is read
    (tmp_path / "step_precision.json").write_text(json.dumps({**cached}))
    assert choose(Timings(f32=9, bf16=1), tmp_path)[0] == "32-true"


@pytest.mark.parametrize(
    "kwargs, precision, reason",
    [
        ({"cpuinfo": PLAIN}, "32-true", "CPU without AMX/AVX512-BF16"),
        ({ENV: "1"}, "bf16-mixed", f"{ENV}=1 forces"),
        ({ENV: "0"}, "32-true", f"{ENV}=0 forces"),
        ({"requested": "32-true"}, "32-true", "as requested"),
    ],
)
def test_nothing_is_timed_where_the_rule_answers(tmp_path, kwargs, precision, reason):
    timer = Timings(f32=1.0, bf16=0.1)
    chosen, why, timings = choose(timer, tmp_path, **kwargs)
    assert (chosen, timings, timer.calls) == (precision, {}, []) and why.startswith(reason)
    assert not (tmp_path / "step_precision.json").exists()


def test_the_real_timer_times_a_training_step(tmp_path):
    assert time_step(MODEL, _train(16, 2), "32-true") > 0
    timings = step_timings(MODEL, _train(16, 2), folder=tmp_path)  # both candidates, the real timer, cached
    assert set(timings) == {"32-true", "bf16-mixed"} and min(timings.values()) > 0
    assert json.loads((tmp_path / "step_precision.json").read_text())


def test_bench_prints_the_timings_it_chose_by(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setenv("ABLATE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(precision_module, "_read_cpuinfo", lambda: FLAGGED)  # the machine probe's seam
    timer = Timings(f32=0.020, bf16=0.050)
    run_bench(
        str(RECIPE), scale="tiny", variants=["transformer", "diff"], seq_lens=[64], rounds=1,
        out=str(tmp_path / "bench"), tokens_per_step=256, device="cpu", peak_budget_s=0.05,
        peak_max_size=256, step_timer=timer,
    )  # fmt: skip
    assert timer.calls == [(64, 4, "32-true"), (64, 4, "bf16-mixed")]  # the first arm's step, 4 x 64
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("precision: 32-true (CPU has AMX/AVX512-BF16: avx512_bf16; measured one training")
    assert "32-true 20.0 ms, bf16-mixed 50.0 ms: float32 is faster)" in first
    assert "32-true 20.0 ms, bf16-mixed 50.0 ms" in (tmp_path / "bench" / "bench.md").read_text()
