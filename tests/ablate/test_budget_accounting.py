"""A budgeted study's accounting (ablate.report.budget_cost): what its budgets cost in tokens (`time_rows`)
for a (row, seed) extended twice (budgets 10, 20 from step 0, then 40 continued from step 16, then 80 from
step 32), and which rows miss a budget (`rows_short_of_budgets`)."""

from __future__ import annotations

import optuna
import pytest

from ablate.report.budget_cost import time_rows
from ablate.report.budget_gaps import rows_short_of_budgets
from ablate.report.run_records import RunRecord

PER_STEP = 7  # tokens per optimizer step
FRACTION = 0.2


def _run(steps: int, variant: str = "diff", **tags: int) -> RunRecord:
    return RunRecord(
        variant=variant,
        seed=0,
        size="",
        state="finished",
        run_id=f"{variant}-{steps}",
        tags={"ablate.budget_steps": str(steps), "ablate.tokens": str(steps * PER_STEP)}
        | {f"ablate.{k}": str(v) for k, v in tags.items()},
        params={"train.cooldown_fraction": str(FRACTION)},
    )


@pytest.fixture
def twice_extended() -> list[RunRecord]:
    return [
        _run(10, branch_step=8),  # branched off the 20-step run at 10 - round(0.2 x 10)
        _run(20),  # from step 0
        _run(40, continued_step=16),  # the first extension: 20's cooldown start
        _run(80, continued_step=32),  # the second: 40's cooldown start
    ]


def test_a_twice_extended_family_costs_what_a_fresh_study_of_its_budgets_trains(twice_extended):
    study = optuna.create_study()
    (row,) = time_rows(study, twice_extended, {r.run_id: 1.0 for r in twice_extended})
    # from step 0: the 80-step run, and the cooldowns of 40 (8 steps), 20 (4) and 10 (2)
    assert row["fresh_study_tokens"] == (80 + 8 + 4 + 2) * PER_STEP
    # trained: 20 from step 0, 10's cooldown, then steps 17-40 and 33-80
    assert row["trained_tokens"] == (20 + 2 + 24 + 48) * PER_STEP
    assert row["extension_trained_tokens"] == (24 + 48) * PER_STEP
    assert row["train_seconds_summed"] == 4.0
    assert row["longest_runs_train_seconds"] == 1.0
    assert row["extension_runs_train_seconds"] == 2.0


def test_a_row_without_the_extension_is_named_with_the_budgets_it_has(twice_extended):
    added = [_run(10, "transformer", branch_step=8), _run(20, "transformer")]
    labels = {"transformer": "Transformer", "diff": "Diff"}
    for r in twice_extended + added:
        r.values = {"valid": 3.0}
    budgets = [10 * PER_STEP, 20 * PER_STEP, 40 * PER_STEP, 80 * PER_STEP]
    short = rows_short_of_budgets(["transformer", "diff"], twice_extended + added, labels, budgets)
    assert short == ["Transformer at 70, 140 only"]
    assert rows_short_of_budgets(["diff"], twice_extended, labels, budgets) == []
