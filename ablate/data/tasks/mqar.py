"""Multi-query associative recall (MQAR; Zoology, Arora et al. 2023), with the answers as tokens.

A sample of `length` tokens (an even number):

    k_1 v_1 k_2 v_2 .. k_P v_P  | noise .. k_i v_i noise .. k_j v_j ..
    key-value pairs (2P tokens) | P queries, each a key followed by its value, at power-law distances

- The vocabulary is split as Zoology splits it: keys from the lower half, values from the upper half
  (ids 1 .. vocab_size - 1; 0 is padding); keys and values are distinct within a sample.
- Every key is queried once. Query slots are the even offsets 2g of the part after the pairs, g drawn
  without replacement with P(g) proportional to a * g^(a - 1) (g = 1..space; `power_a` = 0.01 as
  Zoology's default puts most queries close to the pairs, 1.0 is uniform).
- The token after each queried key is its value: the answer (loss and accuracy on answers only). Zoology
  labels the value without writing it into the input; writing it costs nothing under causal attention
  (it comes after the position that predicts it) and keeps one token stream for every task.
- Every other slot after the pairs is a random token from the whole vocabulary (Zoology's
  random_non_queries): noise the model must not mistake for a query.

Cells: the `lengths` x `pairs` grid (Zoology's (64, 4) (128, 8) (256, 16)); tags `pairs` and `length`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ablate.core.errors import UserError
from ablate.core.registry import register
from ablate.data.tasks.base import Sample, Task

KEY = "data.task"


@register("task", "mqar")
class MQAR(Task):
    """Zoology's multi-query associative recall: key-value pairs, then every key queried once."""

    def __init__(self, *, vocab_size: int = 8192, settings: list | None = None, power_a: float = 0.01):
        settings = [[64, 4]] if settings is None else settings
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 8:
            raise UserError(f"{KEY}.vocab_size: expected an integer >= 8, got {vocab_size!r}")
        if not 0 < power_a <= 1:
            raise UserError(f"{KEY}.power_a: expected a number in (0, 1], got {power_a!r}")
        self.vocab_size, self.power_a = vocab_size, float(power_a)
        self.key_range = (1, vocab_size // 2)
        self.value_range = (vocab_size // 2, vocab_size)
        self.settings: list[tuple[int, int]] = []
        if not isinstance(settings, list | tuple) or not settings:
            raise UserError(f"{KEY}.settings: expected a list of [length, pairs], got {settings!r}")
        for item in settings:
            ok = (
                isinstance(item, list | tuple)
                and len(item) == 2
                and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in item)
            )
            if not ok:
                raise UserError(f"{KEY}.settings: {item!r} is not [length, pairs] (positive integers)")
            length, pairs = item
            if length % 2 or 4 * pairs > length:
                raise UserError(f"{KEY}.settings: [{length}, {pairs}] needs an even length >= 4 x pairs")
            if pairs > min(r[1] - r[0] for r in (self.key_range, self.value_range)):
                raise UserError(f"{KEY}.vocab_size: {vocab_size} has too few keys/values for {pairs} pairs")
            self.settings.append((length, pairs))
        self.max_length = max(length for length, _ in self.settings)

    def cells(self) -> list[dict[str, Any]]:
        return [{"pairs": pairs, "length": length} for length, pairs in self.settings]

    def generate(self, rng: np.random.Generator, cell: dict[str, Any]) -> Sample:
        length, pairs = int(cell["length"]), int(cell["pairs"])
        keys = rng.choice(np.arange(*self.key_range), size=pairs, replace=False)
        values = rng.choice(np.arange(*self.value_range), size=pairs, replace=False)
        context = 2 * pairs
        tokens = rng.integers(1, self.vocab_size, size=length)  # noise everywhere, then the structure
        tokens[0:context:2], tokens[1:context:2] = keys, values
        space = (length - context) // 2
        g = np.arange(1, space + 1, dtype=np.float64)
        p = self.power_a * g ** (self.power_a - 1)
        gaps = rng.choice(space, size=pairs, replace=False, p=p / p.sum())  # slot of each key's query
        query = context + 2 * gaps
        tokens[query], tokens[query + 1] = keys, values
        order = np.argsort(query)
        spans = [(2 * i, 2 * i + 2) for i in range(pairs)]
        return Sample(
            tokens=tokens.astype(np.int64),
            answer_positions=(query + 1)[order].astype(np.int64),
            answer_spans=np.asarray([spans[i] for i in order], dtype=np.int64).reshape(-1, 2),
            context=(0, length),
            needle_spans=spans,
            tags=dict(cell),
        )
