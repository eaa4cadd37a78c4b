"""The one exception type for mistakes a user can make (bad recipe, unknown name, missing data...).

The CLI turns a `UserError` into one line on stderr and exit code 2; anything else is a bug and keeps
its traceback.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class UserError(Exception):
    """A mistake in the user's input. The message is one line: the key, what was wrong, what is allowed."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))  # one line, whatever the caller wrote


def closest(name: object, known: Iterable[str]) -> str:
    """' (did you mean X?)' or '': the hint every unknown-name error ends with (the one copy in the house)."""
    match = difflib.get_close_matches(str(name), [str(k) for k in known], n=1, cutoff=0.5)
    return f" (did you mean {match[0]!r}?)" if match else ""
