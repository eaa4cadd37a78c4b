"""Every number a committed report's README quotes is in a CSV of its folder (within the README's rounding).

A number is a decimal written in the prose (`0.282`, `26.1 min`, `1.8x`, `+0.091`): integers are counts
(seeds, runs, steps) and are left out, as is anything in backticks or a code block (commands, paths,
versions) and the generated provenance lines (date, wall-clock). It is found when some CSV value of the folder (the top-level
reports/README.md: of every report folder) rounds to it at the README's number of decimals, as written,
as a magnitude (a cost quoted without its sign), as a percentage, or as minutes of a value in seconds.
"""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path

import pytest

REPORTS = Path(__file__).resolve().parents[2] / "reports"
NUMBER = re.compile(r"(?<![\w.])[-+−]?\d+\.\d+(?:[KMB](?![a-zA-Z]))?(?![\w.]*\d)")
SCALE = {"K": 1e3, "M": 1e6, "B": 1e9}


def prose(text: str) -> str:
    text = re.sub(r"```.*?```", " ", text, flags=re.S)  # code blocks
    text = re.sub(r"^    .*$", " ", text, flags=re.M)  # indented code
    text = re.sub(r"`[^`]*`", " ", text)  # code spans
    text = re.sub(r"\]\([^)]*\)", "]", text)  # link targets
    provenance = ("- date:", "- wall-clock:")  # when and how long: about the run of the study, not results
    return "\n".join(line for line in text.splitlines() if not line.startswith(provenance))


def quoted_numbers(text: str) -> list[str]:
    return [m.group(0).replace("−", "-") for m in NUMBER.finditer(prose(text))]


def csv_values(folders: list[Path]) -> list[float]:
    values = []
    for folder in folders:
        for path in folder.rglob("*.csv"):
            with open(path, newline="") as f:
                for row in csv.reader(f):
                    for cell in row:
                        try:
                            value = float(cell)
                        except ValueError:  # a text cell (a row's label: "with λ_init = 0.8") counts too
                            values += [float(n) for n in re.findall(r"\d+\.\d+", cell)]
                            continue
                        if math.isfinite(value):
                            values.append(value)
    return values


def found(number: str, values: list[float]) -> bool:
    scale = SCALE.get(number[-1], 1.0)  # 2.05M: 2,050,000 to three significant digits
    number = number.rstrip("KMB")
    x = float(number) * scale
    decimals = len(number.split(".")[1])
    tolerance = (0.5 * 10**-decimals + 1e-12) * scale
    for v in values:
        for candidate in (v, abs(v), 100 * v, 100 * abs(v), v / 60):
            if abs(candidate - x) <= tolerance or abs(candidate - abs(x)) <= tolerance:
                return True
    return False


def readmes() -> list[tuple[Path, list[Path]]]:
    folders = sorted(p for p in REPORTS.iterdir() if p.is_dir())
    out = [(REPORTS / "README.md", folders)]
    out += [(folder / "README.md", [folder]) for folder in folders if (folder / "README.md").exists()]
    return out


@pytest.mark.parametrize(
    "readme, folders", readmes(), ids=lambda x: x.parent.name if isinstance(x, Path) else ""
)
def test_every_number_a_report_readme_quotes_is_in_its_csvs(readme, folders):
    values = csv_values(folders)
    missing = sorted({n for n in quoted_numbers(readme.read_text()) if not found(n, values)})
    assert not missing, (
        f"{readme.relative_to(REPORTS.parent)} quotes numbers in no CSV of its folder: {missing}"
    )


def test_the_audit_finds_what_it_should():
    text = "Diff trails by +0.282 [0.237, 0.327] in 26.1 min at 2.05M tokens; `--lr 3e-4`, 1.8x.\n- date: 2026.11"
    assert quoted_numbers(text) == ["+0.282", "0.237", "0.327", "26.1", "2.05M", "1.8"]
    values = [0.2824, -0.237, 0.3271, 1566.0, 0.018, 2048000]
    checks = ["+0.282", "0.237", "0.327", "26.1", "1.8", "2.05M", "0.5", "2.06M"]
    assert [found(n, values) for n in checks] == [True] * 6 + [False, False]
