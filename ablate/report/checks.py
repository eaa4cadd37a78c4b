"""What a Table 6-style report must say about itself, so a reader knows what its numbers can carry.

- Tokens and convergence (a header line): the tokens each run trained on, and whether the runs had
  converged: per run, `ablate.fitting.fit_loss_curve` fits `E + A t^-alpha` to the validations after
  warmup (the same fit `ablate fit` records as `ablate.fit.converged`); a run counts as converged when the
  fitted curve predicts less than 1% lower loss from twice its tokens. Rows with a run that had not
  converged are marked `†`, rows with a run too short to tell `?`.
- Passes over the training data (a header line): the training split's tokens and each run's passes
  over them (`ablate.data.passes`); rows with a run past one pass are marked `↻`, and the line says what
  reading text again does to a comparison.
- The learning-rate protocol: one lr shared by every row, or each row at its best lr of a searched grid.
- No effect resolved: a sentence when every paired difference's interval contains zero.
- Purpose: a scale may say what it is for (`scales.<name>.purpose:` in the recipe); the `tiny` scale,
  without one, is called a pipeline check.
- Learning-rate sensitivity (a searched grid): each row's loss at each value of the grid, and a flag
  where a row's sign against the reference row, or the order of the rows, changes across the grid.

Pure functions over the report's `RunRecord`s (duck-typed: variant, seed, size, state, values, searched,
tags, params, curve, run_id): no MLflow, no torch.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ablate.core.errors import UserError
from ablate.core.tables import markdown_table, si
from ablate.data import passes
from ablate.fitting.curve import DEFAULT_REL_GAIN, fit_loss_curve
from ablate.recipe.search import point_label
from ablate.report.stats import PairedDiff
from ablate.store import names

NOT_CONVERGED = "†"
UNKNOWN = "?"
FLIPS = "⇅"
ALL_CONTAIN_ZERO = (
    "No row is resolved from the reference: every paired difference's 95% interval contains "
    "zero, so this table does not rank the rows (more seeds, or more tokens per run, would be "
    "needed to tell them apart)."
)
TINY_PURPOSE = (
    "The `tiny` scale is a pipeline check: it shows that every row trains, logs and reports end to "
    "end in minutes on a CPU. Its runs are far too short to say anything about the architectures "
    "(early training measures the warmup and the learning rate as much as the model)."
)


# --- convergence ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Convergence:
    converged: bool | None  # None: the curve could not be fitted (too few validations after warmup)
    predicted_gain: float  # (L(t) - L(2t)) / L(t) of the fitted curve at the run's last validation
    reason: str = ""


def warmup_tokens(params: Mapping[str, Any]) -> float:
    """Warmup in tokens from a run's MLflow params (`train.warmup_steps` x `train.batch_tokens`); 0 if absent."""
    try:
        return float(params["train.warmup_steps"]) * float(params["train.batch_tokens"])
    except (KeyError, TypeError, ValueError):
        return 0.0


def run_convergence(
    curve: Sequence[tuple[float, float]], warmup: float, rel_gain_threshold: float = DEFAULT_REL_GAIN
) -> Convergence:
    """Whether one run's validation curve (tokens, loss) had converged (module doc)."""
    points = [(t, v) for t, v in curve if math.isfinite(t) and math.isfinite(v)]
    try:
        fit = fit_loss_curve(
            [t for t, _ in points],
            [v for _, v in points],
            warmup_tokens=warmup,
            rel_gain_threshold=rel_gain_threshold,
        )
    except UserError as e:
        return Convergence(None, math.nan, str(e))
    return Convergence(fit.converged, fit.predicted_gain)


def convergence_by_run(records: Iterable[Any]) -> dict[str, Convergence]:
    """Run id -> convergence, for every finished run."""
    return {
        r.run_id: run_convergence(r.curve, warmup_tokens(getattr(r, "params", {}) or {}))
        for r in records
        if r.state == "finished" and r.run_id
    }


def row_mark(convergences: Iterable[Convergence]) -> str:
    """`†` when a run of the row had not converged, `?` when one could not be told, '' otherwise."""
    flags = [c.converged for c in convergences]
    if any(f is False for f in flags):
        return NOT_CONVERGED
    if any(f is None for f in flags):
        return UNKNOWN
    return ""


def run_tokens(record: Any) -> float:
    """Tokens a run trained on: its `ablate.tokens` tag (steps x batch tokens), else its last validation's."""
    try:
        return float(record.tags[names.TOKENS])
    except (KeyError, TypeError, ValueError, AttributeError):
        return float(record.curve[-1][0]) if record.curve else math.nan


