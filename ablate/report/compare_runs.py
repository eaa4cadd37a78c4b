"""A report's runs beside another report folder's (`ablate report --compare-with reports/table6-cpu/`).

Two studies that share rows (the same variants, budgets and seeds) differ in whatever the second changed:
its corpus, its parametrization, its lr. The comparison matches each finished run of this report with
the other folder's run of the same variant, seed and token budget, and, where both folders record them
(their exports' tags and params), the same non-embedding parameter count (the shape) and the same lr. For
each matched (variant, parameters, budget, lr) it writes, into `compared_<FOLDER NAME>.csv`:

- each side's mean final validation loss, passes over its training split and share of tokens read twice
  (ablate.data.passes.read_twice: by how the runs drew their windows, `data.sampling`);
- the loss here minus there, paired by seed, 95% Student-t interval, only where the two runs of a pair
  read the same data (every `data.*` key of their configurations equal: the same corpus, tokenizer and
  windows); losses on different corpora do not compare, so that cell is empty there (`same_data`);
- the row's paired gap to the reference row (the Transformer, else the first variant) on each side, over
  the matched seeds, and how it changed.

The other folder is read from the files a report or a grid fit writes (`budgets.csv`, else `points.csv`,
else `table.csv` with `summary.csv`'s budgets) and, when it has one, its export (ablate.store.export), so
a folder committed without its stores compares as well as one just made; the path is kept in the export,
and `ablate report --from` reads it again from the checkout. Written here rather than by a library: no
library pairs runs across two studies by their recorded configuration. It says what differs, not which
change made the difference.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from ablate.core import fields
from ablate.core.errors import UserError
from ablate.data.passes import EARLIER_SAMPLING, read_twice, sampling_of
from ablate.report.stats import paired_difference
from ablate.store import names

RUN_FILES = ("budgets.csv", "points.csv", "table.csv")  # the first a folder has lists its runs
REFERENCE = "transformer"


def output_name(folder: str | Path) -> str:
    return f"compared_{Path(folder).name}.csv"


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _read(path: Path) -> list[dict[str, str]]:
    """A compared folder's CSV file, read as data (ablate.core.fields: one line if it is not one)."""
    return fields.csv_rows(
        path, "--compare-with", hint="give a report folder `ablate report` or `ablate fit` wrote"
    )


def runs_of(folder: str | Path, client: Any = None) -> list[dict[str, Any]]:
    """Every finished run a report folder lists: variant, seed, tokens, passes, loss, and (from `client`,
    an MlflowClient or the folder's export) its non-embedding parameters, lr and data settings."""
    from ablate.store.export import ExportedRuns, has_export

    folder = Path(folder)
    name = next((n for n in RUN_FILES if (folder / n).is_file()), None)
    if name is None:
        raise UserError(
            f"--compare-with: {str(folder)!r} holds none of {', '.join(RUN_FILES)}; give a report folder "
            "`ablate report` or `ablate fit --form grid` wrote, e.g. reports/table6-cpu/"
        )
    rows = _read(folder / name)
    budgets: dict[str, float] = {}
    if name == "table.csv" and (folder / "summary.csv").is_file():
        budgets = {r["variant"]: _number(r.get("tokens")) for r in _read(folder / "summary.csv")}
    if client is None and has_export(folder):
        client = ExportedRuns(folder)
    runs = []
    for row in rows:
        if row.get("state", "finished") != "finished":
            continue
        run = {
            "variant": row.get("variant") or row.get("arch", ""),
            "size": row.get("size", ""),
            "seed": int(_number(row["seed"])),
            "tokens": _number(row.get("tokens", budgets.get(row.get("variant", ""), math.nan))),
            "passes": _number(row.get("passes")),
            "loss": _number(row.get("valid", row.get("loss"))),
            "params": _number(row.get("params")),
            "lr": _number(row.get("base.train.lr")),
            "data": None,
            "sampling": EARLIER_SAMPLING,  # a folder without an export: runs made before data.sampling
        }
        run_id = row.get("mlflow_run_id")
        if client is not None and run_id:
            data = client.get_run(run_id).data
            tokens = data.tags.get(names.BUDGET_TOKENS) or data.tags.get(names.TOKENS)
            run["tokens"] = _number(tokens) if not math.isfinite(run["tokens"]) else run["tokens"]
            run["params"] = _number(data.tags.get(names.NON_EMBEDDING_PARAMS))
            run["lr"] = _number(data.params.get("train.lr"))
            run["data"] = tuple(sorted((k, v) for k, v in data.params.items() if k.startswith("data.")))
            run["sampling"] = sampling_of(dict(data.params))
        if math.isfinite(run["loss"]):
            runs.append(run)
    return runs


