"""A recorded `ablate` command as a reader of a report can run it: the study records the command that made
it with this machine's places in it (workspace, reports folder, stores); a report and an export name those
places by the flag, never by this machine's path. Neither ever holds a password: a URI with one
(`postgresql://user:pw@host/db`, `http://user:pw@host`) is written with `***` in its place (`redact`).

The command is stored quoted (`shlex.join`) and read back with `shlex.split`, so an argument with a space
or an apostrophe comes back as it was typed; a command stored by an older version unquoted (words joined by
spaces) is read back word by word."""

from __future__ import annotations

import re
from pathlib import Path

# Flags whose value is a place on the machine that ran the study: a report names it, not its path.
PLACE_FLAGS = {
    "workspace": "WORKSPACE",
    "reports": "REPORTS",
    "storage": "STORAGE",
    "tracking-uri": "TRACKING_URI",
}


def portable_command(command: str, here: Path | None = None) -> str:
    """`command` as a reader of the report can run it: a workspace, reports folder or store given as an
    absolute path (or a URL holding one) becomes the flag's name in capitals (`--workspace WORKSPACE`), and
    another absolute path inside the current folder (a recipe) becomes relative to it."""
    import shlex

    here = (here or Path.cwd()).resolve()
    words = command_words(redact(command))
    out = []
    for i, word in enumerate(words):
        flag, eq, value = word.partition("=") if word.startswith("--") and "=" in word else ("", "", word)
        if not eq:
            flag = words[i - 1] if i and words[i - 1].startswith("--") else ""
        place = PLACE_FLAGS.get(flag.lstrip("-").replace("_", "-"))
        absolute = value.startswith("/") or bool(re.match(r"^(journal|sqlite|file):/", value))
        if place and absolute:
            value = place
        elif value.startswith("/") and Path(value).resolve().is_relative_to(here):
            value = str(Path(value).resolve().relative_to(here))
        out.append(f"{flag}={value}" if eq else value)
    return shlex.join(out)


# `scheme://user:password@`: the password of a URI's user info (RFC 3986), whatever the scheme
USERINFO = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^/@:\s'\"]*):(?P<password>[^/@\s'\"]*)@")
SECRET_QUERY = re.compile(
    r"(?P<head>[?&](?:password|passwd|pwd|token|secret)=)(?P<password>[^&\s'\"]+)", re.I
)


def redact(text: str) -> str:
    """`text` with every URI password (user info or a `password=` query value) written as `***`."""
    text = USERINFO.sub(lambda m: f"{m['head']}:***@", text)
    return SECRET_QUERY.sub(lambda m: f"{m['head']}***", text)


def has_password(uri: str) -> bool:
    return redact(uri) != uri


def command_words(command: str) -> list[str]:
    """A stored command's words: `shlex.split`, or, for a command an older version stored unquoted (an
    apostrophe in it), its words as the spaces divide them."""
    import shlex

    try:
        return shlex.split(command)
    except ValueError:
        return command.split()


def command_text(argv: list[str]) -> str:
    """The command to store for `argv` (this process's words after `ablate`): quoted, no password in it."""
    import shlex

    return redact(shlex.join(["ablate", *argv]))
