"""provenance.csv's row (ablate.report.provenance): a real Optuna study's trial times, read against times
computed here by hand, and the runs' tags; and the torch version every new run is tagged with."""

from __future__ import annotations

import datetime
import importlib.metadata
import random
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial, TrialState

from ablate.recipe.loading import load_recipe
from ablate.report.provenance import date_line, provenance_row, wall_clock_line
from ablate.report.run_records import RunRecord
from ablate.store import names
from ablate.store.tracking import run_tags

ROOT = Path(__file__).resolve().parents[2]


def _study(spans: list[tuple[datetime.datetime, datetime.datetime | None, TrialState]]) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage())
    for start, end, state in spans:
        study.add_trial(
            FrozenTrial(
                number=0,
                state=state,
                value=1.0 if state == TrialState.COMPLETE else None,
                values=None,
                datetime_start=start,
                datetime_complete=end,
                params={},
                distributions={},
                user_attrs={},
                system_attrs={},
                intermediate_values={},
                trial_id=0,
            )
        )
    return study


def _record(run_id: str, **tags: str) -> RunRecord:
    return RunRecord("transformer", 0, "", "finished", run_id, tags=tags)


def test_the_row_holds_the_trials_span_and_the_runs_tags():
    rng = random.Random()
    t0 = datetime.datetime(2026, 11, 28, 6, 18, 17, tzinfo=datetime.UTC)
    starts = sorted(rng.uniform(0, 3000) for _ in range(4))
    lengths = [rng.uniform(60, 900) for _ in starts]
    spans = [
        (t0 + datetime.timedelta(seconds=s), t0 + datetime.timedelta(seconds=s + n))
        for s, n in zip(starts, lengths)
    ]
    early = t0 - datetime.timedelta(hours=1)  # a failed and a running trial count in neither
    others = [(early, t0 + datetime.timedelta(hours=9), TrialState.FAIL), (early, None, TrialState.RUNNING)]
    study = _study([(*span, TrialState.COMPLETE) for span in spans] + others)
    machine = "2 cores of an AMD EPYC, native bf16 flags: avx512_bf16"
    records = [
        _record("a", **{names.MACHINE: machine, names.TORCH: "2.13.0+cpu", names.PRECISION: "32-true"}),
        _record("b", **{names.MACHINE: machine, names.PRECISION: "32-true"}),
        _record("b"),  # a budget's record of the same run
    ]
    row = provenance_row("study-x", study, records)
    wall = max(s + n for s, n in zip(starts, lengths)) - starts[0]  # by hand, in seconds
    assert row["study"] == "study-x" and row["runs"] == 2 and row["trials_completed"] == 4
    assert row["first_start"] == spans[0][0].strftime("%Y-%m-%d %H:%M UTC")
    assert row["last_end"] == max(e for _, e in spans).strftime("%Y-%m-%d %H:%M UTC")
    assert abs(row["wall_clock_s"] - wall) <= 0.05 and abs(row["trials_s"] - sum(lengths)) <= 0.05
    assert row["wall_clock_min"] == f"{wall / 60:.1f}" and row["trials_min"] == f"{sum(lengths) / 60:.1f}"
    assert row["machine"] == machine and row["torch"] == "2.13.0+cpu"
    assert row["precision"] == "32-true (reason not recorded)"
    assert date_line(row) == f"{row['last_end']} (the last trial's end)"
    assert wall_clock_line(row).startswith(
        f"wall-clock: {row['wall_clock_min']} min from the first trial's start"
    )


def test_a_study_without_completed_trials_or_tags_says_so():
    row = provenance_row("empty", _study([]), [_record("a")])
    assert row["trials_completed"] == 0 and row["first_start"] == row["last_end"] == ""
    assert row["machine"] == row["torch"] == row["precision"] == "not recorded"
    assert date_line(row) == "no completed trials"
    assert wall_clock_line(row) == "wall-clock: no completed trials"


def test_every_new_run_is_tagged_with_the_installed_torch():
    run = load_recipe(str(ROOT / "recipes" / "table6.yaml"), [], scale="tiny").runs[0]
    assert run_tags(run, "abc")[names.TORCH] == importlib.metadata.version("torch")
