"""Parts (b)-(d) of the device check through the real command line (`python -m ablate.cli`), and the
collection of their results from the MLflow store into CSV files.

The parts train a recipe written by `write_recipe`: Table 6's base with its Transformer and Diff rows and
two scales of its own, `train-small` (the `small` model and data, a few hundred steps, bf16-mixed) and
`tokens-8x` (the `cpu-tokens` width at budgets 8x those of the CPU study, every budget from one run). With
`dry` both shrink to a model that trains in seconds on a CPU, on a generated corpus.
"""

from __future__ import annotations

import copy
import csv
import random
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "ablate.cli"]
VARIANTS = ("transformer", "diff")
SEEDS = ("0", "1", "2")
DRY_MODEL = {"vocab_size": 260, "d_model": 32, "n_layers": 2, "head_dim": 8}
DRY_TRAIN = {"seq_len": 32, "batch_tokens": 256, "micro_batch_size": 4, "lr": 3.0e-3, "warmup_steps": 2,
             "val_every": 4, "val_batches": 2, "log_every": 1, "precision": "32-true"}  # fmt: skip


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
    budgets = [8 * t for t in tokens["budgets"]["tokens"]]  # 4.2M ... 33.6M tokens
    train_small = {
        "model": small["model"],
        "data": small["data"],
        "train": {**small["train"], "steps": 200, "batch_tokens": 32768, "warmup_steps": 20,
                  "val_every": 100, "val_batches": 8, "log_every": 10, "precision": "bf16-mixed"},
    }  # fmt: skip
    tokens_8x = {
        **{k: v for k, v in tokens.items() if k not in ("variants", "purpose")},
        "train": {
            **tokens["train"],
            "steps": budgets[-1] // tokens["train"]["batch_tokens"],
            "val_every": 256,
        },
        "budgets": {"tokens": budgets},
    }
    if dry:
        data = {"source": str(corpus), "tokenizer": "byte", "val_fraction": 0.2}
        train_small = {"model": DRY_MODEL, "data": data, "train": {**DRY_TRAIN, "steps": 6}}
        tokens_8x = {
            "model": DRY_MODEL,
            "data": data,
            "train": {**DRY_TRAIN, "steps": 8, "schedule": "wsd", "cooldown_fraction": 0.25},
            "budgets": {"tokens": [1024, 2048]},
            "variants": [VARIANTS[1]],
        }
    compiled = copy.deepcopy(train_small)  # part e: the same runs under torch.compile, fewer steps
    compiled["train"] |= {"compile": True, "steps": 2 if dry else 100, "warmup_steps": 1 if dry else 10}
    compiled["train"] |= {"val_every": compiled["train"]["steps"]}
    recipe["scales"] = {"train-small": train_small, "train-compile": compiled, "tokens-8x": tokens_8x}
    recipe["default_scale"] = "train-small"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False, allow_unicode=True))
    return path


def cli(*args: str, log: Path, check: bool = True) -> int:
    """`ablate ARGS` in a child process (the repository root as working folder), output into `log`."""
    with log.open("a") as f:
        f.write(f"$ ablate {' '.join(args)}\n")
        f.flush()
        code = subprocess.run([*CLI, *args], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT).returncode
    if check and code:
        raise SystemExit(f"ablate {args[0]} exited {code}; see {log.name}")
    return code


def bench(out: Path, recipe: Path, device: str, dry: bool) -> None:
    """(b) `ablate bench` at the `small` scale, sequences 1024, 2048 and 4096: tokens/s, memory, MFU."""
    if dry:
        args = [str(recipe), "--scale", "train-small", "--seq-lens", "16", "32", "--rounds", "1",
                "--tokens-per-step", "64", "--peak-budget-s", "0.2", "--peak-max-size", "128"]  # fmt: skip
    else:
        args = ["recipes/table6.yaml", "--scale", "small", "--seq-lens", "1024", "2048", "4096",
                "--rounds", "3", "--tokens-per-step", "16384"]  # fmt: skip
    cli("bench", *args, "--device", device, "--out", str(out / "b_bench"), log=out / "logs" / "b_bench.log")


