"""A recorded `ablate` command as a reader of a report can run it: the study records the command that made
it with this machine's places in it (workspace, reports folder, stores); a report and an export name those
places by the flag, never by this machine's path."""

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
    words = shlex.split(command)
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
