"""Holm's family of a budgeted study's table: every row at every budget, not the table's own comparisons.

A budgeted study (ablate.recipe.budgets) compares each row with the reference row at every token budget
(`gap_vs_tokens.csv`, ablate.report.budgets), and its table shows the largest budget's runs. Correcting
the table's stars over the table's own few comparisons would be a second, smaller family for the same
runs, and a reader who looks at every budget (the budget report shows them all) would be reading the
smaller family's stars as if they were the study's. So the table's `holm_survives` and its note use the
study's family, the one `gap_vs_tokens.csv` marks: one answer per comparison, in every file.
"""

from __future__ import annotations

from typing import Any

from ablate.report import stats


def budget_family(order: list[str], labels: dict[str, str], budget_records: list[Any]) -> tuple[dict, int]:
    """((size, variant, tokens) -> whether that comparison survives Holm over the study's family, the
    family's size), from the same paired gaps as `gap_vs_tokens.csv`."""
    from ablate.report.budget_gaps import gap_rows

    gaps = gap_rows(order, budget_records, labels)
    n, _, _ = stats.mark_holm(gaps, "lo", "hi")
    survives = {
        (g["size"], g["variant"], float(g["tokens"])): g["holm_survives"] == "true"
        for g in gaps
        if g["holm_survives"]
    }
    return survives, n
