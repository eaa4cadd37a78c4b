"""Parts (b)-(e) of the device check through the real command line (`python -m ablate.cli`), the sizing
of part d's budgets to its box, and the collection of each part's results from the MLflow store into a
CSV file as the part ends.

The parts train a recipe written by `write_recipe`: Table 6's base with its Transformer and Diff rows and
scales of its own, `train-small` and `train-compile` (the `small` model and data, bf16-mixed) and
`budgets` (the `cpu-tokens` width at the CPU study's budgets times a multiplier, every budget from one
run, sized by `d_sizing`). With `dry` they shrink to a model that trains in seconds on a CPU, on a
generated corpus. Each part's validation is fitted to the validation split it finds (`fit_validation`)
before it trains, and stops in one line where not even one batch fits.
"""

from __future__ import annotations

import copy
import math
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import yaml
from csv_rows import write_rows  # benchmarks/device/csv_rows.py

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "ablate.cli"]
VARIANTS = ("transformer", "diff")
SEEDS = ("0", "1", "2")
DRY_MODEL = {"vocab_size": 260, "d_model": 32, "n_layers": 2, "head_dim": 8}
DRY_TRAIN = {"seq_len": 32, "batch_tokens": 256, "micro_batch_size": 4, "lr": 3.0e-3, "warmup_steps": 2,
             "val_every": 4, "val_batches": 2, "log_every": 1, "precision": "32-true"}  # fmt: skip
SCALES = {"c": "train-small", "e": "train-compile", "d": "budgets"}  # the part -> the scale it trains

# Part d's cost model (seconds on an H100/H200; assumed, no GPU has run it yet: the results' d_budgets.csv
# records each run's seconds, to correct these). One worker of the `cpu-tokens` width (4 layers of 128,
# 4,096 tokens a step) is bound by kernel launches and Python, not by the GPU, so `workers` share it.
D_STEPS_PER_S = 40.0  # one worker's optimizer steps a second, with the others beside it
D_START_S = 20.0  # a trial's start: imports, the model, the Trainer, the first steps' warm-up
D_BRANCH_S = 6.0  # each cooldown branch's start (a Trainer resumed from the branch checkpoint)
D_SWEEP_S = 30.0  # `ablate sweep --no-train`: the plan, the BPE-2048 tokenizer trained on stdlib
D_SAFETY = 1.3  # the expected time times this must fit the box
D_MULTIPLIERS = (8, 4, 2, 1, 1 / 2, 1 / 4, 1 / 8, 1 / 16)  # of the CPU study's budgets, largest first


class DSizing(NamedTuple):
    """Part d's work for a box: the CPU study's budgets times `multiplier`, `seeds` seeds of 2 variants."""

    multiplier: float
    seeds: int
    budgets: list[int]
    batch_tokens: int
    expected_s: float
    fits: bool

    @property
    def steps(self) -> int:
        return self.budgets[-1] // self.batch_tokens

    def describe(self) -> str:
        return (
            f"{self.multiplier:g}x the CPU study's budgets ({self.budgets[0] / 1e6:.2g}M-{self.budgets[-1] / 1e6:.3g}M "
            f"tokens, longest {self.steps:,} steps), 2 variants x {self.seeds} seed(s); about "
            f"{self.expected_s:.0f} s"
            + ("" if self.fits else " (over the box: the longest runs may not land)")
        )


