"""Time a joint scaling fit (L(N, D) = E + A/N^alpha + B/D^beta) with a bootstrap over runs.

    python benchmarks/bench_fit.py [--points 250] [--boot 1000] [--jobs 1 2]

Target: 250 points x 1000 resamples in under 60 s on a 2-core machine. Each row refits the same data
with the same seed; the last column checks that every process count gives bit-identical bootstrap
parameters (the draws are made up front, so parallelism must not change the result).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

try:
    from ablate.fitting import Point, fit_points
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from ablate.fitting import Point, fit_points


def synthetic_points(n: int, seed: int = 0) -> list[Point]:
    """`n` runs (one final checkpoint each) spread over 1e7-1e9 params and 1e9-1e11 tokens, 0.5% noise."""
    rng = np.random.default_rng(seed)
    big_e, big_a, big_b, alpha, beta = 1.69, 406.4, 410.7, 0.34, 0.28  # Chinchilla-like constants
    n_params = np.exp(rng.uniform(np.log(1e7), np.log(1e9), n))
    tokens = np.exp(rng.uniform(np.log(1e9), np.log(1e11), n))
    loss = (big_e + big_a / n_params**alpha + big_b / tokens**beta) * np.exp(rng.normal(0.0, 0.005, n))
    return [
        Point("transformer", float(p), float(t), float(lo), f"run{i}")
        for i, (p, t, lo) in enumerate(zip(n_params, tokens, loss))
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, default=250)
    ap.add_argument("--boot", type=int, default=1000)
    ap.add_argument("--jobs", type=int, nargs="+", default=None, help="process counts to time")
    args = ap.parse_args()
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    jobs = args.jobs or sorted({1, cpus})
    pts = synthetic_points(args.points)

    print(f"joint fit, {args.points} points, {args.boot} bootstrap resamples, {cpus} CPUs available")
    print(f"{'points':>6} {'resamples':>9} {'jobs':>4} {'seconds':>8} {'fits/s':>7}  identical")
    reference = None
    for n_jobs in jobs:
        t0 = time.perf_counter()
        report = fit_points(pts, "joint", n_boot=args.boot, seed=0, n_jobs=n_jobs)
        dt = time.perf_counter() - t0
        boot = report.archs["transformer"].boot_theta
        same = "-" if reference is None else str(bool(np.array_equal(boot, reference)))
        reference = boot if reference is None else reference
        print(f"{args.points:>6} {args.boot:>9} {n_jobs:>4} {dt:>8.2f} {(args.boot + 1) / dt:>7.1f}  {same}")
    f = report.archs["transformer"]
    print("fit:", ", ".join(f"{k}={v:.4g} [{f.ci[k][0]:.4g}, {f.ci[k][1]:.4g}]" for k, v in f.params.items()))


if __name__ == "__main__":
    main()
