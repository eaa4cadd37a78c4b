"""Measured once, cached as JSON: the one helper of every measurement cache of the house.

The CPU's matmul rates and a step's time in each precision (ablate.hardware.precision,
ablate.train.choices.precision, in the user's cache directory), `auto`'s attention choice per card and shape
(ablate.train.choices.attention, in the workspace) and the `triton` kernels' launch configurations
(components/attention/triton/configs.py) each keep one JSON object, `{key: entry}`, in one file. A cache
only saves time, so whatever it holds is never trusted: the file is read only where it is a regular file of
at most `MAX_BYTES`, UTF-8 JSON holding an object, and each entry only where its caller's `parse` accepts it.
Anything else (a missing, unreadable or damaged file, `[]`, an entry of the wrong type, a NaN, a key
missing) reads as absent, so it is measured again and rewritten; no cache ends a command.

A write adds its entries to what the file holds at that moment (another process's entries stay) and goes
through a new partial file renamed into place (created exclusively, never through a planted link), so a
reader sees the old file or the new one, never half of one. Two processes writing at once may each keep
only their own entries: that costs a measurement, nothing else; so does an unwritable folder.

Our own and not a library's: `diskcache` and `joblib.Memory` pickle their values (a cache file that
unpickles runs code), and neither reads a damaged file as absent; this is ~60 lines of the standard
library. It lives in `core`, the layer every folder and the component zoo may import
(tests/ablate/test_layers.py).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import stat
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

MAX_BYTES = 16 * 2**20  # a cache file larger than this is not one of ours: read as absent
MALFORMED = (
    TypeError,
    ValueError,
    KeyError,
    AttributeError,
    IndexError,
)  # what a `parse` raises on a bad entry


def read(path: Path) -> dict[str, Any]:
    """The JSON object cached in `path`; {} where there is none to read (module doc)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return {}
    try:
        with os.fdopen(fd, "rb") as file:
            if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                return {}  # a folder, a FIFO or a device is no cache (a FIFO would block the read)
            data = file.read(MAX_BYTES + 1)
        entries = json.loads(data.decode("utf-8")) if len(data) <= MAX_BYTES else None
    except (OSError, ValueError, RecursionError):  # not UTF-8 or not JSON is a ValueError
        return {}
    return entries if isinstance(entries, dict) else {}


def parsed(entry: Any, parse: Callable[[Any], T]) -> T | None:
    """`parse(entry)`, or None where the entry is absent or `parse` finds it malformed (raises one of
    `MALFORMED`)."""
    if entry is None:
        return None
    try:
        return parse(entry)
    except MALFORMED:
        return None


def add(path: Path, entries: Mapping[str, Any], parse: Callable[[Any], Any] | None = None) -> None:
    """Add `entries` to the file's object, written whole through a partial file (module doc); the file's
    entries that `parse` rejects are dropped; an unwritable cache is left as it is."""
    kept = {k: v for k, v in read(path).items() if parse is None or parsed(v, parse) is not None}
    partial = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.partial")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps({**kept, **entries}, indent=1, sort_keys=True)
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(text)
        os.replace(partial, path)
    except OSError:  # an unwritable cache costs a re-measurement, nothing else
        with contextlib.suppress(OSError):
            partial.unlink()


def measured_once(
    path: Path, key: str, measure: Callable[[], T], parse: Callable[[Any], T]
) -> tuple[T, bool]:
    """(the value cached in `path` under `key` where `parse` accepts it, True), else (`measure()`, False),
    the measurement added to the file (its malformed entries dropped). `parse` turns a cached entry into the value and raises one of
    `MALFORMED` on anything it does not accept; `measure`'s value must be JSON (as `parse` reads it back)."""
    value = parsed(read(path).get(key), parse)
    if value is not None:
        return value, True
    value = measure()
    add(path, {key: value}, parse)
    return value, False


def number(value: Any, *, none: bool = False) -> float | None:
    """A finite, non-negative JSON number as a float (None too where `none`); a ValueError otherwise."""
    if value is None and none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{value!r} is not a number")
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{value!r} is not a finite non-negative number")
    return float(value)


def numbers(entry: Any, keys: Collection[str], *, none: bool = False) -> dict[str, float | None]:
    """{key: number} of an entry holding exactly `keys`, each a `number` (None too where `none`); a
    ValueError or TypeError otherwise."""
    if not isinstance(entry, dict) or set(entry) != set(keys):
        raise ValueError(f"expected an object with keys {sorted(keys)}")
    return {k: number(v, none=none) for k, v in entry.items()}
