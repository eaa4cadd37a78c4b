"""Passes over the training data: how many times a run's tokens cover its corpus's training split.

Training windows are drawn at random offsets of the split (`ablate.data.loader`), so a run of T tokens
over a split of S tokens reads each token T / S times on average: at 0.5 it has seen about 40% of the
split once, past 1 it reads text it has already trained on. A model that meets text again can fit it
better than new text, so past one pass its validation loss measures memorisation as well as learning, and
a gap between two rows can be a gap in overfitting. Every plan, check, table and budget report states the
split's tokens and these passes, and marks the runs past one (`REPEATS`).

Pure arithmetic and wording: the callers know where a split's size comes from (the token arrays, a run's
`ablate.train_split_tokens` tag, or the `data.json` it logged).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from ablate.core.tables import si

REPEATS = "↻"  # the mark of a row (or a budget) whose runs made more than one pass over the training split
SPLIT_TAG = "ablate.train_split_tokens"  # a run's training-split size, recorded when it loads its data
PASSES_TAG = "ablate.passes"
REPEAT_EFFECT = (
    "A run past one pass has read its training text more than once: its validation loss then measures "
    "how well it fits text it saw again as well as how fast it learns, so a gap between rows there can be "
    "a gap in overfitting."
)


def passes(trained_tokens: float, split_tokens: float) -> float:
    """Passes a run of `trained_tokens` makes over a training split of `split_tokens` (nan if unknown)."""
    if not split_tokens or not math.isfinite(split_tokens) or not math.isfinite(trained_tokens):
        return math.nan
    return trained_tokens / split_tokens


def repeats(p: float) -> bool:
    """More than one pass (a little slack for rounding: 1.0 passes is the whole split read once)."""
    return math.isfinite(p) and p > 1.0 + 1e-9


def format_passes(p: float) -> str:
    return "unknown" if not math.isfinite(p) else f"{p:.2f}"


def passes_range(values: Iterable[float]) -> str:
    """'0.59 passes', '0.15-4.79 passes', or 'unknown passes'."""
    known = sorted(v for v in values if math.isfinite(v))
    if not known:
        return "unknown passes"
    if known[-1] - known[0] < 0.005:
        return f"{format_passes(known[0])} passes"
    return f"{format_passes(known[0])}-{format_passes(known[-1])} passes"


def usage_line(split_tokens: float, passes_seen: Iterable[float]) -> str:
    """'3.50M training tokens; the runs make 0.15-4.79 passes over them (past one pass: text seen again)'."""
    seen = [p for p in passes_seen if math.isfinite(p)]
    text = f"{si(split_tokens)} training tokens; the runs make {passes_range(seen)} over them"
    over = [p for p in seen if repeats(p)]
    if over:
        return text + f" ({REPEATS} {len(over)} of {len(seen)} past one pass: they read text again)"
    return text + " (every run under one pass)" if seen else text
