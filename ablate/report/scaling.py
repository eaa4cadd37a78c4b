"""A size x budget grid's fit (Figure 3 of Differential Transformer, through `ablate fit`): the report folder.

A grid is a study with several sizes and token budgets (ablate.recipe.budgets): per size, arm and seed one
run to the largest budget, each smaller budget a cooldown branched off it, so every (size, budget) point
is a run trained to that budget. From one point per run (its final validation loss):

- the joint form L(N, D) = E + A N^-alpha + B D^-beta per arm (fit.md, loss_vs_params.png,
  loss_vs_tokens.png at the root);
- the per-axis forms: L(N) over the runs at the largest budget (`size/`, Figure 3a) and L(D) over the
  runs of the largest size (`tokens/`, Figure 3b);
- the equal-loss ratios of each fit against the reference arm, with 95% percentile intervals over paired
  resamples of seeds (the same seeds drawn for both arms; ablate.fitting.core, `paired`). A fit with a
  parameter at its bound is flagged and its ratios are not quoted.

Convergence of every point, measured where it can be: a budget's loss against the same run family's loss
at twice the tokens ((L(D) - L(2D)) / L(D), "measured"); at the largest budget, from `E + B D^-beta`
fitted to the family's budgets ("fitted"). A point counts as converged below a 1% gain.

Files: README.md (commands, machine, wall-clock, the cost against training each budget separately, the
panels, the ratios beside the paper's), fits.csv, ratios.csv, points.csv, grid.csv (sizes, budgets, seeds,
time, cost, convergence counts), and the fits' own
fit.json / fit.md / plots; with an earlier grid to compare with, compared_ratios.csv and compared_gaps.csv
and a README section (ablate.report.grid_compare). Every number README.md quotes is in one of the CSVs.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ablate.core.errors import UserError
from ablate.core.tables import markdown_table, si
from ablate.data import passes as data_passes
from ablate.fitting import Point, fit_loss_curve, fit_points
from ablate.fitting.core import check_points
from ablate.fitting.fit import FitReport
from ablate.fitting.forms import FORMS
from ablate.report.fit import QUOTED, percent, ratio_cell, ratio_sentence, write_fit
from ablate.report.table import write_csv
from ablate.store import names

if TYPE_CHECKING:
    from ablate.store.study import SweepContext

# Figure 3 of the paper: "6.8B Diff matches 11B Transformer (62.2% of the parameters)" (3a) and
# "Diff with 160B tokens matches Transformer with 251B tokens (63.7%)" (3b).
PAPER_RATIOS = {"params": 0.622, "tokens": 0.637}
CONVERGED_GAIN = 0.01
FIT_WHERE = {
    "joint": "every (size, budget)",
    "size": "at the largest budget",
    "tokens": "at the largest size",
}


def is_grid(runs: list[Any], budgeted: bool) -> bool:
    """A size x budget grid: budgets, and more than one size among the finished runs."""
    return budgeted and len({r.size for r in runs}) > 1


def grid_points(runs: list[Any]) -> list[Point]:
    """One point per run (its final validation); the bootstrap unit is the seed (paired across arms)."""
    return [Point(r.arch, r.params, r.tokens, r.loss, f"seed {r.seed}") for r in runs]


def convergence(runs: list[Any]) -> dict[str, dict[str, Any]]:
    """Run id -> {gain_2x_tokens, gain_source, converged}: see the module doc."""
    families: dict[tuple, list[Any]] = {}
    for r in runs:
        families.setdefault((r.arch, r.size, r.seed), []).append(r)
    out = {}
    for members in families.values():
        members.sort(key=lambda r: r.tokens)
        by_tokens = {r.tokens: r for r in members}
        for r in members:
            twice = by_tokens.get(2 * r.tokens)
            if twice is not None:
                gain, source = (r.loss - twice.loss) / r.loss, "measured"
            else:
                try:
                    c = fit_loss_curve([m.tokens for m in members], [m.loss for m in members])
                    gain, source = c.predicted_gain, "fitted"
                except UserError:  # fewer than 3 budgets in the family: nothing to fit
                    gain, source = math.nan, "unknown"
            out[r.run_id] = {
                "gain_2x_tokens": gain,
                "gain_source": source,
                "converged": None if not math.isfinite(gain) else bool(gain < CONVERGED_GAIN),
            }
    return out


def grid_subsets(runs: list[Any]) -> tuple[dict[str, list[Point]], dict[str, Any]]:
    """Each fit's points (joint: all; size: the largest budget's; tokens: the largest size's), and where."""
    points = grid_points(runs)
    largest_tokens = max(r.tokens for r in runs)
    sizes = sorted({r.size for r in runs}, key=lambda s: max(r.params for r in runs if r.size == s))
    subsets = {
        "joint": points,
        "size": [p for p, r in zip(points, runs) if r.tokens == largest_tokens],
        "tokens": [p for p, r in zip(points, runs) if r.size == sizes[-1]],
    }
    where = {
        "largest_tokens": largest_tokens,
        "largest_size": sizes[-1],
        "seeds": sorted({r.seed for r in runs}),
    }
    return subsets, where