def d_sizing(box_s: float, workers: int) -> DSizing:
    """The largest multiplier of the CPU study's budgets (and then the most seeds) whose expected time,
    times `D_SAFETY`, fits `box_s` (those that would cool down inside the warmup left out): a trial trains its longest budget, then one cooldown branch per smaller
    budget (ablate.train.branches), and `workers` trials run at once."""
    tokens = yaml.safe_load((ROOT / "recipes" / "table6.yaml").read_text())["scales"]["cpu-tokens"]
    base, batch = tokens["budgets"]["tokens"], tokens["train"]["batch_tokens"]
    cooldown, warmup = tokens["train"]["cooldown_fraction"], tokens["train"]["warmup_steps"]
    choice = None
    for m in D_MULTIPLIERS:
        # budgets too short to cool down after the warmup are left out (the recipe would refuse them)
        budgets = [
            s * batch for s in (int(t * m) // batch for t in base) if s - math.ceil(cooldown * s) >= warmup
        ]
        steps = budgets[-1] // batch + sum(math.ceil(cooldown * b / batch) for b in budgets[:-1])
        trial = D_START_S + steps / D_STEPS_PER_S + (len(budgets) - 1) * D_BRANCH_S
        for seeds in (3, 2, 1):
            expected = D_SWEEP_S + math.ceil(2 * seeds / max(1, workers)) * trial
            choice = DSizing(m, seeds, budgets, batch, expected, expected * D_SAFETY <= box_s)
            if choice.fits:
                return choice
    return choice


def write_corpus(folder: Path, n_docs: int = 20) -> Path:
    """Documents of words from a small vocabulary with repeats (the dry run's corpus: no tokenizer to train)."""
    rng = random.Random(0)
    words = [f"w{i}" for i in range(50)] + ["def", "return", "(", ")", ":", "\n"]
    folder.mkdir(parents=True, exist_ok=True)
    for d in range(n_docs):
        (folder / f"doc{d:03d}.txt").write_text(" ".join(rng.choice(words[: 20 + d]) for _ in range(300)))
    return folder


def write_recipe(path: Path, *, dry: bool, device: str, corpus: Path | None = None) -> Path:
    table6 = yaml.safe_load((ROOT / "recipes" / "table6.yaml").read_text())
    small, tokens = table6["scales"]["small"], table6["scales"]["cpu-tokens"]
    recipe = copy.deepcopy(table6)
    recipe["name"] = "device-check"
    recipe["description"] = (
        "The device check's runs: Table 6's Transformer and Diff rows (benchmarks/device)."
    )
    recipe["variants"] = {k: table6["variants"][k] for k in VARIANTS}
    recipe["base"]["train"]["accelerator"] = "cpu" if device == "cpu" else "auto"
    # Validation once, at the end (one checkpoint write of the 100M-parameter model, not one per check).
    train_small = {
        "model": small["model"],
        "data": small["data"],
        "train": {**small["train"], "steps": 60, "batch_tokens": 32768, "warmup_steps": 10,
                  "val_every": 60, "val_batches": 8, "log_every": 10, "precision": "bf16-mixed",
                  "compile": False},  # `auto`'s 4 eager candidates, as its box was measured; x compiles
    }  # fmt: skip
    budgets = {
        **{k: v for k, v in tokens.items() if k not in ("variants", "purpose")},
        "train": {**tokens["train"], "val_every": 256},
    }
    if dry:
        data = {"source": str(corpus), "tokenizer": "byte", "val_fraction": 0.2}
        train_small = {"model": DRY_MODEL, "data": data, "train": {**DRY_TRAIN, "steps": 6}}
        budgets = {
            "model": DRY_MODEL,
            "data": data,
            "train": {**DRY_TRAIN, "steps": 8, "schedule": "wsd", "cooldown_fraction": 0.25},
            "budgets": {"tokens": [1024, 2048]},
            "variants": [VARIANTS[1]],
        }
    compiled = copy.deepcopy(train_small)  # part e: the same run under torch.compile, fewer steps
    compiled["train"] |= {"compile": True, "steps": 2 if dry else 40, "warmup_steps": 1 if dry else 4}
    compiled["train"] |= {"val_every": compiled["train"]["steps"], "val_batches": 2}
    # one backend, so the run compiles once and times no candidates (`auto` would time 8, 4 compiled)
    compiled["model"] = (
        {**compiled["model"], "attention_backend": "sdpa_cudnn"} if not dry else compiled["model"]
    )
    recipe["scales"] = {"train-small": train_small, "train-compile": compiled, "budgets": budgets}
    recipe["default_scale"] = "train-small"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False, allow_unicode=True))
    return path


def set_train(recipe: Path, scale: str, **values) -> None:
    """Rewrite `values` into the recipe file's `scale.train`."""
    data = yaml.safe_load(recipe.read_text())
    data["scales"][scale]["train"].update(values)
    recipe.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))


