"""`train.compile`: the time spent compiling is measured apart from training time (dynamo's accounting)
and shown on the progress line, which leaves it out of the rate."""

from __future__ import annotations

import io
import types

import torch

from ablate.train.module import compile_seconds
from ablate.train.progress import StepProgress, progress_line


def test_compile_seconds_grows_when_something_compiles():
    before = compile_seconds()
    torch._dynamo.reset()
    fn = torch.compile(lambda x: torch.sin(x) * 3 + x.mean(), backend="eager")
    fn(torch.randn(7, 5))
    compiled = compile_seconds() - before
    assert compiled > 0
    fn(torch.randn(7, 5))  # cached: no more compiling
    assert compile_seconds() - before == compiled


def test_progress_line_shows_compile_time_apart():
    line = progress_line(30, 120, 8192, 4.5, float("nan"), 4096.0, 100.0, compile_seconds=40.0)
    assert line.endswith("elapsed 1:40  ETA 3:00  compile 0:40")
    assert "compile" not in progress_line(30, 120, 8192, 4.5, float("nan"), 4096.0, 100.0)


def test_the_rate_leaves_compile_time_out():
    clock = iter([5.0, 45.0])  # seconds compiled: at the start, then 40 more
    bar = StepProgress(batch_tokens=100, stream=io.StringIO(), compile_clock=lambda: next(clock))
    trainer = types.SimpleNamespace(global_step=0, max_steps=20, callback_metrics={})
    bar.on_train_start(trainer, None)
    start = bar._start[0]
    trainer.global_step = 10
    line = bar.line(trainer, start + 50.0)  # 10 steps x 100 tokens in 50 s, 40 of them compiling
    assert "100 tok/s" in line and line.endswith("elapsed 0:50  ETA 0:10  compile 0:40")
