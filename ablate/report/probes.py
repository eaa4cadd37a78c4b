"""The probe sections of a report (Table 5 and Figure 8 style), from the metrics `ablate eval` logged.

Reads finished runs' MLflow metrics `probe/<probe>/<group>/<stat>` (never a model). For each probe and
group: a table with one row per variant and one column per statistic, each cell the mean over seeds
[95% Student-t interval], and a second table of paired differences to the first row (by seed, as the
loss table; * when the interval excludes 0). A group whose statistics are bit widths (`bits_<b>`) also
gets a plot, score against bits, one line per variant, intervals over seeds (Figure 8). Per-layer
statistics (`<group>/layer_XX/<stat>`) go to `probes.csv` (one row per run), not into the tables; the
tables' cells as numbers go to `probes_summary.csv` (one row per probe, group, statistic and variant).
Written: `probes.md`, `probes.csv`, `probes_summary.csv`, `<probe>_<group>_vs_bits.png`.
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ablate.core.tables import markdown_table
from ablate.report import stats
from ablate.report.table import write_csv
from ablate.store import names

if TYPE_CHECKING:
    from ablate.store.study import SweepContext

PREFIX = "probe/"
BITS = re.compile(r"^bits_(\d+)$")
PAPER_TABLE5 = (
    "Paper (Table 5, 3B models, 0.4M tokens): attention logits top-1 318.0 (Transformer) vs 38.8 (Diff), "
    "median 5.4 vs 3.3; hidden states top-1 3608.6 vs 1688.2. Figure 8 (HellaSwag): Diff holds its "
    "accuracy down to 6 bits; at 4 bits it is about 25 points above the Transformer."
)
NOTES = {
    "outliers": "Outliers: |pre-softmax Q K^T / sqrt(d)| over causal entries (Diff: both maps pooled) and |hidden "
    "states| at each block's output (after both residual additions); top-k and exact median over all "
    "layers; per-layer values in probes.csv.",
    "quantization": "Quantization: dynamic absmax quantization of the attention logits, scale = (2^(b-1) - 1) / "
    "max|X|, X_q = round(X scale) / scale; 16 bits = none. Scored by the mean next-token loss on "
    "held-out tokens (lower is better); loss_increase: that loss minus the same run's 16-bit loss. "
    "Not task accuracy: the paper's Figure 8 scores HellaSwag accuracy, which this probe does not measure.",
}


def _stat_order(stat: str) -> tuple:
    """top1 < top2 < ... < top100 < median (Table 5); bits_16 < bits_8 < ... (wide first, as Figure 8 reads)."""
    bits = BITS.match(stat)
    if bits:
        return (0, "", -int(bits.group(1)), stat)
    number = re.search(r"(\d+)$", stat)
    if number:
        return (1, stat[: number.start()], int(number.group(1)), stat)
    return (2, stat, 0, stat)


def _digits(values: list[float]) -> int:
    """Decimals that show about four significant digits of the column's largest value (3 to 6): a loss
    increase of 2e-4 must not print as 0.000."""
    finite = [abs(v) for v in values if math.isfinite(v) and v != 0]
    if not finite:
        return 3
    return max(3, min(6, 3 - math.floor(math.log10(max(finite)))))


def probe_values(ctx: SweepContext, records: list[Any]) -> dict[str, dict[str, float]]:
    """run id -> {metric: value} of its `probe/` metrics, for finished runs."""
    client = ctx.stores.client()
    values = {}
    for r in records:
        if r.state == "finished" and r.run_id:
            metrics = client.get_run(r.run_id).data.metrics
            found = {k[len(PREFIX) :]: v for k, v in metrics.items() if k.startswith(PREFIX)}
            if found:
                values[r.run_id] = found
    return values


def summary_groups(values: dict[str, dict[str, float]]) -> dict[tuple[str, str], list[str]]:
    """(probe, group) -> its statistics (table columns), from names `<probe>/<group>/<stat>`."""
    groups: dict[tuple[str, str], set[str]] = defaultdict(set)
    for metrics in values.values():
        for name in metrics:
            parts = name.split("/")
            if len(parts) == 3:
                groups[(parts[0], parts[1])].add(parts[2])
    order = sorted(groups, key=lambda key: (key[0], key[1] != "logits", key[1]))  # Table 5: logits first
    return {key: sorted(groups[key], key=_stat_order) for key in order}


@dataclass(frozen=True)
class ProbeGroup:
    """One probe group over a sweep's runs, what its tables and its plot read: the group's statistics
    (`columns`) and the runs' values (`values`: run id -> {`<probe>/<group>/<stat>`: value})."""

    ctx: SweepContext
    records: list[Any]
    values: dict[str, dict[str, float]]
    probe: str
    group: str
    columns: list[str]

    def rows(self) -> list[tuple[str, str, list[Any]]]:
        """(size, variant, finished records) in the recipe's order; the first of each size is the reference."""
        by_key: dict[tuple[str, str], list[Any]] = defaultdict(list)
        for r in self.records:
            if r.state == "finished" and r.run_id:
                by_key[(r.size, r.variant)].append(r)
        sizes = sorted({s for s, _ in by_key}, key=lambda s: (s != "", s))
        variants = self.ctx.recipe.variants
        return [(s, v, by_key[(s, v)]) for s in sizes for v in variants if (s, v) in by_key]

    def metric(self, stat: str) -> str:
        return f"{self.probe}/{self.group}/{stat}"

    def per_seed(self, stat: str, records: list[Any]) -> dict[int, float]:
        """seed -> `stat` of each of `records` (NaN where a run has none)."""
        return {r.seed: self.values.get(r.run_id, {}).get(self.metric(stat), math.nan) for r in records}

    def intervals(self, records: list[Any]) -> list[Any]:
        """Each column's mean over the seeds of `records` with its 95% Student-t interval."""
        return [stats.mean_ci(self.per_seed(c, records).values()) for c in self.columns]