def fit_validation(recipe: Path, scale: str, workspace: Path) -> None:
    """Fit `scale`'s validation to the split this machine's corpus gives (the `stdlib` corpus is the
    image's own standard library: about 136K validation tokens under BPE-8192 on CPython 3.12, about 80K
    without tkinter or lib2to3): as many of the asked `val_batches` as fit, before any training; one line
    and exit where not one fits. Tokenizes into the workspace's cache, which the training reads next."""
    from ablate.core.workspace import Workspace
    from ablate.data import load_tokens
    from ablate.recipe.loading import load_recipe

    loaded = load_recipe(recipe, scale=scale)
    run = loaded.runs_for(loaded.seeds[:1])[0]
    cfg = run.train
    have = len(load_tokens(run.data, Workspace(workspace)).val)
    most = have // ((cfg.seq_len + 1) * cfg.micro_batch_size)
    if most < 1:
        raise SystemExit(
            f"{scale}: the validation split has {have:,} tokens, fewer than one micro-batch of "
            f"{cfg.micro_batch_size} x {cfg.seq_len + 1}; use a larger data.val_fraction or a shorter seq_len"
        )
    if most < cfg.val_batches:
        print(
            f"[{scale}] validation: {have:,} tokens hold {most} of the {cfg.val_batches} val_batches asked",
            flush=True,
        )
        set_train(recipe, scale, val_batches=most)


def cli(*args: str, log: Path, check: bool = True) -> int:
    """`ablate ARGS` in a child process (the repository root as working folder), output into `log`."""
    with log.open("a") as f:
        f.write(f"$ ablate {' '.join(args)}\n")
        f.flush()
        code = subprocess.run([*CLI, *args], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT).returncode
    if check and code:
        raise SystemExit(f"ablate {args[0]} exited {code}; see {log.name}")
    return code


def bench(ctx) -> None:
    """(b) `ablate bench` at the `small` scale, sequences 1024, 2048 and 4096: tokens/s, memory, MFU."""
    import backend_check

    backend_check.write_device(ctx.out, ctx.device)  # the card's name, for MFU against its spec peak
    if ctx.dry:
        args = [str(ctx.recipe), "--scale", "train-small", "--seq-lens", "16", "32", "--rounds", "1",
                "--tokens-per-step", "64", "--peak-budget-s", "0.2", "--peak-max-size", "128"]  # fmt: skip
    else:
        args = ["recipes/table6.yaml", "--scale", "small", "--seq-lens", "1024", "2048", "4096",
                "--rounds", "3", "--tokens-per-step", "16384"]  # fmt: skip
    out = ctx.out / "b_bench"
    cli("bench", *args, "--device", ctx.device, "--out", str(out), log=ctx.out / "logs" / "b_bench.log")


def train(ctx) -> None:
    """(c) the Transformer and Diff through `ablate train`, logged to MLflow (`collect` reads the curves);
    a dry run trains Diff alone (the Transformer's is the same command)."""
    fit_validation(ctx.recipe, SCALES["c"], ctx.workspace)
    for variant in VARIANTS[1:] if ctx.dry else VARIANTS:
        cli("train", str(ctx.recipe), "--scale", SCALES["c"], "--variant", variant, "--workspace",
            str(ctx.workspace), log=ctx.out / "logs" / "c_train.log")  # fmt: skip


def compiled(ctx) -> None:
    """(e) `train.compile: true` on the device: Diff (the variant whose attention is the project's own)
    through `ablate train`, compile time reported apart (`compile_s`). One cold compile of the training
    graph and one of the evaluation graph: a second variant's would not fit the box."""
    fit_validation(ctx.recipe, SCALES["e"], ctx.workspace)
    cli("train", str(ctx.recipe), "--scale", SCALES["e"], "--variant", VARIANTS[1], "--workspace",
        str(ctx.workspace), log=ctx.out / "logs" / "e_compile.log")  # fmt: skip


