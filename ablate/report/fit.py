"""Write a `FitReport`: fit.json (machine-readable), fit.md (readable), loss_vs_*.png (Figure 3 style).

`run_fit_csv` is `ablate fit --csv`: read points, fit (ablate.fitting), write. Token-scaling fits that use
checkpoints inside a run: a checkpoint is not a separate run at that token budget (the learning-rate
schedule differs); the bootstrap resamples whole runs and the output says so.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ablate.core.errors import UserError
from ablate.fitting.core import ArchFit
from ablate.fitting.fit import FitReport, fit_points, get_form
from ablate.fitting.points import read_points_csv
from ablate.fitting.ratios import Ratio
from ablate.report.plots import Series, scaling_plot

QUANTITY_WORD = {"params": "parameters", "tokens": "tokens"}
SYMBOL = {"params": "N", "tokens": "D"}
AXIS_LABEL = {"params": "parameters N", "tokens": "training tokens D"}
LINESTYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D")


def sci(x: float) -> str:
    """1.2e8 rather than 1.2e+08."""
    if not math.isfinite(x):
        return "n/a"
    mant, exp = f"{x:.2g}".split("e") if "e" in f"{x:.2g}" else (f"{x:.2g}", None)
    if exp is None:
        return mant
    return f"{mant}e{int(exp)}"


def _num(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{x:.4g}"


QUOTED = ("interpolated", "extrapolated")  # the ratio statuses a report quotes


def percent(x: float) -> str:
    return f"{100 * x:.1f}%" if math.isfinite(x) else "n/a"


def ratio_cell(ratio: float, lo: float, hi: float, status: str) -> str:
    """A ratio with its interval for a table, or why it is not quoted (a fit with a parameter at its bound)."""
    return (
        f"{percent(ratio)} [{percent(lo)}, {percent(hi)}]" if status in QUOTED else f"not quoted ({status})"
    )


def ratio_sentence(r: Ratio) -> str:
    where = f"{SYMBOL[r.quantity]} = {sci(r.at)}"
    for var, v in r.fixed.items():
        where += f", {SYMBOL[var]} = {sci(v)}"
    pct = f"{100 * r.level:.0f}%"
    ci = f"{pct} CI {100 * r.lo:.1f}-{100 * r.hi:.1f}%" if math.isfinite(r.lo) else "no interval"
    word = QUANTITY_WORD[r.quantity]
    if r.status == "at bound":
        return (
            f"{r.arch} against {r.reference} at {where}: not quoted, a fit has a parameter at its bound "
            f"(point estimate {100 * r.ratio:.1f}%, {ci})"
        )
    if r.status == "no solution":
        text = (
            f"{r.arch} at {where} reaches loss {r.target_loss:.4g}, which {r.reference} does not reach with any "
            f"number of {word} (no solution; ratio {ci})"
        )
    else:
        text = f"{r.arch} needs {100 * r.ratio:.1f}% ({ci}) of {r.reference}'s {word} at {where}"
        text += f" ({r.reference} needs {sci(r.matched)}"
        text += "; extrapolated)" if r.status == "extrapolated" else ")"
    if r.n_boot_no_solution:
        text += f" [{r.n_boot_no_solution} of {r.n_boot} bootstrap fits had no solution, counted as 0%]"
    return text


def _clean(obj):
    """NaN/inf -> None so fit.json is strict JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    if isinstance(obj, np.floating | np.integer):
        return _clean(obj.item())
    return obj


def report_dict(report: FitReport) -> dict:
    archs = {}
    for name, f in report.archs.items():
        archs[name] = {
            "params": {k: f.params[k] for k in f.form.param_names},
            "ci": {k: list(f.ci[k]) for k in f.form.param_names},
            "n_points": f.n_points,
            "n_runs": f.n_runs,
            "ranges": {k: list(v) for k, v in f.ranges.items()},
            "objective": f.objective,
            "converged": f.converged,
            "n_boot": f.n_boot,
            "n_redrawn": f.n_redrawn,
            "at_bound": list(f.at_bound),
            "notes": list(f.notes),
        }
    ratios = [
        {
            "reference": r.reference,
            "arch": r.arch,
            "quantity": r.quantity,
            "at": r.at,
            "fixed": dict(r.fixed),
            "target_loss": r.target_loss,
            "matched": r.matched,
            "ratio": r.ratio,
            "ci": [r.lo, r.hi],
            "status": r.status,
            "n_boot": r.n_boot,
            "n_boot_no_solution": r.n_boot_no_solution,
            "sentence": ratio_sentence(r),
        }
        for r in report.ratios
    ]
    core = {
        "form": report.form.name,
        "formula": report.form.formula,
        "level": report.level,
        "n_boot": report.n_boot,
        "seed": report.seed,
        "reference": report.reference,
        "archs": archs,
        "ratios": ratios,
        "method": "Huber (delta 1e-3) on log-loss summed over points; L-BFGS-B from a grid; "
        "bootstrap over runs within each arch; percentile intervals",
        "notes": list(report.notes),
    }
    return _clean({**core, **{k: v for k, v in report.extra.items() if k not in core}})


