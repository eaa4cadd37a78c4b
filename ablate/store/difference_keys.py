"""The names of the paired differences a sweep's parent run carries for the MLflow UI: what
`ablate.report.ui_differences` writes and `ablate.store.comparison` charts (a layer below both).

Series, each with the training tokens as MLflow's step:
`diff/<metric>/<row>/<end>` (every evaluation point) and `budget/val/loss/<row>/<end>` (each budget's final
difference), `<end>` one of `mean`, `low`, `high` (the 95% interval's ends) and `<row>` the variant, with
`:<size>` in a recipe with sizes.
"""

from __future__ import annotations

from ablate.store import names

DIFF = "diff"
BUDGET = "budget"
ENDS = ("mean", "low", "high")
ORDER_TAG = names.VARIANTS_ORDER  # json: the recipe's rows in order (a row's colour in the UI)
REFERENCE_TAG = names.DIFFERENCES_REFERENCE  # json: size -> the reference row
ONE_SEED_TAG = names.DIFFERENCES_NO_INTERVAL  # json: the rows whose differences have one seed
NOTE_TAG = "mlflow.note.content"  # MLflow's run description, shown on the run's page


def row_name(variant: str, size: str) -> str:
    return variant + (f":{size}" if size else "")


def split_row(row: str) -> tuple[str, str]:
    """(variant, size) of a `row_name`."""
    variant, _, size = row.partition(":")
    return variant, size


def series_key(kind: str, metric: str, row: str, end: str) -> str:
    return f"{kind}/{metric}/{row}/{end}"


def parse_key(key: str) -> tuple[str, str, str, str] | None:
    """(kind, metric, row, end) of a series key; None for any other metric."""
    kind, _, rest = key.partition("/")
    if kind not in (DIFF, BUDGET) or rest.count("/") < 2:
        return None
    rest, _, end = rest.rpartition("/")
    metric, _, row = rest.rpartition("/")
    return (kind, metric, row, end) if end in ENDS and metric and row else None