def budgets(ctx) -> None:
    """(d) the `cpu-tokens` width at budgets sized to land in the box (`d_sizing`): the sweep's trials
    enqueued, then `workers` workers train them side by side, each capped at its share of the CPU's
    threads, until none is left (or the box ends: finished budgets are kept). A dry run trains Diff
    alone, one seed, at two tiny budgets."""
    log = ctx.out / "logs" / "d_budgets.log"
    scale = SCALES["d"]
    seeds, workers = SEEDS[:1], 1
    if not ctx.dry:
        sizing = d_sizing(ctx.box_s, ctx.workers)
        data = yaml.safe_load(ctx.recipe.read_text())
        data["scales"][scale]["budgets"] = {"tokens": sizing.budgets}
        data["scales"][scale]["train"]["steps"] = sizing.steps
        ctx.recipe.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
        seeds, workers = SEEDS[: sizing.seeds], min(ctx.workers, 2 * sizing.seeds)
        with log.open("a") as f:
            f.write(f"[d] box {ctx.box_s:.0f} s: {sizing.describe()}; {workers} workers\n")
    fit_validation(ctx.recipe, scale, ctx.workspace)
    common = [str(ctx.recipe), "--scale", scale, "--seeds", *seeds, "--workspace", str(ctx.workspace)]
    cli("sweep", *common, "--no-train", "true", "--yes", "true", log=log)
    threads = str(max(1, (os.cpu_count() or 1) // workers))
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    with log.open("a") as f:
        procs = [
            subprocess.Popen([*CLI, "worker", *common], cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
            for _ in range(workers)
        ]
        codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"ablate worker exit codes {codes}; see {log.name}")


def collect(out: Path, workspace: Path, part: str) -> None:
    """The CSV of `part` from the MLflow store, whatever finished: c_train.csv and e_compile.csv (the
    training curves), d_budgets.csv (the validation loss at every budget, and each run's seconds). The
    `small` runs' checkpoints (1.2 GB each, of no further use) are removed after."""
    from ablate.store import names, tracking
    from ablate.store.stores import Stores

    scale = SCALES[part]
    client = Stores(workspace).client()
    rows = []
    experiment = client.get_experiment_by_name(tracking.experiment_name("device-check", scale))
    for run in client.search_runs([experiment.experiment_id]) if experiment else []:
        tags, metrics = run.data.tags, run.data.metrics
        if names.VARIANT not in tags:
            continue  # a sweep's parent run
        who = {"scale": scale, "variant": tags[names.VARIANT], "seed": tags.get(names.SEED, "")}
        if part != "d":
            history = {}
            for key in ("train/loss", "val/loss", "tokens_per_s", "compile_s"):
                for m in client.get_metric_history(run.info.run_id, key):
                    history.setdefault(m.step, {})[key] = m.value
            chosen = {k: tags.get(f"ablate.{k}", "") for k in ("attention_choice", "attention_timings_ms")}
            rows += [{**who, "step": s, **history[s], **chosen} for s in sorted(history)]
        else:
            seconds = (run.info.end_time - run.info.start_time) / 1000 if run.info.end_time else ""
            rows.append({**who, "budget_tokens": tags.get(names.BUDGET_TOKENS, ""),
                         "status": run.info.status, "val_loss": metrics.get("val/loss", ""),
                         "ar_hit": metrics.get("val/ar_hit", ""), "others": metrics.get("val/others", ""),
                         "seconds": seconds})  # fmt: skip
    if part == "d":
        rows.sort(key=lambda r: (r["variant"], r["seed"], int(r["budget_tokens"] or 0)))
        columns = ["variant", "seed", "budget_tokens", "status", "val_loss", "ar_hit", "others", "seconds"]
        write_rows(out / "d_budgets.csv", rows, columns)
        return
    columns = [
        "scale",
        "variant",
        "seed",
        "step",
        "train/loss",
        "val/loss",
        "tokens_per_s",
        "compile_s",
        "attention_choice",
        "attention_timings_ms",
    ]  # the choice `auto` measured on CUDA, if any
    write_rows(out / {"c": "c_train.csv", "e": "e_compile.csv"}[part], rows, columns)
    shutil.rmtree(workspace / "runs" / tracking.experiment_name("device-check", scale), ignore_errors=True)