def group_tables(g: ProbeGroup, summary: list[dict[str, Any]] | None = None) -> tuple[str, str]:
    """(values table, paired-difference table) in Markdown for one probe group; each cell as numbers is
    appended to `summary` when given."""
    probe, group, columns = g.probe, g.group, g.columns
    rows = g.rows()
    sized = any(s for s, _, _ in rows)
    digits = {c: _digits([m.get(g.metric(c), math.nan) for m in g.values.values()]) for c in columns}
    labels = {k: v.label for k, v in g.ctx.recipe.variants.items()}
    head = ["Model"] + (["size"] if sized else []) + columns + ["seeds"]
    table, diffs = [], []
    reference: dict[str, list[Any]] = {}
    for size, variant, group_records in rows:
        reference.setdefault(size, group_records)
        first = reference[size] is group_records
        intervals = g.intervals(group_records)
        cells = [stats.format_ci(iv, digits[c]) for iv, c in zip(intervals, columns)]
        probed = sum(1 for r in group_records if r.run_id in g.values)
        lead = [labels.get(variant, variant)] + ([size] if sized else [])
        table.append(lead + cells + [f"{probed}/{len(group_records)}"])
        paired = [
            None
            if first
            else stats.paired_difference(g.per_seed(c, group_records), g.per_seed(c, reference[size]))
            for c in columns
        ]
        if not first:
            diffs.append(lead + [stats.format_diff(d, digits[c]) for d, c in zip(paired, columns)])
        if summary is not None:
            summary += [
                _summary_row(probe, group, *cell, variant, size) for cell in zip(columns, intervals, paired)
            ]
    diff_head = (
        [f"Δ vs {labels.get(rows[0][1], rows[0][1])} (paired)"] + (["size"] if sized else []) + columns
    )
    return markdown_table(head, table), (markdown_table(diff_head, diffs) if diffs else "")


def _summary_row(
    probe: str, group: str, stat: str, iv: Any, diff: Any, variant: str, size: str
) -> dict[str, Any]:
    return {
        "probe": probe,
        "group": group,
        "statistic": stat,
        "variant": variant,
        "size": size,
        "seeds": iv.n,
        "mean": iv.mean,
        "lo": iv.lo,
        "hi": iv.hi,
        **stats.diff_columns(diff),
    }


