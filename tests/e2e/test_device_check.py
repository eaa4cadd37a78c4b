"""The device check (benchmarks/device/check.py): its dry run end to end on CPU, as the GPU machine runs
it (scipy, matplotlib, zstandard, pandas and threadpoolctl hidden: the image lacks them), and a part that
fails or overruns its time box losing nothing the others wrote. Part e (`train.compile`) is left out of
the dry run: inductor takes minutes on a 2-core CPU (tests/components/test_compile.py checks the compiled
model, tests/ablate/test_compile_time.py its compile time apart)."""

from __future__ import annotations

import csv
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / "benchmarks" / "device" / "check.py"


# Started by every Python of the run (a sitecustomize on PYTHONPATH): sys.path's finder, blind to the
# packages the GPU image lacks, modules and distributions alike, so they are absent, not broken.
HIDING = """
import sys
from importlib.machinery import PathFinder

BLOCKED = {"scipy", "matplotlib", "zstandard", "pandas", "threadpoolctl"}


class Hiding:
    def find_spec(self, name, path=None, target=None):
        return None if name.split(".")[0] in BLOCKED else PathFinder.find_spec(name, path, target)

    def find_distributions(self, *args, **kwargs):
        for dist in PathFinder.find_distributions(*args, **kwargs):
            if (dist.metadata["Name"] or "").lower() not in BLOCKED:
                yield dist

    def invalidate_caches(self):
        PathFinder.invalidate_caches()


sys.meta_path[:] = [Hiding() if f is PathFinder else f for f in sys.meta_path]
"""


def load_check():
    spec = importlib.util.spec_from_file_location("device_check", CHECK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rows(path: Path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(f))


def test_a_part_that_fails_or_overruns_is_recorded_and_stopped(tmp_path):
    check = load_check()
    (tmp_path / "logs").mkdir()
    slow = check.run_part("x", [sys.executable, "-c", "import time; time.sleep(600)"], 1.0, tmp_path)
    failed = check.run_part("y", [sys.executable, "-c", "raise SystemExit(3)"], 60.0, tmp_path)
    assert slow["status"] == "stopped at its time box (1 s)" and slow["seconds"] < 60
    assert failed["status"] == "failed (exit 3)"


@pytest.mark.slow
def test_dry_run_on_cpu_writes_every_part(tmp_path):
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "sitecustomize.py").write_text(HIDING)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(blocked)}
    command = [
        sys.executable,
        str(CHECK),
        "--out",
        str(out),
        "--device",
        "cpu",
        "--dry",
        "--budget-s",
        "1500",
    ]
    command += ["--workspace", str(tmp_path / "ws"), "--parts", "a", "b", "c", "d"]  # e: minutes of compiling
    proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    logs = "".join(p.read_text() for p in (out / "logs").glob("*.log"))
    assert [(r["part"], r["status"]) for r in rows(out / "parts.csv")] == [
        (part, "ok") for part in ("install", "a", "b", "c", "d", "collect")
    ], logs
    kernels = rows(out / "a_kernels.csv")
    assert {r["status"] for r in kernels} == {"pass", "n/a"}
    flash = [r for r in kernels if r["backend"] == "sdpa_flash" and r["kind"] == "diff"]
    assert flash and all(
        r["status"] == "pass" and "flash_attention_for_cpu x2" in r["sdpa_ops"] for r in flash
    )
    assert all(r["status"] == "n/a" for r in kernels if r["backend"] in ("sdpa_efficient", "sdpa_cudnn"))
    assert {r["variant"] for r in rows(out / "b_bench" / "bench.csv")} == {"transformer", "diff"}
    curves = rows(out / "c_train.csv")
    curve = [float(r["train/loss"]) for r in curves if r["train/loss"] and r["scale"] == "train-small"]
    assert curve[-1] < curve[0]
    budgets = rows(out / "d_budgets.csv")
    assert [(r["budget_tokens"], r["status"]) for r in budgets] == [
        ("1024", "FINISHED"),
        ("2048", "FINISHED"),
    ]
    assert {p.name for p in (out / "stores").iterdir()} == {"mlflow.db", "optuna.journal"}
    readme = (out / "README.md").read_text()
    assert readme.startswith("# Device check: ") and "## What each number means" in readme
    assert "(no results)" not in readme and "(no finished budget)" not in readme
    assert readme.count("(not run)") == 1  # part e