def _key(run: dict[str, Any], other: dict[str, Any]) -> bool:
    """Two runs match: the same variant, seed and budget, and the same shape and lr where both know them."""
    if (run["variant"], run["seed"], run["tokens"]) != (other["variant"], other["seed"], other["tokens"]):
        return False
    return all(
        not (math.isfinite(run[k]) and math.isfinite(other[k])) or run[k] == other[k]
        for k in ("params", "lr")
    )


def _group(run: dict[str, Any]) -> tuple:
    return (run["variant"], run["params"], run["tokens"], run["lr"])


def _gap(
    by_seed: dict[tuple, dict[int, float]], sizes: dict[tuple, str], group: tuple, reference: str
) -> Any:
    """The group's paired gap to the reference row of the same size label, budget and lr, on one side."""
    if group[0] == reference:
        return None
    ref = [g for g in by_seed if g[0] == reference and g[2:] == group[2:] and sizes[g] == sizes[group]]
    return paired_difference(by_seed[group], by_seed[ref[0]]) if len(ref) == 1 else None


def compared_runs(own: list[dict[str, Any]], other: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (variant, parameters, budget, lr) with runs on both sides (see the module doc)."""
    pairs: dict[tuple, list[tuple[dict, dict]]] = defaultdict(list)
    for run in own:
        match = [o for o in other if _key(run, o)]
        if len(match) == 1:
            pairs[_group(run)].append((run, match[0]))
    here = {g: {a["seed"]: a["loss"] for a, _ in p} for g, p in pairs.items()}
    there = {g: {b["seed"]: b["loss"] for _, b in p} for g, p in pairs.items()}
    size_here = {g: p[0][0]["size"] for g, p in pairs.items()}
    size_there = {g: p[0][1]["size"] for g, p in pairs.items()}
    variants = list(dict.fromkeys(r["variant"] for r in own))
    reference = REFERENCE if REFERENCE in variants else (variants[0] if variants else "")
    order = {v: i for i, v in enumerate(variants)}
    rows = []
    for group in sorted(pairs, key=lambda g: (order[g[0]], g[1], g[2], g[3])):
        p = pairs[group]
        same = all(a["data"] is not None and a["data"] == b["data"] for a, b in p)
        change = paired_difference(here[group], there[group]) if same else None
        gap = _gap(here, size_here, group, reference)
        compared_gap = _gap(there, size_there, group, reference)
        nan = math.nan
        rows.append(
            {
                "variant": group[0],
                "size": size_here[group],
                "compared_size": size_there[group],
                "params": group[1],
                "tokens": group[2],
                "lr": group[3],
                "seeds": len(p),
                "passes": round(_mean(a["passes"] for a, _ in p), 4),
                "read_twice": round(_mean(read_twice(a["passes"], a["sampling"]) for a, _ in p), 4),
                "loss": _mean(here[group].values()),
                "compared_passes": round(_mean(b["passes"] for _, b in p), 4),
                "compared_read_twice": round(_mean(read_twice(b["passes"], b["sampling"]) for _, b in p), 4),
                "compared_loss": _mean(there[group].values()),
                "same_data": "yes" if same else "no",
                "loss_change": change.mean if change else nan,
                "loss_change_lo": change.lo if change else nan,
                "loss_change_hi": change.hi if change else nan,
                "reference": reference,
                "gap": gap.mean if gap else nan,
                "gap_lo": gap.lo if gap else nan,
                "gap_hi": gap.hi if gap else nan,
                "compared_gap": compared_gap.mean if compared_gap else nan,
                "compared_gap_lo": compared_gap.lo if compared_gap else nan,
                "compared_gap_hi": compared_gap.hi if compared_gap else nan,
                "gap_change": gap.mean - compared_gap.mean if gap and compared_gap else nan,
            }
        )
    return rows


def _mean(values: Any) -> float:
    values = [v for v in values if math.isfinite(v)]
    return sum(values) / len(values) if values else math.nan


def checked_folders(folders: list[str]) -> list[str]:
    """`--compare-with` as the export keeps it (each path relative to the current folder, inside it: the
    caller makes an absolute one inside relative), after reading each folder once, so a wrong one is one
    line before any store is opened."""
    from ablate.store.export_checks import relative_inside

    out = []
    for folder in folders:
        runs_of(folder)
        path = str(folder).rstrip("/")
        if not relative_inside(path):
            raise UserError(
                f"--compare-with: {path!r} is outside the current folder; the export keeps the path "
                "relative for `ablate report --from`: run from the checkout that holds it"
            )
        if output_name(path) in {output_name(p) for p in out}:
            raise UserError(f"--compare-with: {path!r} is given twice (or two folders share its name)")
        out.append(path)
    return out


def write_comparisons(folder: Path, client: Any, compare_with: list[str]) -> list[Path]:
    """`compared_<NAME>.csv` in `folder` for each compared folder, from the runs `folder`'s report lists."""
    from ablate.report.table import write_csv

    own = runs_of(folder, client)
    return [
        write_csv(folder / output_name(other), compared_runs(own, runs_of(other))) for other in compare_with
    ]
