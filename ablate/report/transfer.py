"""Does the best learning rate transfer across sizes? A sized lr grid's answer, per row (`transfer.csv`).

A search over `base.train.lr` at two or more sizes (a scaling recipe's lr grid) chooses each (row, size)'s
best lr: the grid point of lowest mean final validation loss over seeds, as the sensitivity table marks it
(`ablate.report.checks.lr_sensitivity`). This module sets those choices side by side per row: the best lr
at each size, each seed's own best (how firmly the seeds agree), the loss there with its spread over seeds,
and whether the best is the same grid point as at the row's smallest size, or by what factor it moved.
That is the check μP's promise needs (docs/parametrization.md: one lr tuned at the base width holds at
every width), and the drift a standard parametrization shows instead.

A search spec may name an earlier grid to set beside it (`compare_with: {path: .../lr_sensitivity.csv,
label: standard}`): its rows are read from that CSV (its best point per row and size; its seeds are not
in it, so no per-seed column) and written under the label. The file is read from the checkout, like the
recipe and the search spec, so `ablate report --from` writes the same table again.

Pure functions over the report's `RunRecord`s (variant, seed, size, state, values, searched, params): no
MLflow, no torch.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ablate.core import fields
from ablate.core.errors import UserError
from ablate.core.tables import markdown_table
from ablate.report.checks import lr_sensitivity

LR = "base.train.lr"
THIS = "this study"


@dataclass(frozen=True)
class Choice:
    """One (row, size)'s best lr of the grid."""

    source: str  # THIS, or the compared CSV's path
    parametrization: str
    variant: str
    label: str
    size: str
    lr: float  # best by the mean over seeds
    loss: float  # its mean final validation loss
    seeds: int  # seeds behind that mean
    loss_min: float = math.nan  # over the seeds at the best lr
    loss_max: float = math.nan
    seed_best: tuple[tuple[int, float], ...] = ()  # (seed, that seed's own best lr)
    at_edge: bool = False  # the best is the grid's smallest or largest lr (of 3 or more)


def parametrization_of(params: Mapping[str, Any]) -> str:
    """A run's `model.parametrization` from its MLflow params (flattened: a name, or a mapping's name)."""
    return str(params.get("model.parametrization.name") or params.get("model.parametrization") or "standard")


