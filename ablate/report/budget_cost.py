"""What a budgeted study's budgets cost: training seconds and trained tokens of the runs from step 0, the
branches and the extension runs, against the tokens a study trained from step 0 would train (`time.csv`
and its paragraph in `budgets.md`)."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from ablate.core.tables import si
from ablate.store import names

if TYPE_CHECKING:
    from ablate.store.study import SweepContext


def trained_from(r: Any) -> tuple[str, int]:
    """How a budget's run trained, from its tags: ("step 0", 0), ("branch", its cooldown start: a smaller
    budget branched off the longest run) or ("extension", the step it continued from: a larger budget added
    to a finished study, continued from the kept stable phase; ablate.train.branches)."""
    if r.tags.get(names.BRANCH_STEP):
        return "branch", int(r.tags[names.BRANCH_STEP])
    if r.tags.get(names.CONTINUED_STEP):
        return "extension", int(r.tags[names.CONTINUED_STEP])
    return "step 0", 0


def time_rows(study: Any, records: list[Any], seconds: dict[str, float]) -> list[dict[str, Any]]:
    """What the budgets cost, in training seconds and in trained tokens: the runs from step 0, the
    branches' cooldowns and the extension runs (`trained_from`), against what a study trained from step 0
    at the same budgets trains (every largest-budget run from step 0, every other budget its cooldown).
    The trials' time summed (Optuna: start to end of each completed trial, training and bookkeeping) is
    given beside it."""
    from ablate.store.study import completed_spans

    trials = sum(
        (end - start).total_seconds() for start, end in completed_spans(study.get_trials(deepcopy=False))
    )
    train = {"step 0": 0.0, "branch": 0.0, "extension": 0.0}
    trained_tokens = 0
    extension_tokens = 0
    # (row, seed) -> its runs' (steps, tokens per step, cooldown steps)
    families: dict[tuple[str, int], list[tuple[int, int, int]]] = defaultdict(list)
    for r in records:
        if r.state != "finished":
            continue
        kind, start = trained_from(r)
        steps = int(r.tags.get(names.BUDGET_STEPS, 0))
        per_step = r.tokens // steps if steps else 0
        train[kind] += seconds.get(r.run_id, math.nan)
        trained_tokens += (steps - start) * per_step
        extension_tokens += (steps - start) * per_step if kind == "extension" else 0
        families[(r.variant, r.seed)].append((steps, per_step, cooldown_steps(r, steps)))
    fresh = 0
    for runs in families.values():
        largest = max(runs)
        fresh += largest[0] * largest[1]
        fresh += sum(cooldown * per_step for steps, per_step, cooldown in runs if steps != largest[0])
    total = sum(train.values())
    return [
        {
            "trials_seconds_summed": round(trials, 1),
            "train_seconds_summed": round(total, 1),
            "longest_runs_train_seconds": round(train["step 0"], 1),
            "branch_runs_train_seconds": round(train["branch"], 1),
            "extension_runs_train_seconds": round(train["extension"], 1),
            "train_over_step0_runs": round(total / train["step 0"], 3) if train["step 0"] else math.nan,
            "trained_tokens": trained_tokens,
            "extension_trained_tokens": extension_tokens,
            "fresh_study_tokens": fresh,
        }
    ]


def cooldown_steps(record: Any, steps: int) -> int:
    """The cooldown of a budget of `steps` steps under the fraction the run recorded: what a study trained
    from step 0 trains for a budget below its largest."""
    from ablate.train.config import TrainConfig, cooldown_steps_of

    fraction = float(record.params.get("train.cooldown_fraction", TrainConfig.cooldown_fraction))
    return cooldown_steps_of(steps, fraction)


def train_seconds(ctx: SweepContext, records: list[Any]) -> dict[str, float]:
    """Run id -> its training seconds (final_metrics.json: the Trainer's fit, and where the run was resumed,
    its earlier attempts' up to the checkpoint it resumed from: ablate.train.training_clock; a run recorded
    before that was counted shows its last attempt's only)."""
    import json

    from ablate.store import tracking

    client = ctx.stores.client()
    out = {}
    for r in records:
        if r.run_id and r.state == "finished":
            try:
                text = tracking.artifact_text(client, r.run_id, "final_metrics.json")
                if text is None:
                    raise ValueError(f"run {r.run_id}: finished, but it has no final_metrics.json")
                final = json.loads(text)
                seconds = float(final["seconds"]) + float(final.get("earlier_attempts_seconds", 0.0))
            except (tracking.ArtifactUnreadable, ValueError, KeyError, TypeError) as e:
                why = str(e) if str(e).startswith("run ") else f"run {r.run_id}: {tracking.first_line(e)}"
                print(f"[report] time.csv: {why}; its training seconds are left out (nan)", flush=True)
                seconds = math.nan
            out[r.run_id] = seconds
    return out


def cost_text(cost: dict[str, Any]) -> str:
    """The cost paragraph of `budgets.md` (every number from `time.csv`)."""
    minutes = {k: cost[k] / 60 for k in cost if k.endswith("seconds") or k.endswith("seconds_summed")}
    extension = (
        f", the extension runs (continued from their kept stable phase) "
        f"{minutes['extension_runs_train_seconds']:.1f} min"
        if cost["extension_trained_tokens"]
        else ""
    )
    text = (
        f"Cost: training took {minutes['train_seconds_summed']:.1f} min summed over runs: the runs trained "
        f"from step 0 {minutes['longest_runs_train_seconds']:.1f} min, the branches' cooldowns "
        f"{minutes['branch_runs_train_seconds']:.1f} min{extension}; {cost['train_over_step0_runs']:.2f}x "
        f"the runs from step 0. Trained tokens: {si(cost['trained_tokens'])}, where a study trained from "
        f"step 0 at the same budgets trains {si(cost['fresh_study_tokens'])}"
    )
    if cost["extension_trained_tokens"]:
        share = cost["extension_trained_tokens"] / cost["fresh_study_tokens"]
        text += (
            f"; the extension trained {si(cost['extension_trained_tokens'])} of them "
            f"({share:.1%} of a fresh study's)"
        )
    return text + (
        f". The trials (training and bookkeeping) took {minutes['trials_seconds_summed']:.1f} min summed over "
        "workers (`time.csv`).\n\n"
    )
