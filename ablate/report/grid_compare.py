"""A grid fit's folder beside an earlier one (`ablate fit ... --compare-with reports/scaling-cpu/`).

Two size x budget grids of one recipe differ in whatever the second changed (its corpus, its
parametrization, its learning rates). The comparison sets, side by side:

- each fit's headline equal-loss ratios (each quantity at its largest trained value; ablate.report.scaling's
  ratio rows) with the earlier grid's, matched by fit and quantity (`compared_ratios.csv`);
- the paired gap between the arms (the compared arm minus the reference, by seed, with a 95% Student-t
  interval) at every (size, budget) both grids trained (`compared_gaps.csv`);

and a README section with both tables. The earlier grid is read from its folder's `ratios.csv` and
`points.csv`, the files `ablate fit --form grid` writes, so a folder committed without its stores compares
as well as one just made; the path is kept in the export, and `ablate fit --from` reads it again from the
checkout. It says what differs, not which change made the difference.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from ablate.core import fields
from ablate.core.errors import UserError
from ablate.core.tables import markdown_table, si
from ablate.report.fit import ratio_cell
from ablate.report.stats import format_number, paired_difference

NEEDED = {
    "ratios.csv": {"fit", "quantity", "at", "at_largest", "ratio", "lo", "hi", "status"},
    "points.csv": {"arch", "size", "seed", "params", "tokens", "passes", "loss"},
}
QUANTITY_WORDS = {"params": "parameters", "tokens": "tokens"}


def read_grid_folder(folder: str | Path) -> dict[str, list[dict[str, str]]]:
    """The earlier grid's ratios.csv and points.csv rows; a folder without them is one line."""
    folder = Path(folder)
    hint = "give a folder `ablate fit --form grid` wrote, e.g. reports/scaling-cpu/"
    out = {}
    for name, columns in NEEDED.items():
        rows = fields.csv_rows(folder / name, "--compare-with", columns, hint)  # text, read as data
        if not rows:
            raise UserError(f"--compare-with: {str(folder / name)!r} holds no rows; {hint}")
        out[name] = rows
    return out


def checked_folder(folder: str | Path, form: str | None) -> str:
    """`--compare-with` as the export keeps it (relative to the current folder, inside it), after reading
    the folder once, so a wrong one is one line before any store is opened."""
    from ablate.report.write import inside_checkout
    from ablate.store.export_checks import relative_inside

    if form not in (None, "grid"):
        raise UserError(f"--compare-with: compares two grid fits; --form {form} is not one")
    read_grid_folder(folder)
    path = inside_checkout(folder)
    if not relative_inside(path):
        raise UserError(
            f"--compare-with: {path!r} is outside the current folder; the export keeps the path relative "
            "for `ablate fit --from`: run from the checkout that holds it"
        )
    return path


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def compared_ratios(own: list[dict[str, Any]], other: list[dict[str, str]]) -> list[dict[str, Any]]:
    """This grid's headline ratios (at each quantity's largest trained value) beside the earlier grid's."""
    earlier = {(r["fit"], r["quantity"]): r for r in other if str(r["at_largest"]) == "True"}
    rows = []
    for r in own:
        if not r["at_largest"]:
            continue
        e = earlier.get((r["fit"], r["quantity"]), {})
        rows.append(
            {
                "fit": r["fit"],
                "quantity": r["quantity"],
                "at": r["at"],
                "ratio": r["ratio"],
                "lo": r["lo"],
                "hi": r["hi"],
                "status": r["status"],
                "compared_at": _number(e.get("at")),
                "compared_ratio": _number(e.get("ratio")),
                "compared_lo": _number(e.get("lo")),
                "compared_hi": _number(e.get("hi")),
                "compared_status": e.get("status", "not in the compared grid"),
            }
        )
    return rows


