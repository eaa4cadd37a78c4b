"""The device check: one prepared run that proves the GPU path on a machine available for minutes.

    python benchmarks/device/check.py --out DIR [--device cuda|cpu] [--dry] [--budget-s 450] [--parts ...]

It first installs what the image lacks from the wheels `benchmarks/device/wheels.py` fetched beside it
(`pip install --no-index --find-links`, and this working tree itself, whose entry points register the
components), then runs five parts in this order, each in a child process held to its own time box, so a part that
fails or overruns loses nothing the others wrote:

  a  every attention kind and backend on the device against float64 (benchmarks/device/kernels.py)
  b  `ablate bench` at the `small` scale, sequences 1024, 2048, 4096: tokens/s, peak memory, MFU
  c  200 steps of the `small` Transformer and Diff in bf16-mixed through `ablate train`, logged to MLflow
  e  100 steps of each with `train.compile: true`: compile time apart from training time, tokens/s
  d  with the time left: the `cpu-tokens` width at 8x the CPU study's budgets (every budget from one
     run; Transformer and Diff; 3 seeds), through `ablate sweep --no-train` and parallel `ablate worker`s

and last collects the curves and budget losses from the MLflow store. a, b, c and e may take 7 of the
default 7.5 minutes; `--parts d --out DIR2` runs d alone, with the whole budget, in a second run.
Everything lands in DIR: the CSV files, `b_bench/`, `logs/`, `parts.csv` (each part's status and
seconds), the MLflow and Optuna stores (`stores/`), and README.md (the card, the commands, what each
number means), rewritten after every part. `--dry` shrinks every part to a size a CPU runs in minutes
(the test suite runs it with `--device cpu`).

Written as a script of stdlib at its top level, because it starts where jsonargparse, MLflow and
Optuna are not installed yet; each part imports the library in its own child process.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from importlib.metadata import entry_points
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
# module -> distribution, for what the GPU image may lack (benchmarks/device/wheels.py carries them)
NEEDED = {"jsonargparse": "jsonargparse", "docstring_parser": "docstring-parser", "mlflow": "mlflow-skinny",
          "sqlalchemy": "sqlalchemy", "alembic": "alembic", "optuna": "optuna"}  # fmt: skip
# each part's share of the budget (d takes what is left, less what `collect` needs)
PARTS = {"a": 60, "b": 100, "c": 150, "e": 120, "d": None}
COLLECT_S = 40


def install(out: Path, wheels: Path) -> tuple[bool, str]:
    """Install the missing packages from `wheels`, then this working tree where its components are not
    registered (each step tried whatever the other's outcome); returns (all done, what was done)."""
    missing = [dist for module, dist in NEEDED.items() if importlib.util.find_spec(module) is None]
    steps = []
    with (out / "logs" / "install.log").open("a") as log:

        def pip(*args: str) -> bool:
            command = [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--no-index",
                "--find-links",
                str(wheels),
                *args,
            ]
            if subprocess.run(command, stdout=log, stderr=subprocess.STDOUT).returncode == 0:
                return True
            # a system Python (PEP 668) or a read-only one: the user's site-packages instead
            user = [*command, "--user", "--break-system-packages"]
            return subprocess.run(user, stdout=log, stderr=subprocess.STDOUT).returncode == 0

        if missing:
            steps.append((pip(*missing), ", ".join(missing)))
        if not entry_points(group="ablate.components"):
            tools = importlib.util.find_spec("setuptools") is not None or pip("setuptools")
            tree = tools and pip("--no-deps", "--no-build-isolation", "-e", str(ROOT))
            steps.append((tree, "this working tree (editable)"))
    note = "; ".join(("installed " if ok else "FAILED to install ") + what for ok, what in steps)
    return all(ok for ok, _ in steps), note or "nothing to install"


def run_part(part: str, argv: list[str], limit_s: float, out: Path) -> dict:
    """Run one part in its own process group; killed (the whole group) at `limit_s`."""
    start = time.monotonic()
    with (out / "logs" / f"part_{part}.log").open("a") as f:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=max(1.0, limit_s))
            status = "ok" if code == 0 else f"failed (exit {code})"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            status = f"stopped at its time box ({limit_s:.0f} s)"
    return {
        "part": part,
        "status": status,
        "seconds": round(time.monotonic() - start, 1),
        "limit_s": round(limit_s),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for every result")
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    parser.add_argument("--dry", action="store_true", help="tiny sizes (a CPU runs it in about a minute)")
    parser.add_argument("--budget-s", type=float, default=450.0, help="seconds for everything")
    parser.add_argument("--wheels", type=Path, default=HERE / "wheels")
    parser.add_argument(
        "--workspace", type=Path, default=None, help="stores and checkpoints (default: a temporary folder)"
    )
    parser.add_argument("--workers", type=int, default=3, help="part d's parallel workers")
    parser.add_argument(
        "--parts", nargs="+", default=list(PARTS), choices=list(PARTS), help="which, in order"
    )
    parser.add_argument("--part", help=argparse.SUPPRESS)  # a child: run this one part
    args = parser.parse_args()
    out = args.out.resolve()
    workspace = (args.workspace or Path(tempfile.mkdtemp(prefix="ablate-device-"))).resolve()
    if args.part:
        return child(args.part, out, workspace, args)
    started = time.monotonic()
    (out / "logs").mkdir(parents=True, exist_ok=True)
    from summary import write_readme  # benchmarks/device/summary.py: stdlib only

    ok, note = install(out, args.wheels)
    seconds = round(time.monotonic() - started, 1)
    rows = [{"part": "install", "status": "ok" if ok else "failed (logs/install.log)", "seconds": seconds,
             "limit_s": "", "note": note}]  # fmt: skip
    write_readme(out, rows, args, sys.argv)
    base = [sys.executable, str(Path(__file__).resolve()), "--out", str(out), "--device", args.device,
            "--workspace", str(workspace), "--workers", str(args.workers)] + (["--dry"] if args.dry else [])  # fmt: skip
    for part in args.parts:
        share = PARTS[part]
        left = args.budget_s - (time.monotonic() - started) - COLLECT_S
        # a dry run keeps only the whole budget as a hang guard: a loaded CPU may take any part's share
        limit = left if share is None or args.dry else min(share, left)
        rows.append(run_part(part, [*base, "--part", part], limit, out))
        write_readme(out, rows, args, sys.argv)
    rows.append(run_part("collect", [*base, "--part", "collect"], COLLECT_S, out))
    stores = out / "stores"
    stores.mkdir(exist_ok=True)
    for store in [*workspace.glob("*.db"), *workspace.glob("*.journal")]:  # MLflow's, Optuna's
        shutil.copy2(store, stores / store.name)
    write_readme(out, rows, args, sys.argv)
    with (out / "parts.csv").open("w", newline="") as f:
        writer = csv.DictWriter(
            f, fieldnames=["part", "status", "seconds", "limit_s", "note"], extrasaction="ignore"
        )
        writer.writeheader()
        writer.writerows(rows)
    print(json.dumps(rows, indent=1))
    print(f"results: {out}/README.md")


def child(part: str, out: Path, workspace: Path, args: argparse.Namespace) -> None:
    sys.path.insert(0, str(HERE))
    import runs

    recipe = out / "recipe.yaml"
    if not recipe.exists():
        corpus = runs.write_corpus(workspace / "corpus") if args.dry else None
        runs.write_recipe(recipe, dry=args.dry, device=args.device, corpus=corpus)
    if part == "a":
        import kernels

        kernels.main(out, args.device, args.dry)
    elif part == "b":
        runs.bench(out, recipe, args.device, args.dry)
    elif part == "c":
        runs.train(out, recipe, workspace, args.dry)
    elif part == "e":
        runs.compiled(out, recipe, workspace, args.dry)
    elif part == "d":
        runs.budgets(out, recipe, workspace, args.dry, args.workers)
    elif part == "collect":
        runs.collect(out, workspace)


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    main()