def report_markdown(report: FitReport) -> str:
    form = report.form
    pct = f"{100 * report.level:.0f}%"
    lines = [
        f"# Scaling fit: {form.name} form",
        "",
        f"`{form.formula}`, fitted per architecture on log-loss (Huber, delta = 1e-3, summed over points; "
        f"L-BFGS-B from a grid of starts). Brackets: {pct} percentile intervals from {report.n_boot} "
        f"bootstrap resamples of runs (seed {report.seed}).",
        "",
        "| arch | points | runs | " + " | ".join(form.param_names) + " |",
        "|---|---|---|" + "---|" * form.n_params,
    ]
    for name, f in report.archs.items():
        cells = []
        for k in form.param_names:
            lo, hi = f.ci[k]
            cells.append(
                f"{_num(f.params[k])} [{_num(lo)}, {_num(hi)}]" if report.n_boot else _num(f.params[k])
            )
        lines.append(f"| {name} | {f.n_points} | {f.n_runs} | " + " | ".join(cells) + " |")
    if report.ratios:
        lines += ["", f"## Equal-loss ratios (reference: {report.reference})", ""]
        lines += [f"- {ratio_sentence(r)}" for r in report.ratios]
        lines += [
            "",
            "Ratio = B's trained value / the value A needs for the same fitted loss. \"extrapolated\": A's "
            "value lies outside A's trained range. \"no solution\": B's loss is at or below A's asymptote.",
        ]
    notes = list(report.notes) + [f"{name}: {n}" for name, f in report.archs.items() for n in f.notes]
    notes += [
        f"{name}: the optimiser stopped on maxiter" for name, f in report.archs.items() if not f.converged
    ]
    notes += [
        f"{name}: at a bound, {'; '.join(f.at_bound)}: not an interior optimum, its ratios are not quoted"
        for name, f in report.archs.items()
        if f.at_bound
    ]
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def _grid(lo: float, hi: float, n: int = 200) -> np.ndarray:
    return np.geomspace(lo / 1.3, hi * 1.3, n)


def _budgets(values: list[float], k: int = 3) -> list[float]:
    vals = sorted(set(values))
    if len(vals) <= k:
        return vals
    idx = np.unique(np.round(np.linspace(0, len(vals) - 1, k)).astype(int))
    return [vals[i] for i in idx]


def _series(report: FitReport, quantity: str) -> list[Series]:
    """Curves over `quantity`; in the joint form one curve per arch and per budget of the other variable."""
    colours = [f"C{i}" for i in range(10)]
    other = [v for v in report.form.variables if v != quantity]
    out = []
    for i, (name, f) in enumerate(report.archs.items()):
        colour = colours[i % len(colours)]
        xs = np.array([getattr(p, quantity) for p in f.points])
        ys = np.array([p.loss for p in f.points])
        grid = _grid(*f.ranges[quantity])
        if not other:
            lo, hi = f.predict_band(**{quantity: grid}) if f.n_boot else (None, None)
            out.append(Series(name, xs, ys, grid, f.predict(**{quantity: grid}), lo, hi, colour))
            continue
        var = other[0]
        ov = np.array([getattr(p, var) for p in f.points])
        budgets = _budgets(list(ov))
        for j, b in enumerate(budgets):
            at = {quantity: grid, var: np.full_like(grid, b)}
            lo, hi = f.predict_band(**at) if f.n_boot else (None, None)
            sel = ov == b
            label = f"{name}, {SYMBOL[var]} = {sci(b)}"
            out.append(
                Series(
                    label, xs[sel], ys[sel], grid, f.predict(**at), lo, hi, colour, LINESTYLES[j], MARKERS[j]
                )
            )
        rest = ~np.isin(ov, budgets)
        if rest.any():  # points at other budgets: context only, they belong to no drawn curve
            out.append(Series("", xs[rest], ys[rest], color=colour, marker=".", alpha=0.3))
    return out


def write_fit(
    report: FitReport,
    out_dir: str | Path,
    split_tokens: float = float("nan"),
    samplings: Sequence[str] = (),
) -> list[Path]:
    """Write fit.json, fit.md and loss_vs_params.png / loss_vs_tokens.png (those the form has);
    `split_tokens`: the training split the runs drew from (loss_vs_tokens.png shows the passes over it, and
    the share read twice by how the runs drew their windows: `samplings`)."""
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        written = [out / "fit.json", out / "fit.md"]
        written[0].write_text(json.dumps(report_dict(report), indent=2, allow_nan=False) + "\n")
        written[1].write_text(report_markdown(report))
        pct = f"{100 * report.level:.0f}%"
        foot = f"bands: {pct} bootstrap over runs ({report.n_boot} resamples)" if report.n_boot else None
        if report.form.name == "joint":
            foot = (foot + "; " if foot else "") + "faint dots: points at budgets without a drawn curve"
        for quantity in report.form.variables:
            path = out / f"loss_vs_{quantity}.png"
            scaling_plot(
                _series(report, quantity),
                path,
                xlabel=AXIS_LABEL[quantity],
                title=f"{report.form.formula}",
                footnote=foot,
                split_tokens=split_tokens if quantity == "tokens" else float("nan"),
                samplings=samplings,
            )
            written.append(path)
    except OSError as e:
        raise UserError(f"fit: cannot write to --out {out}: {e.strerror or e}") from None
    return written


def arch_summary(f: ArchFit) -> str:
    """One line per arch, for logs."""
    ps = ", ".join(f"{k}={_num(v)}" for k, v in f.params.items())
    return f"{f.arch}: {ps} ({f.n_points} points, {f.n_runs} runs)"


def run_fit_csv(
    csv_path: str | Path, form: str, out_dir: str | Path, n_boot: int = 1000, seed: int = 0, n_jobs: int = 1
) -> list[Path]:
    """Body of `ablate fit --csv FILE --form {size,tokens,joint} [--out DIR]`: read, fit, write."""
    form_ = get_form(form)
    report = fit_points(read_points_csv(csv_path), form_, n_boot=n_boot, seed=seed, n_jobs=n_jobs)
    from ablate.report.folder import moved, writing

    with writing(Path(out_dir), "--out") as into:  # the folder as a whole, no link followed
        written = write_fit(report, into)
    return moved(written, into, Path(out_dir))