def check_grid(runs: list[Any]) -> None:
    """UserError (one line) when a fit of the grid cannot be made, before anything is read or written."""
    for name, points in grid_subsets(runs)[0].items():
        for arch in dict.fromkeys(p.arch for p in points):
            check_points(FORMS[name], arch, [p for p in points if p.arch == arch])


def grid_fits(
    runs: list[Any], reference: str | None, n_boot: int, seed: int
) -> tuple[dict[str, FitReport], dict[str, Any]]:
    """The joint and per-axis fits; and where the per-axis ones are taken (largest budget, largest size)."""
    subsets, where = grid_subsets(runs)
    boot = n_boot if len(where["seeds"]) >= 2 else 0
    fits = {
        name: fit_points(pts, name, n_boot=boot, seed=seed, reference=reference, paired=True)
        for name, pts in subsets.items()
    }
    return fits, where


def fit_rows(fits: dict[str, FitReport]) -> list[dict[str, Any]]:
    rows = []
    for name, report in fits.items():
        for arch, f in report.archs.items():
            for param in f.form.param_names:
                lo, hi = f.ci[param]
                rows.append(
                    {
                        "fit": name,
                        "where": FIT_WHERE[name],
                        "arch": arch,
                        "parameter": param,
                        "value": f.params[param],
                        "lo": lo,
                        "hi": hi,
                        "points": f.n_points,
                        "at_bound": "; ".join(f.at_bound),
                        "optimizer_converged": f.converged,
                    }
                )
    return rows


def ratio_rows(fits: dict[str, FitReport]) -> list[dict[str, Any]]:
    rows = []
    for name, report in fits.items():
        largest = {
            q: max((r.at for r in report.ratios if r.quantity == q), default=math.nan) for q in PAPER_RATIOS
        }
        for r in report.ratios:
            rows.append(
                {
                    "fit": name,
                    "where": FIT_WHERE[name],
                    "arch": r.arch,
                    "reference": r.reference,
                    "quantity": r.quantity,
                    "at": r.at,
                    "at_largest": r.at == largest[r.quantity],
                    **{f"fixed_{k}": v for k, v in r.fixed.items()},
                    "ratio": r.ratio,
                    "lo": r.lo,
                    "hi": r.hi,
                    "status": r.status,
                    "quoted": r.status in QUOTED,
                    "n_boot": r.n_boot,
                    "n_boot_no_solution": r.n_boot_no_solution,
                    "paper_ratio": PAPER_RATIOS[r.quantity],
                    "sentence": ratio_sentence(r),
                }
            )
    return rows


