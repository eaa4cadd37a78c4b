"""`ablate bench`: training and forward throughput, peak memory and MFU of a recipe's variants per
sequence length, interleaved in one run (the measurement itself: ablate.bench.measure), written to
`bench.csv`, `bench.md`, `ratios.csv` and `bench.png`.

`run_bench`'s options: `overrides`, dotted recipe overrides, as the other verbs take them; `backend`
overrides every arm's `attention_backend`; `compile` wraps each model in `torch.compile` (as
`train.compile` does); `device`: "cpu", "cuda", "cuda:N" (default: CUDA when present); `precision`:
"auto" (the device's rule, `ablate.hardware.precision`) or one of `PRECISIONS`; `tune_malloc` keeps freed
memory in glibc's heap (`tune_glibc_malloc`); `retries`: a measurement during which other processes used
more than `ablate.bench.measure.DISTURBED` of the CPU is taken again, up to this many times;
`peak_budget_s` and `peak_max_size` bound each matmul-peak measurement in time and size; `ops`: the
device's clock and memory peak (an `ablate.hardware.device.DeviceOps`; default: `device_ops(device)`;
tests pass a stand-in); `step_timer`: what times a training step for `auto`'s choice on a CPU claiming
native bf16 (`ablate.train.choices.precision`; tests inject timings); `echo`: print progress and the tables.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ablate.bench.defaults import PEAK_BUDGET_S, PEAK_MAX_SIZE, PRECISIONS, TOKENS_PER_STEP
from ablate.core.errors import UserError


def bench(
    recipe: str = "recipes/table6.yaml",
    scale: str = "small",
    variants: list[str] | None = None,
    seq_lens: list[int] | None = None,
    rounds: int = 3,
    tokens_per_step: int = 4096,
    batch_size: int | None = None,
    backend: str | None = None,
    compile: bool = False,
    out: str = "reports/bench",
    *,
    overrides: list | None = None,
    **more: Any,
) -> int:
    """Training/forward throughput, peak memory and MFU per variant and sequence length.

    Args:
        recipe: recipe YAML file
        scale: scale preset (small: d_model 768, 12 layers)
        variants: variants to time; ratios are against the first (default transformer diff)
        seq_lens: sequence lengths (default 512 1024 2048 4096 and the scale's training length)
        rounds: interleaved rounds; the median is reported
        tokens_per_step: tokens per step: max(1, this // seq_len) sequences
        batch_size: sequences per step, instead of --tokens-per-step
        backend: attention backend for every variant (default: the recipe's)
        compile: run each model under torch.compile
        out: output folder
    """
    run_bench(
        recipe,
        scale=scale,
        variants=variants or ["transformer", "diff"],
        seq_lens=seq_lens,
        rounds=rounds,
        out=out,
        batch_size=batch_size,
        tokens_per_step=tokens_per_step,
        overrides=overrides or [],
        backend=backend,
        compile=compile,
        **more,
    )
    return 0


# Every keyword-only argument of run_bench with a default (e.g. `device`, `precision`) is a `bench` flag by
# itself (ablate.verbs.options.verb_options reads `flags_from`), except these, which are the library's,
# not the command line's.
bench.flags_from = ("ablate.verbs.bench", "run_bench")
bench.internal = ("recipe_path", "overrides", "tune_malloc", "retries", "echo", "ops", "step_timer")


def run_bench(
    recipe_path: str,
    scale: str = "small",
    variants: Sequence[str] = ("transformer", "diff"),
    seq_lens: Sequence[int] | None = None,
    rounds: int = 3,
    out: str = "reports/bench",
    batch_size: int | None = None,
    *,
    tokens_per_step: int = TOKENS_PER_STEP,
    overrides: Sequence[tuple[str, Any]] = (),
    backend: str | None = None,
    compile: bool = False,
    device: str | None = None,
    precision: str = "auto",
    tune_malloc: bool = True,
    retries: int = 2,
    peak_budget_s: float = PEAK_BUDGET_S,
    peak_max_size: int = PEAK_MAX_SIZE,
    ops: Any = None,
    step_timer: Any = None,
    echo: bool = True,
) -> Path:
    """Measure, write `<out>/bench.csv`, `bench.md`, `ratios.csv` and `bench.png` (where matplotlib is
    installed); returns the folder. The options are the module doc's."""
    import os

    import torch

    import ablate.bench.measure as lib
    from ablate.bench.results import write_results
    from ablate.hardware.allocator import tune_glibc_malloc
    from ablate.hardware.device import device_ops
    from ablate.hardware.precision import compute_dtype
    from ablate.recipe.loading import load_recipe

    variants = list(variants)
    seq_lens = _seq_lens(seq_lens, recipe_path, overrides, scale)
    _check(rounds, tokens_per_step, seq_lens, batch_size, variants, backend, precision)
    ops = ops or device_ops(device)
    recipe = load_recipe(recipe_path, list(overrides), scale=scale)
    runs = lib.bench_runs(recipe, variants, backend)
    batch = batch_size or max(1, tokens_per_step // seq_lens[0])
    chosen, why = _step_precision(
        precision, ops, runs[variants[0]], (seq_lens[0], batch, compile), step_timer
    )
    say = lib.printer(echo)
    say(f"precision: {chosen} ({why})")
    malloc = tune_glibc_malloc() if tune_malloc else "glibc malloc defaults"
    load_before = os.getloadavg()
    foreign = lib.ForeignCpu()
    arms, models = lib.build_arms(
        runs, seq_lens, ops, chosen, compile=compile, batch_size=batch_size, tokens_per_step=tokens_per_step
    )
    dtypes = list(dict.fromkeys([compute_dtype(chosen), torch.float32]))  # the dtype that ran, then float32
    peaks, repeated = lib.measure(
        arms,
        rounds,
        dtypes,
        ops,
        say,
        retries=retries,
        peak_budget_s=peak_budget_s,
        peak_max_size=peak_max_size,
    )
    context = {
        "recipe": recipe.name,
        "scale": scale,
        "step": f"{batch_size} sequences per step" if batch_size else f"{tokens_per_step} tokens per step",
        **{"precision": chosen, "why": why, "dtypes": dtypes, "peaks": peaks, "ops": ops, "rounds": rounds},
        **{"compile": compile, "loads": (load_before, os.getloadavg()), "malloc": malloc, "say": say},
        **{"foreign": foreign.fraction(), "repeated": repeated},
    }
    say(write_results(Path(out), arms, {v: model for v, (model, _) in runs.items()}, models, context))
    return Path(out)


def _seq_lens(
    seq_lens: Sequence[int] | None, recipe_path: str, overrides: Sequence[tuple[str, Any]], scale: str
) -> list[int]:
    """The lengths to time: those given, else the recipe's at `scale` (ablate.bench.measure.default_seq_lens)."""
    if seq_lens is None:
        import ablate.bench.measure as lib
        from ablate.recipe.loading import load_recipe

        seq_lens = lib.default_seq_lens(load_recipe(recipe_path, list(overrides), scale=scale))
    return [int(n) for n in seq_lens]


def _step_precision(
    precision: str, ops: Any, run: tuple[Any, Any], shape: tuple[int, int, bool], step_timer: Any
) -> tuple[str, str]:
    """The precision the arms run in and why; `auto` on a CPU claiming native bf16: the first arm's whole
    training step (its run's `model`, `train` at the arm's (length, batch, compiling)), timed both ways
    (ablate.train.choices.precision)."""
    from ablate.train.choices.precision import choose_step_precision, time_step

    model, train = run
    seq_len, batch, compiled = shape
    train = replace(train, seq_len=seq_len, micro_batch_size=batch, compile=compiled)
    chosen, why, _ = choose_step_precision(
        precision, ops.device, model, train, key="--precision", timer=step_timer or time_step
    )
    return chosen, why


def _check(
    rounds: int,
    tokens_per_step: int,
    seq_lens: list[int],
    batch_size: int | None,
    variants: list[str],
    backend: str | None,
    precision: str,
) -> None:
    """The options, each refused in one line."""
    checked = [
        ("--rounds", rounds),
        ("--tokens-per-step", tokens_per_step),
        *(("--seq-lens", n) for n in seq_lens),
    ]
    for key, value in checked + ([("--batch-size", batch_size)] if batch_size is not None else []):
        if value < 1:
            raise UserError(f"{key}: expected a positive integer, got {value}")
    if not variants or not seq_lens:
        raise UserError("--variants and --seq-lens: give at least one each")
    if backend is not None:
        from components.attention.backends import check_backend

        check_backend(backend, key="--backend")
    if precision not in PRECISIONS:
        raise UserError(f"--precision: {precision!r} is not one of {', '.join(PRECISIONS)}")
