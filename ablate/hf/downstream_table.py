"""The downstream table: each task's accuracy and bits per byte per row (mean over seeds with its interval),
each row's paired difference from the reference row (the recipe's first variant) over seeds, and Holm's
correction across tasks (one family per metric: every task x row comparison, at every token budget), with the same statistics as
the loss table (ablate.report.stats). Written as `downstream.csv` and `downstream.md` in the report folder.

Chance, said: an accuracy whose mean lies within the interval of chance (chance ± 1.96 sqrt(c (1 - c) / N),
N the documents scored over all seeds, c the mean of 1 / choices) is marked `within_chance`; a comparison of
two rows both within chance ranks nothing, so it leaves Holm's family (`holm_survives` = "chance"), and the
page says so. Bits per byte has no chance level and still orders the rows.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

from ablate.report import stats

COLUMNS = (
    "task", "metric", "tokens", "variant", "label", "seeds", "mean", "lo", "hi", "chance", "within_chance",
    "diff_vs_first", "diff_lo", "diff_hi", "p_value", "holm_survives",
)  # fmt: skip
METRICS = ("acc", "acc_norm", "bpb")  # then Figure 8's acc_bits_<b>, acc_norm_bits_<b> where scored


def table_rows(scored: list[tuple[Any, int, dict]], order: list[str], labels: dict[str, str]) -> list[dict]:
    """The table's rows from (RunSpec, its training tokens, {task: {metric: value}}) triples; `order` is the
    variants' order (the first is the reference). A budgeted study has rows at every token budget, each
    compared with the reference row at the same tokens."""
    metrics = _metrics(scored)
    by: dict[tuple, dict] = {}  # (task, metric, tokens, variant) -> {seed: value}
    docs: dict[tuple, int] = {}
    chance: dict[str, float] = {}
    for run, tokens, scores in scored:
        for task, values in scores.items():
            for metric in metrics:
                value = float(values.get(metric, math.nan))
                by.setdefault((task, metric, tokens, run.variant), {})[run.seed] = value
            key = (task, tokens, run.variant)
            docs[key] = docs.get(key, 0) + int(values.get("documents", 0))
            chance[task] = float(values.get("chance", math.nan))
    tasks = list(dict.fromkeys(task for _, _, scores in scored for task in scores))
    budgets = sorted({tokens for _, tokens, _ in scored})
    rows = []
    for task in tasks:
        for metric in metrics:
            for tokens in budgets:
                reference = by.get((task, metric, tokens, order[0]), {})
                for variant in order:
                    values = by.get((task, metric, tokens, variant))
                    if values is not None:
                        n = docs.get((task, tokens, variant), 0)
                        rows.append(
                            _row(task, metric, tokens, variant, labels, values, reference, chance, n, order)
                        )
    _holm_per_metric(rows, order[0], metrics)
    return rows


def _metrics(scored: list[tuple[Any, int, dict]]) -> list[str]:
    """METRICS, then the quantized accuracies the scores hold (Figure 8), widest bits first."""
    extra = {m for _, _, scores in scored for values in scores.values() for m in values if "_bits_" in m}
    return [*METRICS, *sorted(extra, key=lambda m: (-int(m.rsplit("_", 1)[1]), m))]


def _accuracy(metric: str) -> bool:
    return metric.startswith("acc")


def _row(task, metric, tokens, variant, labels, values, reference, chance, documents, order) -> dict:
    bounded = _accuracy(metric)
    iv = stats.bounded_mean_ci(values.values(), 0.0, 1.0) if bounded else stats.mean_ci(values.values())
    diff = stats.paired_difference(values, reference) if variant != order[0] else None
    c = chance.get(task, math.nan) if bounded else math.nan
    return {
        "task": task, "metric": metric, "tokens": tokens, "variant": variant, "label": labels.get(variant, variant),
        "seeds": iv.n, "mean": iv.mean, "lo": iv.lo, "hi": iv.hi, "chance": c,
        "within_chance": _within_chance(iv.mean, c, documents) if bounded else "",
        **stats.diff_columns(diff),
    }  # fmt: skip


def _within_chance(mean: float, chance: float, documents: int) -> str:
    if not (math.isfinite(mean) and math.isfinite(chance)) or documents < 1:
        return ""
    half = 1.96 * math.sqrt(chance * (1 - chance) / documents)
    return "true" if abs(mean - chance) <= half else "false"


def _holm_per_metric(rows: list[dict], reference: str, metrics: list[str]) -> None:
    """Holm across tasks, one family per metric; comparisons of two rows within chance leave the family."""
    ref = {(r["task"], r["metric"], r["tokens"]): r for r in rows if r["variant"] == reference}
    for metric in metrics:
        family = []
        for r in rows:
            if r["metric"] != metric or r["variant"] == reference:
                continue
            both = (
                r["within_chance"] == "true"
                and ref.get((r["task"], metric, r["tokens"]), {}).get("within_chance") == "true"
            )
            if both:
                r["holm_survives"] = "chance"
            else:
                family.append(r)
        stats.mark_holm(family, "diff_lo", "diff_hi")
    for r in rows:
        r.setdefault("holm_survives", "")


def write_table(rows: list[dict], folder: Path, settings: Any) -> tuple[Path, Path]:
    """`downstream.csv` and `downstream.md` in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = folder / "downstream.csv", folder / "downstream.md"
    with csv_path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows({k: _cell(r.get(k, "")) for k in COLUMNS} for r in rows)
    md_path.write_text(_markdown(rows, settings))
    return csv_path, md_path


