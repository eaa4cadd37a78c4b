"""One typed reader for the fields of files ablate reads but did not just write: a report folder's export
(ablate.store.export) and the files beside it or that it names (a README, a compared folder's CSV files),
and a corpus's manifest (ablate.data.corpus). Such a file may have been edited, damaged or crafted, so
every field is read through a `Kind` (what is allowed, and how the value is read), and anything else is
one `UserError` naming the file, the field and what was allowed: one line and exit 2, never a traceback
from deep inside the code that would have used the value.

    rows = csv_rows(path, "--compare-with", {"fit", "ratio"})
    tokens = field(f"{path}: run {run_id}", "tags.ablate.tokens", text, INTEGER_TEXT)

Our own, not a schema library's: the checks are a handful of types whose messages must name ablate's
files and keys in ablate's words (docs/verbs.md: how mistakes are reported); `jsonargparse`, which types
recipes, reads dataclasses, not a crafted file's free-form mappings.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ablate.core.errors import UserError

MAX_TEXT_BYTES = 64 * 2**20  # a README, a CSV or a manifest larger than this is not one ablate wrote


@dataclass(frozen=True)
class Kind:
    """What a field may hold (`allowed`, as the message says it) and how it is read (`read` returns the
    value read, or raises TypeError or ValueError)."""

    allowed: str
    read: Callable[[Any], Any]


def _integer(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError
    return value


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError
    return float(value)


def _of(kind: type) -> Callable[[Any], Any]:
    def read(value: Any) -> Any:
        if not isinstance(value, kind):
            raise TypeError
        return value

    return read


def _integer_text(value: Any) -> int:
    if not isinstance(value, str):
        raise TypeError
    return int(value.strip())  # "12", " 12", "-1"; not "1.5", "lots" or "1e3"


def _number_text(value: Any) -> float:
    if not isinstance(value, str):
        raise TypeError
    return float(value)  # nan and inf included: a diverged run's numbers are data too


def _json_object(value: Any) -> dict[str, Any]:
    if not isinstance(value, str):
        raise TypeError
    read = json.loads(value)
    if not isinstance(read, dict):
        raise TypeError
    return read


def _sha256(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError
    if len(value) != 64 or set(value) - set("0123456789abcdef"):
        raise ValueError
    return value


INTEGER = Kind("an integer", _integer)
NATURAL = Kind("an integer of 0 or more", lambda v: _integer(v) if _integer(v) >= 0 else _fail())
NUMBER = Kind("a number", _number)
FINITE = Kind("a finite number", lambda v: _number(v) if math.isfinite(_number(v)) else _fail())
TEXT = Kind("a string", _of(str))
MAPPING = Kind("a mapping", _of(dict))
LIST = Kind("a list", _of(list))
INTEGER_TEXT = Kind("an integer (as text)", _integer_text)
NUMBER_TEXT = Kind("a number (as text)", _number_text)
JSON_OBJECT = Kind("a JSON object (as text)", _json_object)
SHA256 = Kind("a SHA-256 (64 lowercase hex digits)", _sha256)


def _fail() -> Any:
    raise ValueError


def shown(value: Any, limit: int = 60) -> str:
    """A value as a message shows it: its repr, cut to `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def field(where: str, name: str, value: Any, kind: Kind, hint: str = "") -> Any:
    """`value` (the field `name` of `where`) read as `kind`; anything else one line naming all three."""
    try:
        return kind.read(value)
    except (TypeError, ValueError, OverflowError, RecursionError):
        raise UserError(
            f"{where}: {name} is {shown(value)}, not {kind.allowed}" + (f"; {hint}" if hint else "")
        ) from None


def get(where: str, mapping: dict[str, Any], name: str, kind: Kind, hint: str = "", prefix: str = "") -> Any:
    """`mapping[name]` read as `kind` (`prefix`: how the field's name starts in the message); a missing
    field is one line too."""
    if name not in mapping:
        raise UserError(
            f"{where}: {prefix}{name} is missing; {kind.allowed} is needed" + (f"; {hint}" if hint else "")
        )
    return field(where, prefix + name, mapping[name], kind, hint)


def text_file(path: Path, key: str, hint: str = "", shown_as: Path | None = None) -> str:
    """The UTF-8 text of `path`; unreadable, not UTF-8, or over `MAX_TEXT_BYTES` is one line naming
    `key` and the file (`shown_as`, where the file read is a copy of it)."""
    tail = f"; {hint}" if hint else ""
    path, read = Path(shown_as or path), Path(path)
    try:
        with read.open("rb") as file:
            data = file.read(MAX_TEXT_BYTES + 1)
    except OSError as e:
        raise UserError(f"{key}: cannot read {str(path)!r} ({e.strerror or e}){tail}") from None
    if len(data) > MAX_TEXT_BYTES:
        raise UserError(
            f"{key}: {str(path)!r} is over {MAX_TEXT_BYTES // 2**20} MiB, not a file ablate wrote{tail}"
        )
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise UserError(f"{key}: {str(path)!r} is not UTF-8 text (byte {e.start}){tail}") from None


def csv_rows(path: Path, key: str, columns: Collection[str] = (), hint: str = "") -> list[dict[str, str]]:
    """The rows of the CSV file `path`, each a {column: text} (csv.DictReader's), with at least `columns`;
    a file that cannot be read as such (`text_file`, a NUL byte, a broken quote, a column missing) is one
    line naming `key` and the file."""
    text = text_file(path, key, hint)
    tail = f"; {hint}" if hint else ""
    rows = []
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        for row in reader:
            if None in row or None in row.values():  # more fields than the header, or fewer
                width = len(reader.fieldnames or ())
                raise UserError(
                    f"{key}: {str(path)!r} line {reader.line_num} does not hold {width} fields{tail}"
                )
            rows.append(row)
    except csv.Error as e:
        raise UserError(f"{key}: {str(path)!r} is not a CSV file ({e}){tail}") from None
    if missing := sorted(set(columns) - set(reader.fieldnames or ())):
        raise UserError(f"{key}: {str(path)!r} has no column {', '.join(missing)}{tail}")
    return rows
