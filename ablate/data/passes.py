"""Passes over the training data: how many times a run's tokens cover its corpus's training split, and
the share of the tokens it read that it had read before.

A run of T tokens over a split of S tokens makes p = T / S passes. How much of what it read was read twice
depends on how its windows were drawn (`data.sampling`, ablate.data.loader): under `permutation` each pass
reads every window once, so below one pass nothing is read twice and past it the share is 1 - 1/p; under
`random` (the sampler of runs made before `data.sampling` existed) each window starts at a random offset,
so a token's reads are Poisson with mean p, the split's share read at least once is 1 - e^-p, and in
expectation 1 - (1 - e^-p) / p of the tokens read were read before (24.8% at 0.6 passes). A model that meets
text again can fit it better than new text, so a validation loss after re-reads measures memorisation as
well as learning, and a gap between two rows can be a gap in overfitting. Every plan, check, table and
budget report states the split's tokens, these passes and the share read twice, and marks the runs past
one pass (`REPEATS`).

Pure arithmetic and wording: the callers know where a split's size comes from (the token arrays, a run's
`ablate.train_split_tokens` tag, or the `data.json` it logged).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from ablate.core.tables import si
from ablate.data.config import DATA_KEYS_ADDED_LATER, SAMPLINGS

SAMPLING_PARAM = (
    "data.sampling"  # the run's MLflow param (its flattened config) that says how it drew windows
)
EARLIER_SAMPLING = DATA_KEYS_ADDED_LATER["sampling"]  # what a run recorded without that param used
SAMPLING_WORDS = {
    "permutation": "read twice (each pass a permutation of disjoint windows)",
    "random": "read twice in expectation (windows at random offsets)",
}
assert set(SAMPLING_WORDS) == set(SAMPLINGS)

REPEATS = "↻"  # the mark of a row (or a budget) whose runs made more than one pass over the training split
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


def read_twice(p: float, sampling: str) -> float:
    """The share of the tokens a run of `p` passes read that it had read before (the module's docstring):
    exact under `permutation`, the expected value under `random`; nan if `p` is unknown."""
    if not math.isfinite(p) or p < 0:
        return math.nan
    if p == 0:
        return 0.0
    if sampling == "permutation":
        return max(0.0, 1.0 - 1.0 / p)
    if sampling == "random":
        return 1.0 - (-math.expm1(-p)) / p  # 1 - (1 - e^-p) / p, accurate for small p too
    raise ValueError(f"unknown sampling {sampling!r}")


def sampling_of(params: object) -> str:
    """How a run drew its windows, from its MLflow params: `data.sampling`, or for a run recorded before that
    key existed, `random` (`EARLIER_SAMPLING`)."""
    value = params.get(SAMPLING_PARAM) if isinstance(params, dict) else None
    return value if value in SAMPLINGS else EARLIER_SAMPLING


def format_share(share: float) -> str:
    """'0%', '0.6%', '24%' (one decimal below 10%), 'unknown'."""
    if not math.isfinite(share):
        return "unknown"
    percent = 100 * share
    if percent == 0:
        return "0%"
    return f"{percent:.1f}%" if percent < 9.95 else f"{percent:.0f}%"


def read_twice_text(passes_seen: Iterable[float], samplings: Iterable[str]) -> str:
    """'0% read twice (each pass a permutation of disjoint windows)', or with several runs a range, one
    clause per way of drawing windows: '0.6-4.8% of their tokens read twice in expectation (windows at
    random offsets)'."""
    by_sampling: dict[str, list[float]] = {}
    for p, sampling in zip(passes_seen, samplings):
        if math.isfinite(p):
            by_sampling.setdefault(sampling, []).append(read_twice(p, sampling))
    parts = []
    for sampling in SAMPLINGS:
        shares = sorted(by_sampling.get(sampling, []))
        if not shares:
            continue
        low, high = format_share(shares[0]), format_share(shares[-1])
        share = low if low == high else f"{low[:-1]}-{high}"
        parts.append(f"{share} of their tokens {SAMPLING_WORDS[sampling]}")
    return "; ".join(parts)


AXIS_WORDS = {"permutation": "each pass a permutation", "random": "in expectation: windows at random offsets"}
assert set(AXIS_WORDS) == set(SAMPLINGS)


def axis_note(split_tokens: float, largest_tokens: float, samplings: Iterable[str]) -> str:
    """What a plot's passes axis adds about re-reading, at its largest tokens: '0% read twice at the right
    edge (each pass a permutation)'; one clause per way the plotted runs drew windows; '' if unknown."""
    p = passes(largest_tokens, split_tokens)
    drawn = set(samplings)
    return "; ".join(
        f"{format_share(read_twice(p, s))} read twice at the right edge ({AXIS_WORDS[s]})"
        for s in SAMPLINGS
        if s in drawn and math.isfinite(p)
    )


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


def usage_line(
    split_tokens: float, passes_seen: Iterable[float], samplings: Iterable[str] | None = None
) -> str:
    """'3.50M training tokens; the runs make 0.15-4.79 passes over them (↻ 2 of 5 past one pass: they read
    text again), 0-79% of their tokens read twice (each pass a permutation of disjoint windows)';
    `samplings`: each run's `data.sampling`, in the order of `passes_seen` (None: no share said)."""
    passes_seen = list(passes_seen)
    seen = [p for p in passes_seen if math.isfinite(p)]
    text = f"{si(split_tokens)} training tokens; the runs make {passes_range(seen)} over them"
    over = [p for p in seen if repeats(p)]
    if over:
        text += f" ({REPEATS} {len(over)} of {len(seen)} past one pass: they read text again)"
    elif seen:
        text += " (every run under one pass)"
    if samplings is not None and seen:
        text += ", " + read_twice_text(passes_seen, samplings)
    return text
