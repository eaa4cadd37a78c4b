"""`ablate check --coord`: the coordinate check of a recipe's variants at its scale (ablate.train.coord
trains and measures, ablate.report.coord writes the CSVs, the plot and the report); this module only
picks the runs, the data and the widths."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from ablate.core.errors import UserError

# Training windows are drawn from the corpus's first tokens: a few steps need few of them.
PREFIX_TOKENS = 4_000_000


def run_coord(
    loaded: Any,
    opts: Any,
    widths: list[int] | None,
    steps: int,
    seeds: list[int],
    variants: list[str] | None,
    out: str,
) -> int:
    from ablate.data import load_tokens
    from ablate.report.coord import write
    from ablate.train.coord import as_dicts, coord_check

    runs = loaded.runs_for(seeds[:1], variants)
    first_size = runs[0].size
    runs = [run for run in runs if run.size == first_size]  # one size: the check varies width itself
    base = runs[0].model.to_dict()
    widths = widths or [base["d_model"] // 2, base["d_model"], 2 * base["d_model"], 4 * base["d_model"]]
    if len(widths) < 2 or steps < 1:
        raise UserError("--coord_widths: the coordinate check needs 2 or more widths and --coord_steps >= 1")
    train = runs[0].train
    data = load_tokens(runs[0].data, opts.layout)
    tokens = torch.as_tensor(data.train[:PREFIX_TOKENS].astype("int64"))
    started = time.perf_counter()
    rows = coord_check(
        {run.variant: {**run.model.to_dict(), "parametrization": "standard"} for run in runs},
        tokens,
        widths=widths,
        steps=steps,
        seeds=seeds,
        batch_size=train.micro_batch_size,
        seq_len=train.seq_len,
        lr=train.lr,
        weight_decay=train.weight_decay,
        betas=tuple(train.betas),
        eps=train.eps,
    )
    text = write(as_dicts(rows), Path(out), labels=loaded.row_labels)
    print(text)
    print(
        f"coordinate check of {', '.join(run.variant for run in runs)} at widths {widths}, {steps} steps, "
        f"seeds {seeds}: {time.perf_counter() - started:.0f} s; written to {out}"
    )
    return 0
