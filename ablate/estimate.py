"""The plan a sweep prints before it starts: trials, tokens, FLOPs, and time from a short calibration.

Calibration times forward + backward passes on this machine, in the run's precision. When one
micro-batch of the real model is cheap (small scales) the real model is timed; otherwise a one-layer
model of the same width and vocabulary on one short sequence, whose FLOP rate stands in for the whole.
The estimate is training FLOPs / measured FLOP rate; validation and start-up add a little on top.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ablate.budget import model_budget
from ablate.config import deep_merge
from ablate.model import build_model
from ablate.recipe import RunSpec

REAL_MODEL_LIMIT = 5e10  # training FLOPs of one calibration micro-batch above which the probe is used


@dataclass
class Plan:
    trials: int
    tokens: int
    train_flops: float
    flops_per_s: float

    @property
    def seconds(self) -> float:
        return self.train_flops / self.flops_per_s * 1.1  # +10%: validation, checkpoints, start-up


def calibrate(run: RunSpec, repeats: int = 4) -> float:
    """Measured training FLOP/s for `run`'s shapes on this machine: the fastest of `repeats` timed steps,
    so that a moment of contention from other processes does not inflate the estimate many times over."""
    model_cfg, train = run.config["model"], run.train
    seq_len, batch = train.seq_len, train.micro_batch_size
    flops = 3 * model_budget(model_cfg, seq_len).fwd_flops_per_token * seq_len * batch
    if flops > REAL_MODEL_LIMIT:
        model_cfg = deep_merge(model_cfg, {"n_layers": 1})
        seq_len, batch = min(seq_len, 256), 1
        flops = 3 * model_budget(model_cfg, seq_len).fwd_flops_per_token * seq_len * batch
    model = build_model(model_cfg, seed=0)
    tokens = torch.randint(0, model_cfg["vocab_size"], (batch, seq_len))
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=train.precision.startswith("bf16"))

    def step() -> None:
        with autocast:
            loss = model(tokens).float().logsumexp(-1).mean()
        loss.backward()

    step()  # warm-up
    fastest = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        step()
        fastest = min(fastest, time.perf_counter() - started)
    return flops / fastest


def make_plan(runs: list[RunSpec]) -> Plan:
    tokens = sum(r.train.tokens for r in runs)
    flops = sum(3 * model_budget(r.config["model"], r.train.seq_len).fwd_flops_per_token * r.train.tokens
                for r in runs)
    largest = max(runs, key=lambda r: model_budget(r.config["model"], r.train.seq_len).params)
    return Plan(trials=len(runs), tokens=tokens, train_flops=flops, flops_per_s=calibrate(largest))
