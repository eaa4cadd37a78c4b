"""The one exception type for mistakes a user can make (bad recipe, unknown name, missing data...).

The CLI turns a `UserError` into one line on stderr and exit code 2; anything else is a bug and keeps
its traceback.
"""


class UserError(Exception):
    """A mistake in the user's input. The message is one line: the key, what was wrong, what is allowed."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))  # one line, whatever the caller wrote
