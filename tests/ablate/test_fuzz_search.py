"""The fuzz tests' search (tests/fuzzing.py) is a fixed test: the same examples on every run under CI, and
an example that never ends fails with the example printed, within its bound, instead of hanging."""

from __future__ import annotations

import pytest
from fuzzing import ExampleTooSlow, bounded, fuzz_settings, searches_at_random
from hypothesis import example, given
from hypothesis import strategies as st


def _drawn(environ: dict[str, str]) -> list[tuple]:
    seen: list[tuple] = []

    @fuzz_settings(environ)
    @given(value=st.integers(-(10**9), 10**9), text=st.text(max_size=5))
    def draw(value, text):
        seen.append((value, text))

    draw()
    return seen


def test_under_ci_every_run_draws_the_same_examples():
    ci = {"CI": "true", "ABLATE_FUZZ_EXAMPLES": "50"}  # CI keeps the fixed test even when asked for more
    first, second = _drawn(ci), _drawn(ci)
    assert len(first) > 50 and first == second  # the fixed count (120 with the explicit ones), not the 50


def test_the_random_search_is_asked_for_outside_ci():
    assert not searches_at_random({}) and not searches_at_random({"CI": "true", "ABLATE_FUZZ_EXAMPLES": "9"})
    assert searches_at_random({"ABLATE_FUZZ_EXAMPLES": "9"})
    assert len(_drawn({"ABLATE_FUZZ_EXAMPLES": "9"})) <= 9


def test_a_slow_example_fails_with_the_example_printed_within_its_bound():
    bound = 0.5  # CPU seconds

    @fuzz_settings({"CI": "true"})
    @given(n=st.integers(0, 10**6))
    @example(n=424242)  # the planted example: it never ends
    @bounded(bound)
    def planted(n):
        while n == 424242:
            pass

    with pytest.raises(ExampleTooSlow) as info:
        planted()
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "n=424242" in notes, notes