def _cell(value: Any) -> Any:
    return "" if isinstance(value, float) and not math.isfinite(value) else value


def _markdown(rows: list[dict], settings: Any) -> str:
    shots = f"{settings.num_fewshot}-shot"
    lines = [
        f"# Downstream tasks ({shots}, LM Eval Harness)",
        "",
        "Each row's mean over seeds with its 95% interval; beside it the paired difference from the first row "
        "over seeds and whether it survives Holm's correction across tasks (one family per metric). "
        "bpb: the gold answer's bits per byte (lower is better).",
        "",
        "| task | metric | tokens | row | seeds | mean [95% CI] | chance | difference vs first | Holm |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        iv = stats.Interval(r["mean"], r["lo"], r["hi"], r["seeds"])
        diff = "" if not math.isfinite(r["diff_vs_first"]) else (
            f"{stats.format_number(r['diff_vs_first'], sign=True)} "
            f"[{stats.format_number(r['diff_lo'])}, {stats.format_number(r['diff_hi'])}] {stats.format_p(r['p_value'])}"
        )  # fmt: skip
        chance = "" if not math.isfinite(r["chance"]) else (
            f"{r['chance']:.3f}" + (" (within)" if r["within_chance"] == "true" else "")
        )  # fmt: skip
        lines.append(
            f"| {r['task']} | {r['metric']} | {r['tokens']:,} | {r['label']} | {r['seeds']} | {stats.format_ci(iv)} | {chance} "
            f"| {diff} | {r['holm_survives']} |"
        )
    lines += ["", *_chance_note(rows), *_bpb_order(rows)]
    return "\n".join(lines) + "\n"


def _chance_note(rows: list[dict]) -> list[str]:
    accs = [r for r in rows if _accuracy(r["metric"])]
    inside = [r for r in accs if r["within_chance"] == "true"]
    if not accs or not inside:
        return []
    if len(inside) == len(accs):
        return [
            "Every accuracy here is within its interval of chance: the accuracies rank nothing (their "
            "comparisons are left out of Holm's family). Bits per byte still orders the rows.",
            "",
        ]
    return [
        f"{len(inside)} of {len(accs)} accuracies are within their interval of chance; a comparison of two "
        "rows both within chance ranks nothing and is left out of Holm's family.",
        "",
    ]


def _bpb_order(rows: list[dict]) -> list[str]:
    """The rows ordered by their bits per byte, averaged over tasks (lower first)."""
    per = {}
    for r in rows:
        if r["metric"] == "bpb" and math.isfinite(r["mean"]):
            per.setdefault(r["label"], []).append(r["mean"])
    if not per:
        return []
    ordered = sorted(per, key=lambda label: sum(per[label]) / len(per[label]))
    text = ", ".join(f"{label} {sum(per[label]) / len(per[label]):.3f}" for label in ordered)
    return [f"Rows by bits per byte of the gold answers, mean over tasks (lower first): {text}.", ""]