def own_choices(
    records: Sequence[Any], variant_order: Sequence[str], size_order: Sequence[str], labels: Mapping[str, str]
) -> list[Choice]:
    """Each (row, size)'s best lr over the finished runs of a search over `base.train.lr` alone; [] when the
    study searched something else, or has fewer than two sizes."""
    runs = [
        r
        for r in records
        if set(r.searched) == {LR}
        and r.state == "finished"
        and math.isfinite(r.values.get("valid", math.nan))
    ]
    if len({r.size for r in runs}) < 2:
        return []
    losses: dict[tuple[str, str], dict[float, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    kinds: dict[tuple[str, str], set[str]] = defaultdict(set)
    for r in runs:
        losses[(r.variant, r.size)][float(r.searched[LR])][r.seed] = r.values["valid"]
        kinds[(r.variant, r.size)].add(parametrization_of(r.params or {}))
    grid = sorted({float(r.searched[LR]) for r in records if LR in r.searched})
    sensitivity = lr_sensitivity(runs, variant_order, size_order)  # the mean and best the grid's table shows
    out = []
    for key in _ordered(losses, variant_order, size_order):
        variant, size = key
        by_lr = losses[key]
        mean = {float(dict(point)[LR]): loss for point, loss in sensitivity.loss[(size, variant)].items()}
        best = float(dict(sensitivity.best((size, variant)))[LR])
        seeds = sorted({s for v in by_lr.values() for s in v})
        seed_best = tuple(
            (s, min((lr for lr in by_lr if s in by_lr[lr]), key=lambda lr, s=s: by_lr[lr][s])) for s in seeds
        )
        at_best = list(by_lr[best].values())
        out.append(
            Choice(
                THIS,
                "/".join(sorted(kinds[key])),
                variant,
                labels.get(variant, variant),
                size,
                best,
                mean[best],
                len(at_best),
                min(at_best),
                max(at_best),
                seed_best,
                len(grid) >= 3 and best in (grid[0], grid[-1]),
            )
        )
    return out


def compared_choices(path: str | Path, label: str) -> list[Choice]:
    """The best lr per (row, size) of an earlier grid's `lr_sensitivity.csv`, in the CSV's order."""
    path = Path(path)
    hint = "give a sized lr grid's lr_sensitivity.csv"
    rows = fields.csv_rows(path, "compare_with.path", {"variant", "size", LR, "valid_mean"}, hint)
    if not rows:
        raise UserError(f"compare_with.path: {str(path)!r} holds no rows; {hint}")
    grid: dict[tuple[str, str], dict[float, tuple[float, int]]] = defaultdict(dict)
    labels: dict[str, str] = {}
    for line, row in enumerate(rows, start=2):  # line 1 is the header
        where = f"compare_with.path: {str(path)!r} line {line}"
        value = fields.field(where, "valid_mean", row["valid_mean"], fields.NUMBER_TEXT, hint)
        lr = fields.field(where, LR, row[LR], fields.NUMBER_TEXT, hint)
        if math.isfinite(value):
            seeds = fields.field(where, "seeds", row.get("seeds") or "0", fields.INTEGER_TEXT, hint)
            grid[(row["variant"], row["size"])][lr] = (value, seeds)
            labels[row["variant"]] = row.get("label") or row["variant"]
    lrs = sorted({float(row[LR]) for row in rows})
    out = []
    for (variant, size), by_lr in grid.items():
        best = min(by_lr, key=lambda lr: by_lr[lr][0])
        loss, seeds = by_lr[best]
        edge = len(lrs) >= 3 and best in (lrs[0], lrs[-1])
        out.append(Choice(str(path), label, variant, labels[variant], size, best, loss, seeds, at_edge=edge))
    return out


def _ordered(keys: Any, variant_order: Sequence[str], size_order: Sequence[str]) -> list[tuple[str, str]]:
    rank = {v: i for i, v in enumerate(variant_order)}
    size_rank = {s: i for i, s in enumerate(size_order)}
    return sorted(
        keys, key=lambda k: (rank.get(k[0], len(rank)), k[0], size_rank.get(k[1], len(size_rank)), k[1])
    )


def _firsts(choices: Sequence[Choice]) -> dict[tuple[str, str], Choice]:
    """(source, variant) -> its choice at the first (smallest) size listed."""
    first: dict[tuple[str, str], Choice] = {}
    for c in choices:
        first.setdefault((c.source, c.variant), c)
    return first


def transfer_rows(choices: Sequence[Choice]) -> list[dict[str, Any]]:
    """`transfer.csv`: one row per (source, row, size), with the move from that row's smallest size."""
    first = _firsts(choices)
    out = []
    for c in choices:
        f = first[(c.source, c.variant)]
        out.append(
            {"source": c.source, "parametrization": c.parametrization, "variant": c.variant, "label": c.label}
            | {"size": c.size, "best_lr": c.lr, "best_valid_mean": c.loss, "seeds": c.seeds}
            | {"best_valid_seed_min": c.loss_min, "best_valid_seed_max": c.loss_max}
            | {"seed_best_lrs": ";".join(f"{s}:{lr:g}" for s, lr in c.seed_best)}
            | {"seeds_agree": _agree(c), "at_grid_edge": "yes" if c.at_edge else "no"}
            | {"first_size": f.size, "first_size_best_lr": f.lr, "lr_factor_vs_first_size": c.lr / f.lr}
            | {"same_point_as_first_size": "yes" if c.lr == f.lr else "no"}
        )
    return out


def _agree(c: Choice) -> str:
    if not c.seed_best:
        return ""
    return "yes" if all(lr == c.lr for _, lr in c.seed_best) else "no"


def moved(factor: float) -> str:
    """0.25 -> 'moved 4x down'; 1 -> 'the same grid point'."""
    if factor == 1:
        return "the same grid point"
    return f"moved {1 / factor:.3g}x down" if factor < 1 else f"moved {factor:.3g}x up"


def transfer_markdown(choices: Sequence[Choice]) -> str:
    """The section: a table of the choices, then one line per (source, row) from its smallest size to its
    largest."""
    first = _firsts(choices)
    rows = []
    for c in choices:
        spread = f" [{c.loss_min:.3f}, {c.loss_max:.3f}]" if c.seeds > 1 and math.isfinite(c.loss_min) else ""
        per_seed = ", ".join(f"s{s}: {lr:g}" for s, lr in c.seed_best) or "-"
        f = first[(c.source, c.variant)]
        versus = (
            "(first size)"
            if c is f
            else (f"same as {f.size}" if c.lr == f.lr else f"{moved(c.lr / f.lr)} from {f.size}")
        )
        source = "this study" if c.source == THIS else f"`{c.source}`"
        rows.append(
            [c.label, c.parametrization, source, c.size, f"{c.lr:g}" + (" (edge)" if c.at_edge else "")]
            + [per_seed, f"{c.loss:.3f}{spread} (n={c.seeds})", versus]
        )
    headers = [
        "Model",
        "parametrization",
        "source",
        "size",
        "best lr",
        "each seed's best",
        "loss there",
        "vs",
    ]
    lines = []
    last: dict[tuple[str, str], Choice] = {}
    for c in choices:
        last[(c.source, c.variant)] = c
    for key, f in first.items():
        c = last[key]
        if c is f:
            continue
        what = moved(c.lr / f.lr)
        at = (
            f"lr={f.lr:g} at {f.size} and {c.size}"
            if c.lr == f.lr
            else f"{f.lr:g} at {f.size} -> {c.lr:g} at {c.size}"
        )
        disagree = [
            x for x in choices if x.source == f.source and x.variant == f.variant and _agree(x) == "no"
        ]
        caveat = f"; the seeds' own bests differ at {', '.join(x.size for x in disagree)}" if disagree else ""
        edge = [x.size for x in choices if x.source == f.source and x.variant == f.variant and x.at_edge]
        edge_text = (
            f"; at the grid's edge at {', '.join(edge)}, so the optimum may lie beyond it" if edge else ""
        )
        lines.append(
            f"- {f.label} ({f.parametrization}, {'this study' if f.source == THIS else f'`{f.source}`'}): {what}, {at}{caveat}{edge_text}."
        )
    notes = (
        "Best lr: the grid point of lowest final validation loss, mean over seeds (the sensitivity table's "
        "best); each seed's best is that seed's own lowest; the loss there is the mean [lowest, highest over "
        'seeds]. "vs": the best lr over the row\'s best at its smallest size (as numbers: transfer.csv).'
    )
    return markdown_table(headers, rows) + "\n\n" + "\n".join(lines) + "\n\n" + notes + "\n"
