"""Every metric a run logs, also against the training tokens it had seen: `tokens/<key>`, step = tokens.

A study compares rows at matched tokens, and runs of different batch sizes, or a budget study's branches,
do not line up on the optimizer step. MLflow's charts plot a metric against its step, its time, or
another metric matched by step; that last one goes through MLflow's sampled histories (at most 320
points per run and key, sampled per key), which drops validation points once a run logs more training
steps than that. MLflow's step is an integer, and so is a count of tokens: each metric is logged a
second time with the tokens as its step, so any chart of it against its step is against tokens, at every
point; under `tokens/`, so MLflow's generated sections keep them apart (`tokens/val`, `tokens/train`). `tokens` itself is not copied (it is the x axis).
"""

from __future__ import annotations

import math
import time

PREFIX = "tokens/"  # MLflow names may hold letters, digits, _ - . space : / (no @)
TOKENS = "tokens"  # the metric ablate.train.run logs beside every training and validation metric


def tokens_key(key: str) -> str:
    return PREFIX + key


def log_metrics(client, run_id: str, metrics: dict[str, float], step: int) -> None:
    """`metrics` at `step`, and, when they carry `tokens`, each again as `tokens/<key>` at step = tokens
    (one request)."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    finite = {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(v)}
    items = [Metric(k, v, now, int(step)) for k, v in finite.items()]
    if TOKENS in finite:
        tokens = int(finite[TOKENS])
        items += [Metric(tokens_key(k), v, now, tokens) for k, v in finite.items() if k != TOKENS]
    if items:
        client.log_batch(run_id, metrics=items)
