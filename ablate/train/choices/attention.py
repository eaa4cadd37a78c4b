"""What a CUDA run trains on, decided by measuring what it decides: for `attention_backend: auto`, each
candidate core (cuDNN, flash, efficient, the fused `triton` kernel); for `train.compile: auto` (the
default), eager and under `torch.compile`; each candidate timed as the run's whole training step, once per
device and step shape; the fastest trains.

On the H200 `auto`'s rule resolved both arms to `sdpa_flash`, while cuDNN ran both cores 1.4-1.6x faster
(the device check's `a_timing.csv`), and compiling ran Diff at the eager Transformer's speed: a rule
written before a card runs is a guess, so CUDA runs measure. The timings are cached in the workspace
(`Workspace.attention_choices`, one JSON file, keyed by the card, its compute capability, torch's
version, the precision and the step's shape), so a sweep's runs of one shape measure once; every run
records the choice and every candidate's milliseconds in its tags (`ablate.attention_choice`,
`ablate.attention_timings_ms`). The run's identity keeps `auto` (the recipe's value): the choice changes
the kernels, not the run.

Off CUDA nothing is timed: `auto`'s attention is its rule (components/attention/backends.py) and
`compile: auto` trains eager (`training_config`). An explicit backend is never second-guessed, and
neither is `compile: false`; `compile: true` with `auto`'s attention times compiled and eager alike (a
compiled run trains eager where that measured faster). `timer` is the seam: tests inject timings on a
CPU and drive the choice, the cache and the record; the real timer (`time_candidate`) runs on CUDA only.
A candidate that cannot run there (no kernel for the width, no Triton) times as None and is left out.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from ablate.core import json_cache
from ablate.model.config import ModelConfig
from ablate.store import names
from ablate.train.choices.precision import shape_key
from ablate.train.config import TrainConfig

BACKENDS = ("sdpa_cudnn", "sdpa_flash", "sdpa_efficient", "triton")


def candidates(model: ModelConfig, compile: bool | str) -> tuple[tuple[str, bool], ...]:
    """(backend, compiled) pairs timed: every backend for `auto`'s attention, else the run's own; eager,
    and compiled too where `compile` is `auto`, or `true` beside `auto`'s attention (a cold compile of the
    whole model costs about 20 s a candidate on an H200, so `compile: false` does not pay for them)."""
    backends = BACKENDS if model.attention_backend == "auto" else (model.attention_backend,)
    if compile == "auto" or (compile is True and model.attention_backend == "auto"):
        compiled: tuple[bool, ...] = (False, True)
    else:
        compiled = (compile is True,)
    return tuple((backend, c) for c in compiled for backend in backends)


STEP_REPEATS = 3  # timed steps per candidate, the fastest counts, after warm-up (a compile's included)
WARMUP = 2

# (the run's model with the candidate's backend, its `train:` compiled as the candidate says, precision,
# device) -> seconds | None: what the run trains with if the candidate wins (`Choice.model`, `Choice.train`)
CandidateTimer = Callable[[ModelConfig, TrainConfig, str, str], "float | None"]


def name(backend: str, compiled: bool) -> str:
    return f"{backend}+compile" if compiled else backend


@dataclass(frozen=True)
class Choice:
    """The candidate that trains, and every candidate's seconds per step (None: could not run)."""

    backend: str
    compiled: bool
    timings: dict[str, float | None]
    cached: bool

    def model(self, model: ModelConfig) -> ModelConfig:
        return replace(model, attention_backend=self.backend)

    def train(self, train: TrainConfig) -> TrainConfig:
        return replace(train, compile=self.compiled)

    def tags(self) -> dict[str, str]:
        """What the run records: the choice and each candidate's milliseconds (the run's tags)."""
        ms = {k: None if v is None else round(v * 1e3, 3) for k, v in self.timings.items()}
        source = "cached in the workspace" if self.cached else "measured"
        return {
            names.ATTENTION_CHOICE: f"{name(self.backend, self.compiled)} (fastest whole step, {source})",
            names.ATTENTION_TIMINGS_MS: json.dumps(ms, sort_keys=True),
        }


def training_config(train: TrainConfig, choice: Choice | None) -> TrainConfig:
    """The run's `train:` as it trains: compiled as `choice` measured, else as it asks (`compile: auto`
    with nothing measured, i.e. off CUDA: eager)."""
    return choice.train(train) if choice else replace(train, compile=train.compile is True)


def cuda_device_key(device: str = "cuda") -> str:
    """The card, its compute capability and torch's version: what a candidate's speed depends on beside
    the shape."""
    where = torch.device(device)
    major, minor = torch.cuda.get_device_capability(where)
    return f"{torch.cuda.get_device_name(where)}|sm{major}{minor}|torch={torch.__version__}"


def time_candidate(model: ModelConfig, train: TrainConfig, precision: str, device: str) -> float | None:
    """Seconds of one training step of the run (`model`, `train`: ablate.train.choices.timed_step, its optimizer
    and compiling) on CUDA: the fastest of `STEP_REPEATS` after `WARMUP` steps; None where the candidate
    cannot run there."""
    from ablate.hardware.device import device_ops
    from ablate.train.choices.timed_step import build_step, train_step

    try:
        step = build_step(model, train, precision, device_ops(device))
        for _ in range(WARMUP):
            train_step(step)
        return min(train_step(step)[0] for _ in range(STEP_REPEATS))
    except Exception:  # a backend without a kernel here (width, dtype, card) or without Triton
        return None
    finally:
        torch.cuda.empty_cache()


def decides(model: ModelConfig, train: TrainConfig, device: str) -> bool:
    """Whether the choice is measured: on CUDA, between more than one candidate."""
    return device.split(":", 1)[0] == "cuda" and len(candidates(model, train.compile)) > 1


def choose_attention(
    model: ModelConfig,
    train: TrainConfig,
    device: str,
    precision: str,
    cache: Path,
    *,
    timer: CandidateTimer = time_candidate,
    device_key: str | None = None,
) -> Choice | None:
    """The fastest candidate for `model`'s step on `device` (None: not decided here, or nothing ran),
    from `cache` (a JSON file, ablate.core.json_cache) where this card and shape were measured before
    (an entry without every candidate's timing is measured again), else measured and cached."""
    if not decides(model, train, device):
        return None
    pairs = candidates(model, train.compile)
    seq_len, batch = train.seq_len, train.micro_batch_size

    def measure() -> dict[str, float | None]:
        return {
            name(b, c): timer(
                replace(model, attention_backend=b), replace(train, compile=c), precision, device
            )
            for b, c in pairs
        }

    key = f"{device_key or cuda_device_key(device)}|{shape_key(model, seq_len, batch)}"
    timings, cached = json_cache.measured_once(
        cache,
        f"{key}|{precision}|compile={train.compile}",
        measure,
        lambda entry: json_cache.numbers(entry, [name(b, c) for b, c in pairs], none=True),
    )
    ran = [(seconds, b, c) for b, c in pairs if (seconds := timings.get(name(b, c))) is not None]
    if not ran:
        return None
    _, backend, compiled = min(ran)
    return Choice(backend, compiled, dict(timings), cached)
