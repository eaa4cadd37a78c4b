"""A study's prediction, written before its runs as `claims.csv` in its report folder, set beside what the
runs measured (`claims_vs_measured.csv` and a section of `table.md`).

A claim is one row of `claims.csv`: `claim` (its words), `quantity`, `row` (a variant; empty for the
whole table), `low` and `high`. The measured value is read from the report's own rows, so the check and
the table cannot disagree:

- `best_lr`: the row's best lr on the searched grid (`lr_sensitivity.csv`'s best point); held when it is
  `low` (= `high`).
- `mean_loss`: the row's mean final validation loss over seeds (`summary.csv`'s `valid_mean`); held when
  it lies in [low, high].
- `difference_holds`: the row's paired difference to the table's first row and its 95% interval
  (`summary.csv`'s `diff_vs_first`, `diff_lo`, `diff_hi`); held when the interval contains [low, high]
  (low = high = 0: "its interval holds 0").
- `span_of_means`: the largest row mean minus the smallest (`valid_mean`); held when in [low, high].

A claim the runs cannot answer (a row not in the table, a best lr without a searched grid) is measured
as nan and `held` says `unknown`. The budget reports' extrapolated gaps have their own file and format
(`predictions.csv`, ablate.report.predict).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ablate.core import fields
from ablate.core.errors import UserError
from ablate.core.tables import markdown_table

FILE = "claims.csv"
CHECKED = "claims_vs_measured.csv"
QUANTITIES = ("best_lr", "mean_loss", "difference_holds", "span_of_means")
SEARCHED_LR = "base.train.lr"


def read_claims(path: Path) -> list[dict[str, Any]]:
    """The claims of `path`, their bounds as numbers; one line naming the row and column if malformed."""
    rows = fields.csv_rows(path, FILE, hint="the claims written down before the runs: fix the file")
    claims = []
    for i, row in enumerate(rows, start=2):  # line 1 is the header
        if row.get("quantity") not in QUANTITIES:
            raise UserError(
                f"{path}:{i}: quantity {row.get('quantity')!r} is not one of {', '.join(QUANTITIES)}"
            )
        try:
            low, high = float(row["low"]), float(row["high"])
        except (KeyError, TypeError, ValueError):
            raise UserError(f"{path}:{i}: low and high must be numbers") from None
        claim = {"claim": row.get("claim", ""), "quantity": row["quantity"], "row": row.get("row", "")}
        claims.append(claim | {"low": low, "high": high})
    return claims


def measure(claim: dict[str, Any], summary: list[dict[str, Any]], sensitivity: list[dict[str, Any]]) -> dict:
    """The claim with `measured` (and `measured_lo`/`measured_hi` for an interval) and `held`."""
    nan = math.nan
    by_row = {r["variant"]: r for r in summary if not r.get("size")}
    row = by_row.get(claim["row"], {})
    low, high = claim["low"], claim["high"]
    value, lo, hi = nan, nan, nan
    if claim["quantity"] == "best_lr":
        best = [r for r in sensitivity if r["variant"] == claim["row"] and r.get("best_point") == "yes"]
        value = float(best[0][SEARCHED_LR]) if best and SEARCHED_LR in best[0] else nan
        held = math.isclose(value, low, rel_tol=1e-9) and low == high
    elif claim["quantity"] == "mean_loss":
        value = float(row.get("valid_mean", nan))
        held = low <= value <= high
    elif claim["quantity"] == "difference_holds":
        value, lo, hi = (float(row.get(k, nan)) for k in ("diff_vs_first", "diff_lo", "diff_hi"))
        held = lo <= low and high <= hi
    else:  # span_of_means
        means = [float(r["valid_mean"]) for r in by_row.values() if math.isfinite(float(r["valid_mean"]))]
        value = max(means) - min(means) if means else nan
        held = low <= value <= high
    known = math.isfinite(value) and (claim["quantity"] != "difference_holds" or math.isfinite(lo + hi))
    verdict = ("yes" if held else "no") if known else "unknown"
    return claim | {"measured": value, "measured_lo": lo, "measured_hi": hi, "held": verdict}


def check_claims(folder: Path, summary: list[dict], sensitivity: list[dict]) -> tuple[list[dict], str]:
    """(`claims_vs_measured.csv`'s rows, the section of `table.md`) for a folder with a `claims.csv`;
    ([], '') without one."""
    path = folder / FILE
    if not path.is_file():
        return [], ""
    checked = [measure(c, summary, sensitivity) for c in read_claims(path)]
    table = markdown_table(
        ["claim", "predicted", "measured", "held"],
        [[c["claim"], _predicted(c), _measured(c), c["held"]] for c in checked],
    )
    held = sum(c["held"] == "yes" for c in checked)
    section = (
        "\n## Predicted before the runs, beside what they measured\n\n"
        f"`{FILE}` holds what was predicted before the runs (the README says where and when it was first "
        f"written down); {held} of its {len(checked)} claims held (`{CHECKED}`; ablate.report.claims says how "
        f"each is measured).\n\n{table}\n"
    )
    return checked, section


def _predicted(c: dict[str, Any]) -> str:
    low, high = c["low"], c["high"]
    if c["quantity"] == "best_lr":
        return f"{low:g}"
    if c["quantity"] == "difference_holds":
        return f"interval holds {low:g}" if low == high else f"interval holds [{low:g}, {high:g}]"
    return f"[{low:g}, {high:g}]"


def _measured(c: dict[str, Any]) -> str:
    if not math.isfinite(c["measured"]):
        return "-"
    if c["quantity"] == "best_lr":
        return f"{c['measured']:g}"
    if c["quantity"] == "difference_holds":
        return f"{c['measured']:+.3f} [{c['measured_lo']:+.3f}, {c['measured_hi']:+.3f}]"
    return f"{c['measured']:.3f}"