def train(out: Path, recipe: Path, workspace: Path, dry: bool) -> None:
    """(c) the Transformer and Diff through `ablate train`, logged to MLflow (`collect` reads the curves);
    a dry run trains Diff alone (the Transformer's is the same command)."""
    for variant in VARIANTS[1:] if dry else VARIANTS:
        cli("train", str(recipe), "--scale", "train-small", "--variant", variant, "--workspace", str(workspace),
            log=out / "logs" / "c_train.log")  # fmt: skip


def compiled(out: Path, recipe: Path, workspace: Path, dry: bool) -> None:
    """(e) `train.compile: true` on the device: Diff, then the Transformer, through `ablate train` (compile
    time reported apart: `compile_s`); a dry run compiles Diff alone."""
    for variant in VARIANTS[1:] if dry else VARIANTS[::-1]:
        cli("train", str(recipe), "--scale", "train-compile", "--variant", variant, "--workspace", str(workspace),
            log=out / "logs" / "e_compile.log")  # fmt: skip


def budgets(out: Path, recipe: Path, workspace: Path, dry: bool, workers: int) -> None:
    """(d) the `cpu-tokens` width at 8x budgets: the sweep's trials enqueued, then `workers` workers train
    them side by side until none is left (or the part's time runs out: finished budgets are kept). A dry
    run trains Diff alone, one seed."""
    log = out / "logs" / "d_budgets.log"
    seeds = ["--seeds", *(SEEDS[:1] if dry else SEEDS)]
    common = [str(recipe), "--scale", "tokens-8x", *seeds, "--workspace", str(workspace)]
    cli("sweep", *common, "--no-train", "true", "--yes", "true", log=log)
    with log.open("a") as f:
        procs = [
            subprocess.Popen([*CLI, "worker", *common], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
            for _ in range(1 if dry else workers)
        ]
        codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"ablate worker exit codes {codes}; see {log.name}")


def collect(out: Path, workspace: Path) -> None:
    """c_train.csv (the training curves of part c) and d_budgets.csv (part d's validation loss at every
    budget) from the MLflow store, whatever finished."""
    from ablate.store import tracking
    from ablate.store.stores import Stores

    client = Stores(workspace).client()
    curves, finals = [], []
    for scale, rows in (("train-small", curves), ("train-compile", curves), ("tokens-8x", finals)):
        experiment = client.get_experiment_by_name(tracking.experiment_name("device-check", scale))
        if experiment is None:
            continue
        for run in client.search_runs([experiment.experiment_id]):
            tags, metrics = run.data.tags, run.data.metrics
            if "ablate.variant" not in tags:
                continue  # a sweep's parent run
            who = {"scale": scale, "variant": tags["ablate.variant"], "seed": tags.get("ablate.seed", "")}
            if scale != "tokens-8x":
                history = {}
                for key in ("train/loss", "val/loss", "tokens_per_s", "compile_s"):
                    for m in client.get_metric_history(run.info.run_id, key):
                        history.setdefault(m.step, {})[key] = m.value
                rows += [{**who, "step": s, **history[s]} for s in sorted(history)]
            else:
                rows.append({**who, "budget_tokens": tags.get("ablate.budget_tokens", ""),
                             "status": run.info.status, "val_loss": metrics.get("val/loss", ""),
                             "ar_hit": metrics.get("val/ar_hit", ""), "others": metrics.get("val/others", "")})  # fmt: skip
    columns = ["scale", "variant", "seed", "step", "train/loss", "val/loss", "tokens_per_s", "compile_s"]
    write_csv(out / "c_train.csv", curves, columns)
    finals.sort(key=lambda r: (r["variant"], r["seed"], int(r["budget_tokens"] or 0)))
    write_csv(
        out / "d_budgets.csv",
        finals,
        ["variant", "seed", "budget_tokens", "status", "val_loss", "ar_hit", "others"],
    )


def write_csv(path: Path, rows: list[dict], columns: list[str]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
