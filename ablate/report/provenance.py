"""When, for how long, on which machine, with which torch and in which precision a study's runs trained:
`provenance.csv`, one row, written by the report verbs from the study (its store, or its export alone:
`ablate report --from` writes it again byte for byte), so that the date, wall-clock, machine and torch a
README quotes are values of its own folder. The README's generated header quotes this row, so the two
cannot disagree.

- `first_start`, `last_end`: the first completed trial's start and the last one's end, UTC;
- `wall_clock_min`: from the one to the other, in minutes as the header prints them (`wall_clock_s`: in
  seconds); `trials_min` (`trials_s`): the completed trials' durations summed over workers;
- `machine`, `torch`, `precision`: what the runs' tags recorded (`ablate.machine`, `ablate.torch`,
  `ablate.precision` with its reason), each distinct value once, `not recorded` where no run has the tag
  (runs trained before it existed).
"""

from __future__ import annotations

import datetime
from typing import Any

from ablate.store import names

FILE = "provenance.csv"
NOT_RECORDED = "not recorded"


def provenance_row(study_name: str, study: Any, records: list[Any]) -> dict[str, Any]:
    """The study's one row of `provenance.csv`; `records`: every run of the study (a budgeted study's
    budget runs too)."""
    from ablate.report.table import precisions
    from ablate.store.study import completed_spans

    spans = completed_spans(study.get_trials(deepcopy=False))
    first = min((start for start, _ in spans), default=None)
    last = max((end for _, end in spans), default=None)
    wall = (last - first).total_seconds() if spans else None
    summed = sum((end - start).total_seconds() for start, end in spans) if spans else None
    return {
        "study": study_name,
        "runs": len({r.run_id for r in records if r.run_id}),
        "trials_completed": len(spans),
        "first_start": _utc(first),
        "last_end": _utc(last),
        "wall_clock_min": _minutes(wall),
        "trials_min": _minutes(summed),
        "wall_clock_s": "" if wall is None else round(wall, 1),
        "trials_s": "" if summed is None else round(summed, 1),
        "machine": _recorded(records, names.MACHINE),
        "torch": _recorded(records, names.TORCH),
        "precision": precisions(records),
    }


def date_line(row: dict[str, Any]) -> str:
    """The README header's date: when the last trial ended."""
    return f"{row['last_end']} (the last trial's end)" if row["last_end"] else "no completed trials"


def wall_clock_line(row: dict[str, Any]) -> str:
    """The README header's wall-clock."""
    if not row["trials_completed"]:
        return "wall-clock: no completed trials"
    return (
        f"wall-clock: {row['wall_clock_min']} min from the first trial's start to the last one's end "
        f"({row['trials_min']} min of trials summed over workers)"
    )


def _utc(when: datetime.datetime | None) -> str:
    return when.astimezone(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC") if when else ""


def _minutes(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds / 60:.1f}"


def _recorded(records: list[Any], tag: str) -> str:
    return "; ".join(sorted({r.tags[tag] for r in records if r.tags.get(tag)})) or NOT_RECORDED