def plot_vs_bits(g: ProbeGroup, path: Path) -> Path:
    """Figure 8 style: the group's score against bits (wide to narrow), one line per row, with the 95%
    Student-t interval over seeds as error bars when there are two seeds or more."""
    from ablate.core import plot_style
    from ablate.recipe.schema import row_labels

    probe, group = g.probe, g.group
    bits = [int(BITS.match(c).group(1)) for c in g.columns]
    fig, ax = plot_style.figure(6, 4.2)
    labels = row_labels(g.ctx.recipe.variants)  # Table 6's two Transformer rows: the key tells them apart
    colors = plot_style.variant_colors(g.ctx.recipe.variants)
    seeds = 0
    for size, variant, group_records in g.rows():
        cells = g.intervals(group_records)
        seeds = max(seeds, *(c.n for c in cells))
        label = labels.get(variant, variant) + (f" ({size})" if size else "")
        plot_style.series(ax, bits, [c.mean for c in cells], label=label, color=colors[variant])
        if all(c.n >= 2 for c in cells):
            err = [[c.mean - c.lo for c in cells], [c.hi - c.mean for c in cells]]
            ax.errorbar(bits, [c.mean for c in cells], yerr=err, fmt="none", capsize=3, color=colors[variant])
    ax.set_xticks(sorted(set(bits)))
    ax.invert_xaxis()  # 16 bits on the left, as Figure 8
    unit = " (nats/token)" if group.startswith("loss") else ""
    spread = "mean over seeds, 95% Student-t intervals" if seeds >= 2 else "one seed: no intervals"
    plot_style.finish(
        ax,
        title=f"{probe}: {group} vs bits ({spread})",
        xlabel="bits of the attention logits (16 = not quantized)",
        ylabel=f"{group}{unit}" + (", lower is better" if group.startswith("loss") else ""),
    )
    return plot_style.save(fig, path)


def write_probe_report(ctx: SweepContext, records: list[Any], folder: Path) -> list[Path]:
    """The probe sections into `folder` when any finished run has probe metrics; returns the files written."""
    values = probe_values(ctx, records)
    if not values:
        return []
    folder = Path(folder)
    groups = summary_groups(values)
    sections = [f"# Probes: {ctx.recipe.name} at scale {ctx.scale}", ""]
    written = []
    settings = _settings(ctx, records)
    summary: list[dict[str, Any]] = []
    for (probe, group), columns in groups.items():
        g = ProbeGroup(ctx, records, values, probe, group, columns)
        table, diffs = group_tables(g, summary)
        sections += [f"## {probe}: {group}", "", table, ""]
        if diffs:
            sections += [diffs, ""]
        if all(BITS.match(c) for c in columns):
            name = f"{probe}_{group}_vs_bits.png"
            written.append(plot_vs_bits(g, folder / name))
            sections += [f"![{probe} {group} vs bits]({name})", ""]
    sections.append(
        "Cells: mean over seeds [95% Student-t interval]; Δ: paired by seed against the first row, "
        "* when the interval excludes 0. The cells as numbers: probes_summary.csv; per-layer statistics: "
        "probes.csv."
    )
    for probe in dict.fromkeys(p for p, _ in groups):
        if probe in NOTES:
            sections.append(NOTES[probe])
        if probe in settings:
            sections.append(f"`{probe}` settings: {settings[probe]}")
    sections.append(PAPER_TABLE5)
    (folder / "probes.md").write_text(
        "\n\n".join(s for s in sections if s != "").replace("\n\n\n", "\n\n") + "\n"
    )
    written.insert(0, folder / "probes.md")
    rows = [
        {"variant": r.variant, "size": r.size, "seed": r.seed, "mlflow_run_id": r.run_id, **values[r.run_id]}
        for r in records
        if r.run_id in values
    ]
    written.insert(1, write_csv(folder / "probes.csv", rows))
    written.insert(2, write_csv(folder / "probes_summary.csv", summary))
    return written


def _settings(ctx: SweepContext, records: list[Any]) -> dict[str, str]:
    """probe -> its settings as tagged on the runs (one text; several when runs differ)."""
    found: dict[str, set[str]] = defaultdict(set)
    for r in records:
        for tag, text in (r.tags or {}).items():
            if (probe := names.probe_of_settings_tag(tag)) is not None:
                try:
                    s = json.loads(text)
                except ValueError:
                    continue
                shown = {k: s.get(k) for k in ("options", "tokens", "tokens_used", "checkpoint")}
                found[probe].add(json.dumps(shown, sort_keys=True))
    return {p: "; ".join(sorted(texts)) for p, texts in found.items()}
