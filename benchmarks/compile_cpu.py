"""Does `train.compile` (torch.compile, inductor on CPU) speed up training at a recipe's scale? Eager and
compiled copies of each variant (same initial weights) are timed side by side in one process: one untimed
warm-up step each (the compiled one's holds its compilation, reported apart), then `--rounds`
interleaved rounds of one training step per arm (forward, backward, AdamW), the median reported. Prints a
Markdown table with the compiled/eager throughput ratio per variant and appends it to a CSV (numbered runs).

    python benchmarks/compile_cpu.py --scale cpu --threads 1 --csv benchmarks/compile_cpu.csv

A script, not a verb: it measures one setting for the notes. Steps are `ablate bench`'s (ablate.bench.measure:
`train_step`, the device seam's clock, retaken while other processes used the CPU).
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
from dataclasses import replace
from pathlib import Path

import torch

from ablate.bench.measure import Arm, train_step, undisturbed
from ablate.hardware.allocator import tune_glibc_malloc
from ablate.hardware.device import cpu_name, device_ops
from ablate.hardware.precision import choose_precision
from ablate.model.decoder import attention_kernel
from ablate.recipe.loading import load_recipe
from ablate.train.choices.timed_step import build_step
from ablate.train.module import compile_seconds


def arms_for(recipe_path: str, scale: str, variants: list[str], precision: str) -> list[tuple[str, Arm]]:
    ops = device_ops("cpu")
    recipe = load_recipe(recipe_path, [], scale=scale)
    runs = {run.variant: run for run in recipe.runs_for([0], variants=variants)}
    arms = []
    for variant in variants:
        run = runs[variant]
        n, batch = run.train.seq_len, run.train.micro_batch_size
        tokens = torch.randint(
            0, run.model.vocab_size, (batch, n + 1), generator=torch.Generator().manual_seed(0)
        )
        for mode in ("eager", "compiled"):
            train = replace(run.train, compile=mode == "compiled")
            step = replace(build_step(run.model, train, precision, ops), tokens=tokens)
            model = getattr(step.model, "_orig_mod", step.model)
            arm = Arm(variant, n, step, 0.0)
            arm.kernel = attention_kernel(
                model, ops.device, torch.bfloat16 if "bf16" in precision else torch.float32
            )
            arms.append((mode, arm))
    return arms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default="recipes/table6.yaml")
    parser.add_argument("--scale", default="cpu")
    parser.add_argument("--variants", nargs="+", default=["transformer", "diff"])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (a sweep worker's: 1)")
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--csv", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tune_glibc_malloc()
    precision, why = choose_precision(args.precision, torch.device("cpu"))
    arms = arms_for(args.recipe, args.scale, args.variants, precision)
    load_before = os.getloadavg()
    compile_s, first_s = {}, {}
    for mode, arm in arms:
        before = compile_seconds()
        first_s[(mode, arm.variant)] = train_step(arm)[0]
        compile_s[(mode, arm.variant)] = compile_seconds() - before
    for _ in range(args.rounds):
        for _mode, arm in arms:
            arm.train_s.append(undisturbed(lambda a=arm: train_step(a)[0], retries=2)[0])
    load_after = os.getloadavg()
    rows = []
    for variant in args.variants:
        by_mode = {mode: arm for mode, arm in arms if arm.variant == variant}
        tok = {m: a.n_tokens / statistics.median(a.train_s) for m, a in by_mode.items()}
        rows.append(
            {
                "variant": variant,
                "attention_kernel": by_mode["eager"].kernel,
                "eager_tok_s": round(tok["eager"]),
                "compiled_tok_s": round(tok["compiled"]),
                "compiled_over_eager": round(tok["compiled"] / tok["eager"], 3),
                "compile_s": round(compile_s[("compiled", variant)], 1),
                "first_step_s": round(first_s[("compiled", variant)], 1),
            }
        )
    print(
        f"{cpu_name()}, {args.threads} thread(s), {precision} ({why}), scale {args.scale}, "
        f"median of {args.rounds} interleaved rounds; load average {load_before[0]:.1f} before, "
        f"{load_after[0]:.1f} after"
    )
    print("| " + " | ".join(rows[0]) + " |")
    print("|" + "---|" * len(rows[0]))
    for row in rows:
        print("| " + " | ".join(str(v) for v in row.values()) + " |")
    if args.csv:  # appended: one run's rows after another's, numbered
        earlier = list(csv.DictReader(args.csv.open())) if args.csv.exists() else []
        run = 1 + max((int(r["run"]) for r in earlier), default=0)
        with args.csv.open("a", newline="") as f:
            writer = csv.DictWriter(
                f, fieldnames=["run", *rows[0], "cpu", "threads", "precision", "rounds", "load_avg"]
            )
            if not earlier:
                writer.writeheader()
            for row in rows:
                writer.writerow(
                    {
                        "run": run,
                        **row,
                        "cpu": cpu_name(),
                        "threads": args.threads,
                        "precision": precision,
                        "rounds": args.rounds,
                        "load_avg": f"{load_before[0]:.1f}-{load_after[0]:.1f}",
                    }
                )


if __name__ == "__main__":
    main()
