"""A budgeted study's prediction, written before the runs that test it, and checked once they exist.

`predict` fits each row's final losses at every budget of a committed `budgets.csv` (one run per row,
seed and budget) with the fit code of the report (`ablate.fitting.gap`: L(D) = E + B D^-beta per row,
paired seed bootstrap) and writes the gap to the reference row at the token counts asked for, with its
interval, into `predictions.csv`. A row whose curve has a parameter at its bound is flagged there
(`at_bound`): its extrapolation rests on a constraint, not on the data.

When the study is extended to those budgets, its report (`ablate.report.budgets`) reads `predictions.csv`
from its folder and sets each measured gap beside its prediction (`predicted_vs_measured.csv`).

    python -m ablate.report.predict reports/table6-cpu-tokens-four-rows/budgets.csv --at 8388608 16777216

A module entry point rather than a verb: it reads only a CSV the report wrote, no recipe or store.
"""

from __future__ import annotations

import argparse
import csv
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from ablate.core import fields
from ablate.fitting.forms import EXPONENT_BOUNDS, LOGCOEF_BOUNDS
from ablate.fitting.gap import fitted_gap
from ablate.fitting.optimize import fit_theta, single_blas_thread

N_BOOT = 1000
COLUMNS = (
    "variant",
    "label",
    "reference",
    "tokens",
    "n_seeds",
    "predicted_gap",
    "predicted_lo",
    "predicted_hi",
    "bootstrap_draws",
    "fitted_budgets",
    "at_bound",
)


def read_losses(path: Path) -> tuple[list[str], dict[str, str], dict[str, dict[int, dict[int, float]]]]:
    """(rows in file order, labels, variant -> seed -> {tokens: final validation loss}) of the finished
    runs of a budget report's `budgets.csv`."""
    order: list[str] = []
    labels: dict[str, str] = {}
    losses: dict[str, dict[int, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    columns = {"state", "valid", "variant", "label", "seed", "tokens"}
    for line, row in enumerate(fields.csv_rows(path, "budgets_csv", columns), start=2):  # 1: the header
        where = f"budgets_csv: {str(path)!r} line {line}"
        valid = fields.field(where, "valid", row["valid"], fields.NUMBER_TEXT)
        if row["state"] != "finished" or not math.isfinite(valid):
            continue
        if row["variant"] not in order:
            order.append(row["variant"])
        labels[row["variant"]] = row["label"]
        seed = fields.field(where, "seed", row["seed"], fields.INTEGER_TEXT)
        losses[row["variant"]][seed][fields.field(where, "tokens", row["tokens"], fields.INTEGER_TEXT)] = (
            valid
        )
    return order, labels, losses


def bound_flags(curves: dict[int, dict[int, float]], name: str) -> list[str]:
    """Which parameters of a row's fitted curve (all seeds) sit at a bound of the fit."""
    pairs = [(t, v) for curve in curves.values() for t, v in curve.items()]
    tokens, loss = (np.array(col, dtype=float) for col in zip(*pairs))
    x = (np.log(tokens) - np.log(tokens).mean())[None, :]
    with single_blas_thread():
        theta = fit_theta(x, loss, np.ones_like(loss), n_starts=6)[0]
    bounds = {"E": (0.0, float(loss.min())), "log B": LOGCOEF_BOUNDS, "beta": EXPONENT_BOUNDS}
    flags = []
    for (param, (lo, hi)), value in zip(bounds.items(), theta):
        for side, edge in (("lower", lo), ("upper", hi)):
            if math.isclose(value, edge, rel_tol=1e-6, abs_tol=1e-9):
                flags.append(f"{name}: {param} at its {side} bound {edge:g}")
    return flags


def predict(path: Path, at_tokens: list[int], n_boot: int = N_BOOT) -> list[dict[str, Any]]:
    """One row per (row other than the reference, token count): the fitted curves' gap there."""
    order, labels, losses = read_losses(path)
    reference = order[0]
    rows = []
    for variant in order[1:]:
        flags = bound_flags(losses[reference], labels[reference]) + bound_flags(
            losses[variant], labels[variant]
        )
        budgets = sorted({t for curve in losses[variant].values() for t in curve})
        for tokens in at_tokens:
            gap = fitted_gap(losses[reference], losses[variant], tokens, n_boot=n_boot)
            rows.append(
                {
                    "variant": variant,
                    "label": labels[variant],
                    "reference": reference,
                    "tokens": tokens,
                    "n_seeds": gap.n_seeds,
                    "predicted_gap": gap.estimate,
                    "predicted_lo": gap.lo,
                    "predicted_hi": gap.hi,
                    "bootstrap_draws": gap.n_boot,
                    "fitted_budgets": " ".join(str(t) for t in budgets),
                    "at_bound": "; ".join(flags),
                }
            )
    return rows


def write_predictions(rows: list[dict[str, Any]], path: Path) -> Path:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return path


def read_predictions(path: Path) -> list[dict[str, Any]]:
    """The predictions written before the runs (`main`'s file), each cell read as its kind: one line
    naming the file, the line and the column where one is not."""
    kinds = {
        "tokens": fields.INTEGER_TEXT,
        "predicted_lo": fields.NUMBER_TEXT,
        "predicted_hi": fields.NUMBER_TEXT,
    }
    rows = fields.csv_rows(path, "predictions.csv", {"variant", "label", "predicted_gap", *kinds})
    for line, row in enumerate(rows, start=2):
        for column, kind in kinds.items():
            fields.field(f"predictions.csv: {str(path)!r} line {line}", column, row[column], kind)
    return rows


def against_measured(predictions: list[dict[str, Any]], gaps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each prediction beside the measured paired gap at its row and token count (a budget report's gap
    rows); `held`: the measured mean lies inside the predicted interval ("" where not measured yet)."""
    measured = {(g["variant"], int(g["tokens"])): g for g in gaps}
    rows = []
    for p in predictions:
        g = measured.get((p["variant"], int(p["tokens"])))
        lo, hi = float(p["predicted_lo"]), float(p["predicted_hi"])
        held = "" if g is None or not math.isfinite(g["gap"]) else str(lo <= g["gap"] <= hi).lower()
        rows.append(
            {
                **{
                    k: p[k]
                    for k in ("variant", "label", "tokens", "predicted_gap", "predicted_lo", "predicted_hi")
                },
                "measured_gap": g["gap"] if g else math.nan,
                "measured_lo": g["lo"] if g else math.nan,
                "measured_hi": g["hi"] if g else math.nan,
                "measured_seeds": g["n_seeds"] if g else 0,
                "held": held,
                "at_bound": p.get("at_bound", ""),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ablate.report.predict", description=__doc__.split("\n")[0]
    )
    parser.add_argument("budgets_csv", type=Path, help="a budget report's budgets.csv")
    parser.add_argument("--at", type=int, nargs="+", required=True, help="token counts to predict the gap at")
    parser.add_argument("--out", type=Path, help="default: predictions.csv beside budgets.csv")
    parser.add_argument("--bootstrap", type=int, default=N_BOOT, help="paired seed resamples")
    args = parser.parse_args(argv)
    if not args.budgets_csv.is_file():
        parser.exit(2, f"budgets_csv: no file {args.budgets_csv}; give a budget report's budgets.csv\n")
    out = args.out or args.budgets_csv.with_name("predictions.csv")
    print(write_predictions(predict(args.budgets_csv, args.at, args.bootstrap), out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