def tokens_and_convergence(
    records: Sequence[Any],
    convergence: Mapping[str, Convergence],
    rel_gain_threshold: float = DEFAULT_REL_GAIN,
) -> str:
    """The header line: tokens per run, and whether the runs had converged."""
    finished = [r for r in records if r.state == "finished" and r.run_id]
    tokens = sorted({run_tokens(r) for r in finished if math.isfinite(run_tokens(r))})
    if not tokens:
        token_text = "Tokens per run: unknown"
    elif len(tokens) == 1:
        token_text = f"Tokens per run: {si(tokens[0])}"
    else:
        token_text = f"Tokens per run: {si(tokens[0])} to {si(tokens[-1])}"
    flags = [convergence[r.run_id].converged for r in finished if r.run_id in convergence]
    n, bad, unknown = len(flags), flags.count(False), flags.count(None)
    rule = f"its fitted loss curve predicts under {rel_gain_threshold:.0%} lower loss from twice the tokens"
    gains = sorted(
        convergence[r.run_id].predicted_gain
        for r in finished
        if r.run_id in convergence and math.isfinite(convergence[r.run_id].predicted_gain)
    )
    # What the runs reach, whichever way the verdict goes: a reader weighs 1.2% differently from 12%.
    reach = ""
    if gains:
        median = (
            gains[len(gains) // 2]
            if len(gains) % 2
            else (gains[len(gains) // 2 - 1] + gains[len(gains) // 2]) / 2
        )
        spread = f", {gains[0]:.1%} to {gains[-1]:.1%}" if len(gains) > 1 else ""
        reach = f"; predicted gain from twice the tokens: median {median:.1%}{spread}"
    if n == 0:
        converged = "Converged: no finished runs"
    elif bad:
        converged = (
            f"Converged: NO, {bad} of {n} runs had not (marked {NOT_CONVERGED}: a run counts as converged "
            f"when {rule}{reach}); their differences may be transients of training, not of the architectures"
        )
    elif unknown == n:
        converged = (
            f"Converged: unknown (too few validations after warmup to fit a loss curve; marked {UNKNOWN})"
        )
    else:
        converged = f"Converged: yes, {n - unknown} of {n} runs ({rule}{reach})"
        if unknown:
            converged += f"; {unknown} too short to tell (marked {UNKNOWN})"
    return f"**{token_text}. {converged}.**"


# --- passes over the training data ------------------------------------------------------------------------
def data_line(records: Sequence[Any]) -> str:
    """The header line: the training split's tokens and the passes the finished runs made over it
    (ablate.data.passes), with what repetition does to the comparison when a run passed once; '' when no
    run drew from a corpus (a task) or none recorded its split."""
    text, repeated = usage_summary([r for r in records if r.state == "finished" and r.run_id])
    if not text:
        return ""
    pointer = (
        " `table.csv` sets each run's training loss at its end (`train_loss_end`) beside its validation loss."
    )
    return f"**Data: {text}.**" + (f" {passes.REPEAT_EFFECT}{pointer}" if repeated else "")


def usage_summary(runs: Sequence[Any]) -> tuple[str, bool]:
    """The passes of `runs` (anything with `split_tokens`, `passes` and `sampling`) over each training split
    they drew from, with the share of their tokens read twice, and whether any is past one pass; ('', False)
    when no run recorded its split."""
    splits = sorted({r.split_tokens for r in runs if math.isfinite(r.split_tokens)})
    drew = {s: [r for r in runs if r.split_tokens == s] for s in splits}
    text = "; ".join(
        _source_of(drew[s]) + passes.usage_line(s, [r.passes for r in drew[s]], [r.sampling for r in drew[s]])
        for s in splits
    )
    return text, any(passes.repeats(r.passes) for r in runs)


def _source_of(runs: Sequence[Any]) -> str:
    """'stdlib: ' when the runs name one data source (a path by its last part: no place of the machine
    that trained goes into a report), else ''."""
    sources = {r.params.get("data.source") if isinstance(r.params, Mapping) else None for r in runs}
    if len(sources) != 1 or None in sources:
        return ""
    (source,) = sources
    return f"{source.rstrip('/').rsplit('/', 1)[-1]}: "


def passes_columns(csv_rows: list[dict[str, Any]], records: Iterable[Any]) -> None:
    """`train_split_tokens`, `passes`, `read_twice` (the share of its tokens read twice: exact, or expected
    for windows at random offsets; ablate.data.passes) and `repeats_data` of each CSV row's run."""
    by_id = {r.run_id: r for r in records if r.run_id}
    for row in csv_rows:
        r = by_id.get(row.get("mlflow_run_id"))
        p = r.passes if r is not None else math.nan
        row["train_split_tokens"] = r.split_tokens if r is not None else math.nan
        row["passes"] = round(p, 4) if math.isfinite(p) else math.nan
        row["read_twice"] = round(passes.read_twice(p, r.sampling), 4) if math.isfinite(p) else math.nan
        row["repeats_data"] = "" if not math.isfinite(p) else ("yes" if passes.repeats(p) else "no")


# --- the learning-rate protocol --------------------------------------------------------------------------
def lr_protocol(records: Sequence[Any], searched: bool) -> str:
    """One sentence: how the rows' learning rates were chosen."""
    lrs = sorted(
        {float(r.params["train.lr"]) for r in records if "train.lr" in (getattr(r, "params", {}) or {})}
    )
    warmups = sorted({str(r.params.get("train.warmup_steps")) for r in records if getattr(r, "params", None)})
    warmup = f", {warmups[0]} warmup steps" if len(warmups) == 1 and warmups[0] != "None" else ""
    if searched:
        return (
            "Learning rates: each row at its best point of the searched grid (mean over seeds of the final "
            f"validation loss; see the sensitivity table){warmup}."
        )
    if len(lrs) == 1:
        return f"Learning rate: {lrs[0]:g} shared by every row (one lr for all, not tuned per row){warmup}."
    if lrs:
        return f"Learning rates: {', '.join(f'{v:g}' for v in lrs)} (set per row by the recipe){warmup}."
    return "Learning rate: not recorded."


# --- intervals -------------------------------------------------------------------------------------------
def all_intervals_contain_zero(diffs: Iterable[PairedDiff]) -> bool:
    """True when there is at least one paired difference, each has an interval (n >= 2), and every
    interval contains zero. Without intervals (one seed) nothing is claimed either way."""
    diffs = list(diffs)
    return bool(diffs) and all(d.n >= 2 and math.isfinite(d.lo) and d.lo <= 0.0 <= d.hi for d in diffs)


# --- purpose ---------------------------------------------------------------------------------------------
def scale_purpose(purpose: str | None, scale: str) -> str:
    """What the scale is for: the recipe's `scales.<scale>.purpose`, or the tiny scale's default."""
    if purpose and purpose.strip():
        return purpose.strip()
    return TINY_PURPOSE if scale == "tiny" else ""


# --- learning-rate sensitivity ----------------------------------------------------------------------------
@dataclass
class Sensitivity:
    points: list[tuple]  # searched points, each a sorted tuple of (key, value)
    rows: list[tuple[str, str]]  # (size, variant), reference first within each size
    loss: dict[tuple[str, str], dict[tuple, float]]  # mean final validation loss over finished seeds
    seeds: dict[tuple[str, str], dict[tuple, int]]
    flips: dict[tuple[str, str], bool]  # the row's sign against the reference changes across the grid
    orders: dict[str, dict[tuple, list[str]]]  # size -> point -> variants, best first
    order_changes: dict[str, bool]  # size -> the order of the rows differs between points

    def best(self, row: tuple[str, str]) -> tuple | None:
        """The row's best searched point (lowest mean loss), None when no point finished."""
        return min(self.loss[row], key=self.loss[row].get) if self.loss[row] else None


def _sort_key(point: tuple) -> tuple:
    return tuple((k, (0, v) if isinstance(v, int | float) else (1, str(v))) for k, v in point)


def lr_sensitivity(
    records: Sequence[Any], variant_order: Sequence[str], size_order: Sequence[str] = ()
) -> Sensitivity | None:
    """Each row's mean final loss at each searched point (None without a search); flags as in the module doc.
    Rows go by `size_order` (sizes it does not name after them, by name), then by `variant_order`."""
    searched = [r for r in records if r.searched]
    if not searched:
        return None
    points = sorted({tuple(sorted(r.searched.items())) for r in searched}, key=_sort_key)
    values: dict[tuple[str, str], dict[tuple, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in searched:
        v = r.values.get("valid", math.nan)
        if r.state == "finished" and math.isfinite(v):
            values[(r.size, r.variant)][tuple(sorted(r.searched.items()))].append(v)
    rank = {v: i for i, v in enumerate(variant_order)}
    size_rank = {s: i for i, s in enumerate(size_order)}
    rows = sorted(
        {(r.size, r.variant) for r in searched},
        key=lambda k: (size_rank.get(k[0], len(size_rank)), k[0], rank.get(k[1], len(rank)), k[1]),
    )
    loss = {row: {p: sum(vs) / len(vs) for p, vs in values[row].items() if vs} for row in rows}
    seeds = {row: {p: len(vs) for p, vs in values[row].items()} for row in rows}
    flips, orders, order_changes = {}, {}, {}
    for size in dict.fromkeys(s for s, _ in rows):
        mine = [row for row in rows if row[0] == size]
        reference = mine[0]
        for row in mine[1:]:
            signs = {
                math.copysign(1.0, loss[row][p] - loss[reference][p])
                for p in points
                if p in loss[row] and p in loss[reference] and loss[row][p] != loss[reference][p]
            }
            flips[row] = len(signs) == 2
        complete = [p for p in points if all(p in loss[row] for row in mine)]
        orders[size] = {p: [v for _, v in sorted(mine, key=lambda row: loss[row][p])] for p in complete}
        order_changes[size] = len({tuple(o) for o in orders[size].values()}) > 1
    return Sensitivity(points, rows, loss, seeds, flips, orders, order_changes)


def sensitivity_rows(s: Sensitivity, labels: Mapping[str, str]) -> list[dict[str, Any]]:
    """The sensitivity table as rows (`lr_sensitivity.csv`): one per row and searched point, with the row's
    mean loss there, its difference from the reference row at the same point, and whether it is the row's
    best point and its sign flips across the grid."""
    out = []
    for row in s.rows:
        size, variant = row
        reference = next(r for r in s.rows if r[0] == size)
        best = s.best(row)
        for p in s.points:
            v, ref = s.loss[row].get(p, math.nan), s.loss[reference].get(p, math.nan)
            out.append(
                {"variant": variant, "label": labels.get(variant, variant), "size": size}
                | {"point": point_label(p), **{k: value for k, value in p}}
                | {"valid_mean": v, "seeds": s.seeds[row].get(p, 0), "vs_reference": v - ref}
                | {
                    "best_point": "yes" if p == best else "no",
                    "sign_flips": str(s.flips.get(row, "")).lower(),
                }
            )
    return out


def sensitivity_markdown(s: Sensitivity, labels: Mapping[str, str]) -> str:
    """The sensitivity table and its notes (Markdown)."""
    sized = any(size for size, _ in s.rows)
    headers = (
        ["Model"] + (["size"] if sized else []) + [point_label(p) for p in s.points] + ["best", "vs row 1"]
    )
    rows = []
    for row in s.rows:
        size, variant = row
        cells = []
        for p in s.points:
            v = s.loss[row].get(p)
            cells.append(
                "n/a"
                if v is None
                else f"{v:.3f}" + (f" (n={s.seeds[row][p]})" if s.seeds[row][p] > 1 else "")
            )
        best = s.best(row)
        if row not in s.flips:
            versus = "(reference)"
        else:
            versus = f"{FLIPS} flips" if s.flips[row] else "same sign"
        rows.append(
            [labels.get(variant, variant)]
            + ([size] if sized else [])
            + cells
            + [point_label(best) if best else "n/a", versus]
        )
    notes = [
        f"Final validation loss, mean over the seeds run at each point (as numbers, with each row's difference "
        f'from the reference row at each point: lr_sensitivity.csv). "vs row 1": {FLIPS} when the row '
        "is better than the reference row at one point of the grid and worse at another, so its sign in "
        "the table depends on the learning rate."
    ]
    flipped = [labels.get(v, v) + (f" ({size})" if size else "") for (size, v), f in s.flips.items() if f]
    if flipped:
        notes.append(
            f"WARNING: the sign against the reference flips across the grid for: {', '.join(flipped)}."
        )
    for size, changed in s.order_changes.items():
        if changed:
            at = "; ".join(
                f"{point_label(p)}: " + " < ".join(labels.get(v, v) for v in order)
                for p, order in s.orders[size].items()
            )
            notes.append(
                f"WARNING: the ranking of the rows{f' ({size})' if size else ''} changes across the grid "
                f"(best first by loss) — {at}."
            )
    return markdown_table(headers, rows) + "\n\n" + "\n\n".join(notes) + "\n"


# --- per-layer statistics: why a row lags --------------------------------------------------------------------
LAYER_PREFIXES = ("rms/embed", "rms/attn_out/", "lambda/")  # of what is logged per layer, what this reads
SWAMP_FACTOR = 2.0  # attention/embedding RMS this many times the reference row's, at the first validation


def attention_to_embedding(layer_curves: Mapping[str, Sequence[tuple[float, float]]], index: int) -> float:
    """Mean over layers of RMS(attention output) / RMS(embeddings) at validation `index` (0: first, -1: last):
    how loudly the attention writes into a residual stream that starts at the embeddings' scale."""
    embed = layer_curves.get("rms/embed") or []
    attn = [v for k, v in layer_curves.items() if k.startswith("rms/attn_out/") and v]
    if not embed or not attn or any(len(v) != len(embed) for v in attn) or embed[index][1] <= 0:
        return math.nan
    return sum(v[index][1] for v in attn) / len(attn) / embed[index][1]


def mean_lambda(layer_curves: Mapping[str, Sequence[tuple[float, float]]], index: int) -> float:
    values = [v[index][1] for k, v in layer_curves.items() if k.startswith("lambda/") and v]
    return sum(values) / len(values) if values else math.nan


def layer_report(
    records: Sequence[Any], variant_order: Sequence[str], labels: Mapping[str, str]
) -> tuple[str, list[dict[str, Any]]]:
    """A table of attention-to-embedding RMS (first and last validation) and mean λ per row, with a warning
    for rows whose attention starts much louder than the reference row's (that a lag may be a transient, for
    a row whose mean final loss is above the reference row's), and its cells as rows
    (`layer_stats.csv`); ('', []) when no run logged them."""
    groups: dict[tuple[str, str], list[Any]] = defaultdict(list)
    for r in records:
        if r.state == "finished" and getattr(r, "layer_curves", None):
            groups[(r.size, r.variant)].append(r)
    if not groups:
        return "", []
    rank = {v: i for i, v in enumerate(variant_order)}
    keys = sorted(groups, key=lambda k: (k[0], rank.get(k[1], len(rank)), k[1]))

    def mean(values: Iterable[float]) -> float:
        finite = [v for v in values if math.isfinite(v)]
        return sum(finite) / len(finite) if finite else math.nan

    def fmt(v: float, digits: int = 2) -> str:
        return f"{v:.{digits}f}" if math.isfinite(v) else "-"

    first = {k: mean(attention_to_embedding(r.layer_curves, 0) for r in groups[k]) for k in keys}
    last = {k: mean(attention_to_embedding(r.layer_curves, -1) for r in groups[k]) for k in keys}
    lam = {k: mean(mean_lambda(r.layer_curves, -1) for r in groups[k]) for k in keys}
    valid = {k: mean(r.values.get("valid", math.nan) for r in groups[k]) for k in keys}
    sized = any(size for size, _ in keys)
    rows = [
        [labels.get(v, v)]
        + ([size] if sized else [])
        + [fmt(first[(size, v)]), fmt(last[(size, v)]), fmt(lam[(size, v)], 3)]
        for size, v in keys
    ]
    headers = (
        ["Model"]
        + (["size"] if sized else [])
        + ["attn/embed RMS, first validation", "attn/embed RMS, last validation", "mean λ, last"]
    )
    notes = [
        "RMS of each layer's attention output over the RMS of the token embeddings, averaged over layers "
        "and seeds, on one fixed held-out micro-batch (MLflow metrics rms/attn_out/layer_NN, rms/embed, "
        "rms/residual/layer_NN; λ: lambda/layer_NN). As numbers: layer_stats.csv."
    ]
    for size in dict.fromkeys(s for s, _ in keys):
        mine = [k for k in keys if k[0] == size]
        ref = first[mine[0]]
        loud = [
            k
            for k in mine[1:]
            if math.isfinite(first[k]) and math.isfinite(ref) and first[k] > SWAMP_FACTOR * ref
        ]
        for k in loud:
            leads = valid[k] <= valid[mine[0]]  # False when either mean is unknown (nan)
            notes.append(
                f"{labels.get(k[1], k[1])}{f' ({size})' if size else ''}: its attention writes "
                f"{first[k]:.1f}x the embeddings' RMS at the first validation (reference row: {ref:.1f}x), "
                "so early on it swamps the embeddings; "
                + (
                    "its mean final validation loss is not above the reference row's even so."
                    if leads
                    else "a lag of this row may be a transient of the warmup and learning rate rather "
                    "than of the architecture."
                )
            )
    cells = [
        {"variant": v, "label": labels.get(v, v), "size": size, "seeds": len(groups[(size, v)])}
        | {"attn_over_embed_rms_first": first[(size, v)], "attn_over_embed_rms_last": last[(size, v)]}
        | {"mean_lambda_last": lam[(size, v)]}
        for size, v in keys
    ]
    return markdown_table(headers, rows) + "\n\n" + "\n\n".join(notes) + "\n", cells
