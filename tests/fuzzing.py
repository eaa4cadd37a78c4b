"""How the suite's property-based (hypothesis) tests search: a fixed test by default, a random search on
request.

By default, and always under CI (`CI` set), a fuzz test is a fixed test: a fixed seed (`derandomize`, one
seed per test function), a fixed number of examples, no example database shared between runs, and no
shrinking or explain phase, so it draws the same examples on every run and a failing example is reported
as drawn. A slow example could otherwise be shrunk for as long as it takes: an example that never ends was
once shrunk for more than 40 minutes. Each example also runs under `bounded`, a bound on the process's CPU
time (not wall-clock: a loaded machine does not hit it), which fails the example with it printed instead
of hanging.

`ABLATE_FUZZ_EXAMPLES=N python -m pytest tests/scaleout/test_fuzz_inputs.py` (outside CI) searches at
random instead: N examples, shrinking what fails. Every bug it finds becomes an `@example` (or a
regression entry) of the test that found it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from hypothesis import HealthCheck, Phase, settings

FIXED_EXAMPLES = 120
EXAMPLE_CPU_SECONDS = 60.0  # examples take well under a second; one that never ends is caught here


class ExampleTooSlow(Exception):
    """An example ran past its CPU-time bound (`bounded`)."""


def searches_at_random(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this run searches at random (ABLATE_FUZZ_EXAMPLES set, outside CI) rather than the fixed test."""
    return bool(environ.get("ABLATE_FUZZ_EXAMPLES")) and not environ.get("CI")


def fuzz_settings(environ: Mapping[str, str] = os.environ) -> settings:
    common = {
        "deadline": None,  # hypothesis's deadline only reports after the example ends: `bounded` stops it
        "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    }
    if searches_at_random(environ):
        return settings(max_examples=int(environ["ABLATE_FUZZ_EXAMPLES"]), **common)
    return settings(
        max_examples=FIXED_EXAMPLES,
        derandomize=True,
        database=None,
        phases=(Phase.explicit, Phase.generate),
        print_blob=False,
        **common,
    )


@contextlib.contextmanager
def cpu_time_bound(seconds: float) -> Iterator[None]:
    """Raise `ExampleTooSlow` in the block once this process has used `seconds` more CPU time (SIGPROF:
    pytest-timeout's SIGALRM is left alone). Main thread only, as signal handlers are."""

    def expire(signum: int, frame: Any) -> None:
        raise ExampleTooSlow(f"the example used more than {seconds:g} s of CPU time")

    previous = signal.signal(signal.SIGPROF, expire)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)


def bounded(seconds: float = EXAMPLE_CPU_SECONDS) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A test body run under `cpu_time_bound(seconds)`: put it below `@given`, so each example is bounded."""

    def wrap(test: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(test)
        def run(*args: Any, **kwargs: Any) -> Any:
            with cpu_time_bound(seconds):
                return test(*args, **kwargs)

        return run

    return wrap