def _gaps(points: list[dict[str, Any]], arch: str, reference: str) -> dict[tuple[str, float], dict]:
    """Per (size, budget): the arm's params and passes and its paired gap to the reference over seeds."""
    loss: dict[tuple[str, float], dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    about: dict[tuple[str, float], dict[str, float]] = {}
    for p in points:
        key = (p["size"], _number(p["tokens"]))
        loss[key][p["arch"]][int(_number(p["seed"]))] = _number(p["loss"])
        if p["arch"] == arch:
            about[key] = {"params": _number(p["params"]), "passes": _number(p["passes"])}
    out = {}
    for key, by_arch in loss.items():
        if arch in by_arch and reference in by_arch:
            d = paired_difference(by_arch[arch], by_arch[reference])
            out[key] = {**about[key], "gap": d.mean, "gap_lo": d.lo, "gap_hi": d.hi, "seeds": d.n}
    return out


def compared_gaps(
    own: list[dict[str, Any]], other: list[dict[str, str]], arch: str, reference: str
) -> list[dict[str, Any]]:
    """Every (size, budget) both grids trained: the paired gap `arch` minus `reference` in each."""
    mine, earlier = _gaps(own, arch, reference), _gaps(other, arch, reference)
    rows = []
    for key in sorted(mine.keys() & earlier.keys(), key=lambda k: (mine[k]["params"], k[1])):
        size, tokens = key
        rows.append(
            {
                "arch": arch,
                "reference": reference,
                "size": size,
                "tokens": tokens,
                **mine[key],
                **{f"compared_{k}": v for k, v in earlier[key].items()},
                "gap_change": mine[key]["gap"] - earlier[key]["gap"],
            }
        )
    return rows


def _gap_cell(gap: float, lo: float, hi: float) -> str:
    interval = f" [{format_number(lo)}, {format_number(hi)}]" if math.isfinite(lo) else ""
    return f"{format_number(gap, sign=True)}{interval}"


def _passes(passes: float) -> str:
    return f"{passes:.2f}" if passes >= 0.1 else f"{passes:.4f}"  # 0.0032 passes is not 0.00


def comparison_section(label: str, ratios: list[dict[str, Any]], gaps: list[dict[str, Any]]) -> str:
    """The README's section: both tables, and what they can and cannot say."""
    ratio_table = markdown_table(
        ["fit", "ratio of", "this grid", label],
        [
            [
                r["fit"],
                QUANTITY_WORDS.get(r["quantity"], r["quantity"]),
                ratio_cell(r["ratio"], r["lo"], r["hi"], r["status"]),
                ratio_cell(r["compared_ratio"], r["compared_lo"], r["compared_hi"], r["compared_status"]),
            ]
            for r in ratios
        ],
    )
    arch, reference = (gaps[0]["arch"], gaps[0]["reference"]) if gaps else ("", "")
    gap_table = markdown_table(
        ["size", "tokens", "passes", "this grid", f"passes ({label})", label, "change"],
        [
            [
                g["size"],
                si(g["tokens"]),
                _passes(g["passes"]),
                _gap_cell(g["gap"], g["gap_lo"], g["gap_hi"]),
                _passes(g["compared_passes"]),
                _gap_cell(g["compared_gap"], g["compared_gap_lo"], g["compared_gap_hi"]),
                format_number(g["gap_change"], sign=True),
            ]
            for g in gaps
        ],
    )
    return "\n".join(
        [
            f"## Beside `{label}`",
            "",
            "The headline equal-loss ratios, each at its largest trained value (`compared_ratios.csv`):",
            "",
            ratio_table,
            "",
            f"The final validation loss of `{arch}` minus `{reference}`'s, paired by seed, mean and 95% "
            "t interval, at every (size, budget) both grids trained, and how it changed (`compared_gaps.csv`, "
            "with each side's parameters and seeds):",
            "",
            gap_table if gaps else "(no (size, budget) point in common)",
            "",
            "The two grids differ in everything their runs' configurations differ in (`runs.parquet` of "
            "each, or the recipe's scales): these tables say how the results moved, not which change "
            "moved them.",
        ]
    )