def grid_row(
    spans: list[tuple[Any, Any]], runs: list[Any], seconds: dict[str, float], conv: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """What the grid was, what it cost, and how many points converged.

    Cost: the runs' training time against training every budget as a run of its own from step 0, at the
    family's measured speed (the longest run's seconds x budget / largest budget, summed over budgets).
    `spans`: (start, end) of the study's completed trials."""
    wall = (max(e for _, e in spans) - min(s for s, _ in spans)).total_seconds() if spans else math.nan
    trials = sum((e - s).total_seconds() for s, e in spans)
    longest = [r for r in runs if r.family == r.run_id]
    budgets = sorted({r.tokens for r in runs})
    train_longest = sum(seconds.get(r.run_id, math.nan) for r in longest)
    train_branches = sum(seconds.get(r.run_id, math.nan) for r in runs if r.family != r.run_id)
    separately = train_longest * sum(budgets) / budgets[-1]
    grid = train_longest + train_branches
    known = [c["converged"] for c in conv.values() if c["converged"] is not None]
    return {
        "sizes": len({r.size for r in runs}),
        "budgets": len(budgets),
        "seeds": len({r.seed for r in runs}),
        "longest_runs": len(longest),
        "branch_runs": len(runs) - len(longest),
        "wall_clock_minutes": round(wall / 60, 1),
        "trials_minutes_summed": round(trials / 60, 1),
        "longest_runs_train_minutes": round(train_longest / 60, 1),
        "branch_runs_train_minutes": round(train_branches / 60, 1),
        "grid_train_minutes": round(grid / 60, 1),
        "separate_runs_train_minutes_estimated": round(separately / 60, 1),
        "grid_over_separate": round(grid / separately, 3) if separately else math.nan,
        "points_converged": sum(known),
        "points_with_convergence": len(known),
    }


def point_rows(runs: list[Any], conv: dict[str, dict[str, Any]], seconds: dict[str, float]) -> list[dict]:
    return [
        {
            "arch": r.arch,
            "size": r.size,
            "seed": r.seed,
            "params": r.params,
            "tokens": r.tokens,
            "train_split_tokens": r.split_tokens,
            "passes": round(r.passes, 4) if math.isfinite(r.passes) else math.nan,
            "read_twice": (
                round(data_passes.read_twice(r.passes, r.sampling), 4)
                if math.isfinite(r.passes)
                else math.nan
            ),
            "loss": r.loss,
            **conv[r.run_id],
            "mlflow_run_id": r.run_id,
            "branched_from": "" if r.family == r.run_id else r.family,
            "train_seconds": seconds.get(r.run_id, math.nan),
        }
        for r in runs
    ]


def ratios_table(rows: list[dict[str, Any]]) -> str:
    """The ratio at each fit's largest trained value, beside the paper's (Figure 3)."""
    cells = []
    for row in rows:
        if not row["at_largest"]:
            continue
        fixed = ", ".join(
            f"{'N' if k == 'fixed_params' else 'D'} = {si(v)}"
            for k, v in row.items()
            if k.startswith("fixed_") and isinstance(v, float) and math.isfinite(v)
        )
        value = ratio_cell(row["ratio"], row["lo"], row["hi"], row["status"])  # quoted: status in QUOTED
        cells.append(
            [
                row["fit"],
                "parameters" if row["quantity"] == "params" else "tokens",
                f"{'N' if row['quantity'] == 'params' else 'D'} = {si(row['at'])}"
                + (f", {fixed}" if fixed else ""),
                value,
                percent(row["paper_ratio"]),
            ]
        )
    return markdown_table(
        [
            "fit",
            "Diff matches the Transformer with ... of its",
            "at Diff's",
            "ratio [95% paired CI]",
            "paper",
        ],
        cells,
    )


def machine_line(recorded: list[str]) -> str:
    """The machine the runs trained on, as their `ablate.machine` tags say; runs trained before that tag
    existed fall back to this machine's description, said as such."""
    from ablate.hardware.machine import machine_description

    if recorded and "" not in recorded:
        return f"{'; '.join(sorted(set(recorded)))} (the runs' `{names.MACHINE}` tag)"
    return f"{machine_description()} (the one `ablate fit` ran on: the runs did not record theirs)"


def grid_readme(
    ctx: SweepContext,
    fits: dict[str, FitReport],
    where: dict[str, Any],
    rows: dict[str, list[dict[str, Any]]],
    params_word: str,
    precision: str,
    machine: str,
    data: str = "",
    compare_with: str | None = None,
) -> str:
    """The folder's README; `data`: the passes over the training data (ablate.report.fit_runs.data_note);
    `compare_with`: the earlier grid fit's folder the fit was set beside, which its command names."""
    points, cost = rows["points"], rows["grid"][0]
    sizes = sorted({(p["params"], p["size"]) for p in points if p["arch"] == fits["joint"].reference})
    budgets = sorted({p["tokens"] for p in points})
    seeds = where["seeds"]
    bound = [
        f"{name} fit, {arch}: {'; '.join(f.at_bound)}"
        for name, r in fits.items()
        for arch, f in r.archs.items()
        if f.at_bound
    ]
    recipe = ctx.recipe.path
    lines = [
        f"# {ctx.recipe.name} at scale {ctx.scale}: Figure 3 at {si(sizes[0][0])}-{si(sizes[-1][0])} "
        f"{params_word} and {si(budgets[0])}-{si(budgets[-1])} tokens",
        "",
        "```bash",
        f"ablate sweep {recipe} --scale {ctx.scale} --seeds {' '.join(map(str, seeds))} --yes",
        f"ablate fit {recipe} --scale {ctx.scale} --out <this folder>"
        + (f" --compare-with {compare_with}" if compare_with else ""),
        "ablate fit --from <this folder>   # this folder again from its export alone (runs.parquet, metrics.parquet)",
        "```",
        "",
        f"- machine: {machine}; precision: {precision}",
        f"- wall-clock: {cost['wall_clock_minutes']} min from the first trial's start to the last one's end "
        f"({cost['trials_minutes_summed']} min of trials summed over workers)",
        f"- grid: {len(sizes)} sizes ({', '.join(f'{s} {si(n)}' for n, s in sizes)} {params_word}) x "
        f"{len(budgets)} budgets ({', '.join(si(b) for b in budgets)} tokens) x 2 arms x seeds {seeds}: "
        f"{cost['longest_runs']} runs trained from step 0, {cost['branch_runs']} budgets branched off them",
        f"- cost: the runs trained {cost['grid_train_minutes']} min summed over workers; training every "
        f"budget as a run of its own from step 0 would take about "
        f"{cost['separate_runs_train_minutes_estimated']} min at the same speeds: "
        f"{cost['grid_over_separate']}x (`grid.csv`)",
        f"- {data[:1].lower() + data[1:]}" if data else "- data: the training split's size was not recorded",
        f"- convergence: {cost['points_converged']} of {cost['points_with_convergence']} points gain under 1% "
        "from twice the tokens (`points.csv`: measured against the same run family's next budget, fitted "
        "at the largest budget)",
        "",
        "## Equal-loss ratios",
        "",
        ratios_table(rows["ratios"]),
        "",
        "Ratio: Diff's trained value over the value the Transformer's fitted curve needs for the same loss; "
        + (
            f"brackets: 95% percentile intervals over {fits['joint'].n_boot} paired resamples of the seeds "
            f"({len(seeds)} seeds: {math.comb(2 * len(seeds) - 1, len(seeds))} distinct resamples). "
            if len(seeds) >= 2
            else "one seed, so no intervals (the bootstrap resamples seeds; sweep --seeds 0 1 2 for them). "
        )
        + "The paper's "
        "column is Figure 3 (models of 830M parameters and more, trained on up to 360B tokens); these are models "
        f"of {si(sizes[0][0])}-{si(sizes[-1][0])} {params_word} on this recipe's data, and say nothing beyond them. "
        "Every ratio at every trained value: `ratios.csv`.",
        "",
        "## Figure 3's panels",
        "",
        "![loss vs parameters](size/loss_vs_params.png) ![loss vs tokens](tokens/loss_vs_tokens.png)",
        "",
        f"Left: L(N) at the largest budget ({si(where['largest_tokens'])} tokens, `size/fit.md`); right: L(D) "
        f"at the largest size ({where['largest_size']}, `tokens/fit.md`). The joint fit over every point: "
        "`fit.md`, `loss_vs_params.png`, `loss_vs_tokens.png`; every parameter with its interval: `fits.csv`.",
    ]
    if bound:
        lines += ["", "Fits with a parameter at its bound (their ratios are not quoted):", ""]
        lines += [f"- {b}" for b in bound]
    return "\n".join(lines) + "\n"


def write_grid_report(
    ctx: SweepContext,
    runs: list[Any],
    reference: str | None,
    folder: Path,
    *,
    spans: list[tuple[Any, Any]],
    seconds: dict[str, float],
    n_boot: int,
    seed: int,
    params_word: str,
    notes: list[str],
    precision: str = "not recorded",
    machines: list[str] | None = None,
    data: str = "",
    compare_with: str | None = None,
) -> tuple[list[Path], dict[str, FitReport], dict[str, dict[str, Any]]]:
    """Fit the grid and write the folder (module doc); returns the files, the fits and each run's
    convergence. `ctx`: the sweep (its recipe's name and path, its scale); `spans`: the study's completed
    trials' (start, end); `seconds`: each run's training seconds; `precision`: what the runs trained in;
    `machines`: each run's `ablate.machine` tag ("" where it has none); `data`: the passes over the
    training data, a sentence; `compare_with`: an earlier grid fit's folder to set beside this one
    (ablate.report.grid_compare)."""
    fits, where = grid_fits(runs, reference, n_boot, seed)
    conv = convergence(runs)
    for name, report in fits.items():
        report.notes = list(notes) if name == "joint" else [f"Points {FIT_WHERE[name]} of the grid."]
    rows = {
        "fits": fit_rows(fits),
        "ratios": ratio_rows(fits),
        "points": point_rows(runs, conv, seconds),
        "grid": [grid_row(spans, runs, seconds, conv)],
    }
    compared = ""
    if compare_with:
        from ablate.report import grid_compare

        other = grid_compare.read_grid_folder(compare_with)
        arch = next(a for a in fits["joint"].archs if a != reference)
        rows["compared_ratios"] = grid_compare.compared_ratios(rows["ratios"], other["ratios.csv"])
        rows["compared_gaps"] = grid_compare.compared_gaps(
            rows["points"], other["points.csv"], arch, reference
        )
        compared = grid_compare.comparison_section(
            compare_with, rows["compared_ratios"], rows["compared_gaps"]
        )
    folder.mkdir(parents=True, exist_ok=True)
    splits = {r.split_tokens for r in runs if math.isfinite(getattr(r, "split_tokens", math.nan))}
    split = splits.pop() if len(splits) == 1 else math.nan  # the passes axis of the plots over tokens
    drawn = [r.sampling for r in runs]  # how they drew their windows (the passes axis's share read twice)
    written = write_fit(fits["joint"], folder, split, drawn)
    written += write_fit(fits["size"], folder / "size", split, drawn)
    written += write_fit(fits["tokens"], folder / "tokens", split, drawn)
    written += [write_csv(folder / f"{name}.csv", r) for name, r in rows.items()]
    from ablate.report.folder import kept_text

    readme = folder / "README.md"  # what a person wrote below the generated part is kept (hand_written)
    generated = grid_readme(
        ctx, fits, where, rows, params_word, precision, machine_line(machines or [""]), data, compare_with
    ) + (f"\n{compared}\n" if compared else "")
    kept = kept_text(readme, generated)
    readme.write_text(generated + (f"\n{kept}" if kept else ""))
    return [readme, *written], fits, conv
