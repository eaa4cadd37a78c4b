"""Multi-needle retrieval (Section 3.4, Table 2, Figure 5; the LWM / Gemini 1.5 protocol), in tokens.

A sample, as token ids (no text; the filler is random tokens, not prose):

    BOS  haystack of H tokens with N needles inside  Q k.. IS v..  (R queries)
    needle = NEEDLE k_1 .. k_K IS v_1 .. v_V         (key -> "magic number", K key and V value tokens)

- Filler: tokens drawn uniformly from a filler range of the vocabulary (not the recipe's corpus text):
  random filler is maximally unpredictable, so nothing but the needles is worth attending to.
- Keys: K tokens from the key range, N distinct keys per sample; values: V tokens from the value range
  ("digits"), drawn afresh for every sample, so an answer is recoverable only from the context (no
  key -> value mapping exists across samples for a model to memorise).
- The answer needle (one of the R queried keys; the queries come in random order) starts at depth
  d% of the haystack: start = round(d/100 * (H - needle)), so depth 0 begins the haystack and depth 100
  ends it (it is `needle_spans[0]` of the sample). The other N - 1 needles sit at random non-overlapping
  places.
- `length` is the sample's whole length in tokens (BOS, haystack and queries): H = length - 1 - R * query.
- Answers: the V value tokens after each query's IS; exact match needs all R values right.

Levels (N needles, R queries) come as `n_needles`/`n_queries` or as a list `levels: [[1, 1], [6, 2]]`;
the held-out grid is levels x depths x lengths, and training draws from all of it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ablate.core.errors import UserError
from ablate.core.registry import register
from ablate.data.tasks.base import PAD, Sample, Task

BOS, NEEDLE, IS, QUERY = 1, 2, 3, 4
FIRST_FREE = 5  # ids below are PAD and the markers above
KEY = "data.task"


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"{KEY}.{name}: expected a positive integer, got {value!r}")
    return value


def _int_list(name: str, value: Any, *, low: int, high: int | None = None) -> list[int]:
    ok = (
        isinstance(value, list | tuple)
        and value
        and all(
            isinstance(v, int) and not isinstance(v, bool) and v >= low and (high is None or v <= high)
            for v in value
        )
    )
    if not ok:
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise UserError(f"{KEY}.{name}: expected a non-empty list of integers {bound}, got {value!r}")
    return list(value)


@register("task", "multi_needle")
class MultiNeedle(Task):
    """N key -> value needles in random filler, R keys queried at the end (Table 2 / Figure 5)."""

    def __init__(
        self,
        *,
        n_needles: int = 1,
        n_queries: int = 1,
        levels: list | None = None,
        depths: list | None = None,
        lengths: list | None = None,
        key_len: int = 2,
        value_len: int = 3,
        n_key_tokens: int = 64,
        n_value_tokens: int = 10,
        n_filler_tokens: int = 128,
    ):
        if levels is None:
            levels = [[n_needles, n_queries]]
        if not isinstance(levels, list | tuple) or not levels:
            raise UserError(f"{KEY}.levels: expected a list of [n_needles, n_queries] pairs, got {levels!r}")
        self.levels: list[tuple[int, int]] = []
        for level in levels:
            pair = _int_list("levels", level, low=1)
            if len(pair) != 2 or pair[1] > pair[0]:
                raise UserError(
                    f"{KEY}.levels: {level!r} is not [n_needles, n_queries] with n_queries <= n_needles"
                )
            self.levels.append((pair[0], pair[1]))
        self.depths = _int_list("depths", [0, 25, 50, 75, 100] if depths is None else depths, low=0, high=100)
        self.lengths = _int_list("lengths", [256] if lengths is None else lengths, low=1)
        self.key_len, self.value_len = (
            _positive_int("key_len", key_len),
            _positive_int("value_len", value_len),
        )
        self.n_key_tokens = _positive_int("n_key_tokens", n_key_tokens)
        self.n_value_tokens = _positive_int("n_value_tokens", n_value_tokens)
        self.n_filler_tokens = _positive_int("n_filler_tokens", n_filler_tokens)
        most = max(n for n, _ in self.levels)
        if n_key_tokens**key_len < most:
            raise UserError(
                f"{KEY}.n_key_tokens: {n_key_tokens}^{key_len} keys cannot give {most} distinct keys; "
                "raise n_key_tokens or key_len"
            )
        self.key_base = FIRST_FREE
        self.value_base = self.key_base + n_key_tokens
        self.filler_base = self.value_base + n_value_tokens
        self.vocab_size = self.filler_base + n_filler_tokens
        self.max_length = max(self.lengths)
        for n, r in self.levels:  # every cell must fit: N needles need room to sit apart at random
            for length in self.lengths:
                haystack = self.haystack_len(length, r)
                if haystack < 2 * n * self.needle_len:
                    raise UserError(
                        f"{KEY}.lengths: {length} tokens leave a {haystack}-token haystack for {n} needles of "
                        f"{self.needle_len} tokens and {r} queries; need >= {2 * n * self.needle_len} "
                        f"(length >= {1 + r * self.query_len + 2 * n * self.needle_len})"
                    )

    @property
    def needle_len(self) -> int:
        return 2 + self.key_len + self.value_len  # NEEDLE k.. IS v..

    @property
    def query_len(self) -> int:
        return 2 + self.key_len + self.value_len  # QUERY k.. IS v..

    def haystack_len(self, length: int, n_queries: int) -> int:
        return length - 1 - n_queries * self.query_len

    def cells(self) -> list[dict[str, Any]]:
        return [
            {"level": f"N{n}R{r}", "depth": d, "length": length}
            for n, r in self.levels
            for d in self.depths
            for length in self.lengths
        ]

    def answer_start(self, depth: int, haystack: int) -> int:
        """Offset of the answer needle in the haystack: depth % of the room it can move in."""
        return round(depth / 100 * (haystack - self.needle_len))

    def generate(self, rng: np.random.Generator, cell: dict[str, Any]) -> Sample:
        n, r = (int(x) for x in cell["level"][1:].split("R"))
        length, m = int(cell["length"]), self.needle_len
        haystack = self.haystack_len(length, r)
        key_ids = rng.choice(self.n_key_tokens**self.key_len, size=n, replace=False)  # distinct keys
        keys = np.stack(
            [(key_ids // self.n_key_tokens**i) % self.n_key_tokens for i in range(self.key_len)], 1
        )
        keys = keys + self.key_base
        values = rng.integers(0, self.n_value_tokens, size=(n, self.value_len)) + self.value_base
        starts = [self.answer_start(int(cell["depth"]), haystack)]  # needle 0 is the answer needle
        free = np.ones(haystack - m + 1, dtype=bool)  # starts that do not overlap a placed needle
        for _ in range(n - 1):
            s = starts[-1]
            free[max(0, s - m + 1) : s + m] = False
            starts.append(int(rng.choice(np.flatnonzero(free))))
        tokens = np.empty(length, dtype=np.int64)
        tokens[0] = BOS
        tokens[1 : 1 + haystack] = rng.integers(0, self.n_filler_tokens, size=haystack) + self.filler_base
        spans = []
        for i, s in enumerate(starts):
            at = 1 + s
            tokens[at : at + m] = np.concatenate([[NEEDLE], keys[i], [IS], values[i]])
            spans.append((at, at + m))
        others = rng.choice(np.arange(1, n), size=r - 1, replace=False) if r > 1 else []
        queried = [0, *(int(i) for i in others)]  # the answer needle and R - 1 distractors asked for too
        queried = [queried[i] for i in rng.permutation(r)]
        positions, answer_spans = [], []
        at = 1 + haystack
        for i in queried:
            tokens[at : at + self.query_len] = np.concatenate([[QUERY], keys[i], [IS], values[i]])
            first_value = at + 2 + self.key_len
            positions += range(first_value, first_value + self.value_len)
            answer_spans += [spans[i]] * self.value_len
            at += self.query_len
        assert at == length and PAD not in tokens
        return Sample(
            tokens=tokens,
            answer_positions=np.asarray(positions, dtype=np.int64),
            answer_spans=np.asarray(answer_spans, dtype=np.int64).reshape(-1, 2),
            context=(1, 1 + haystack),
            needle_spans=spans,
            tags=dict(cell),
        )
