"""Every number a committed report's README quotes is in a CSV of its own folder, with its sign and unit.

A number is a decimal written in the prose (`0.282`, `26.1 min`, `1.8x`, `+0.091`, `6.4%`): integers are
counts (seeds, runs, steps) and are left out, as is anything in backticks or a code block (commands, paths,
versions) and the generated provenance lines (date, wall-clock). It is found when a CSV value rounds to it
at the README's number of decimals:
- sign: a signed number (`+0.033`, `−0.005`) needs a value of that sign; an unsigned one may quote a
  magnitude (a cost, "lags by 0.033");
- unit: `%` is a fraction times 100 or a value in percent, `x` a ratio as it is, `min` seconds over 60 or
  minutes as they are; a number without a unit is the value as it is;
- folder: a report folder's README is checked against the CSVs of that folder (and its subfolders) only;
  `reports/README.md` paragraph by paragraph, each against the folders the paragraph names (`table6-cpu/`),
  and a number in a paragraph that names no folder is not found.
"""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path

import pytest

REPORTS = Path(__file__).resolve().parents[2] / "reports"
NUMBER = re.compile(r"(?<![\w.])[-+−]?\d+\.\d+(?:[KMB](?![a-zA-Z]))?(?![\w.]*\d)")
UNIT = re.compile(r"\s?(%)|(x|×)(?![a-zA-Z])|\s(min)\b")
SCALE = {"K": 1e3, "M": 1e6, "B": 1e9}
BLOCK = re.compile(r"\n\s*\n|\n(?=- )")  # paragraphs and list items


def prose(text: str) -> str:
    text = re.sub(r"```.*?```", " ", text, flags=re.S)  # code blocks
    text = re.sub(r"^    .*$", " ", text, flags=re.M)  # indented code
    text = re.sub(r"`[^`]*`", " ", text)  # code spans
    text = re.sub(r"\]\([^)]*\)", "]", text)  # link targets
    provenance = ("- date:", "- wall-clock:")  # when and how long: about the run of the study, not results
    return "\n".join(line for line in text.splitlines() if not line.startswith(provenance))


def quoted_numbers(text: str) -> list[str]:
    """Each number as written, its unit appended (`1.8x`, `6.4%`, `26.1min`), `−` read as `-`."""
    text = prose(text)
    out = []
    for m in NUMBER.finditer(text):
        unit = UNIT.match(text, m.end())
        suffix = next((g for g in unit.groups() if g), "") if unit else ""
        out.append(m.group(0).replace("−", "-") + {"×": "x"}.get(suffix, suffix))
    return out


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
                            values += [float(n) for n in re.findall(r"-?\d+\.\d+", cell)]
                            continue
                        if math.isfinite(value):
                            values.append(value)
    return values


def found(number: str, values: list[float]) -> bool:
    unit = next((u for u in ("%", "x", "min") if number.endswith(u)), "")
    number = number[: len(number) - len(unit)]
    scale = SCALE.get(number[-1], 1.0)  # 2.05M: 2,050,000 to three significant digits
    number = number.rstrip("KMB")
    signed = number[0] in "+-"
    x = float(number) * scale
    decimals = len(number.split(".")[1])
    tolerance = (0.5 * 10**-decimals + 1e-12) * scale
    for v in values:
        candidates = {"%": (100 * v, v), "x": (v,), "min": (v / 60, v), "": (v,)}[unit]
        for candidate in candidates:
            if abs(candidate - x) <= tolerance or (not signed and abs(abs(candidate) - x) <= tolerance):
                return True
    return False


def missing_numbers(text: str, folders: list[Path]) -> list[str]:
    values = csv_values(folders)
    return sorted({n for n in quoted_numbers(text) if not found(n, values)})


def folders_named(block: str, folders: list[Path]) -> list[Path]:
    return [f for f in folders if re.search(rf"(?<![\w-]){re.escape(f.name)}/", block)]


def missing_in_index(text: str, folders: list[Path]) -> list[str]:
    """reports/README.md: each paragraph's numbers against the folders that paragraph names."""
    return sorted(
        {n for block in BLOCK.split(text) for n in missing_numbers(block, folders_named(block, folders))}
    )


def report_folders(root: Path = REPORTS) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.is_dir())


@pytest.mark.parametrize("folder", report_folders(), ids=lambda p: p.name)
def test_every_number_a_report_readme_quotes_is_in_its_own_csvs(folder):
    if not (folder / "README.md").exists():
        pytest.fail(f"{folder.name}/ has no README.md saying what it is and how it was made")
    missing = missing_numbers((folder / "README.md").read_text(), [folder])
    assert not missing, f"reports/{folder.name}/README.md quotes numbers in no CSV of its folder: {missing}"


def test_every_number_the_reports_index_quotes_is_in_the_folder_it_names():
    missing = missing_in_index((REPORTS / "README.md").read_text(), report_folders())
    assert not missing, (
        f"reports/README.md quotes numbers in no CSV of the folder their paragraph names: {missing}"
    )


def test_the_audit_reads_numbers_with_their_sign_and_unit():
    text = "Diff trails by +0.282 [0.237, 0.327] in 26.1 min at 2.05M tokens, 6.4% to 10.7%; `--lr 3e-4`, 1.8x.\n- date: 2026.11"
    assert quoted_numbers(text) == ["+0.282", "0.237", "0.327", "26.1min", "2.05M", "6.4%", "10.7%", "1.8x"]
    values = [0.2824, -0.237, 0.3271, 1566.0, 0.018, 2048000, 0.064, 1.8]
    checks = [
        "+0.282",
        "0.237",
        "0.327",
        "26.1min",
        "1.8x",
        "2.05M",
        "6.4%",
        "0.5",
        "2.06M",
        "-0.282",
        "-0.237",
    ]
    assert [found(n, values) for n in checks] == [True] * 7 + [False, False, False, True]
    assert not found("26.1", values)  # seconds are minutes only where the README says min
    assert not found("1.8", [0.018])  # a fraction is a percentage only where the README says %
    assert not found("6.4x", [0.064])


def _study(root: Path, name: str, csv_text: str, readme: str) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "summary.csv").write_text(csv_text)
    (folder / "README.md").write_text(readme)
    return folder


def test_the_audit_fails_on_a_wrong_sign_and_on_a_number_from_another_folder(tmp_path):
    a = _study(
        tmp_path,
        "study-a",
        "row,diff,lo,hi\nTransformer,0.033,0.025,0.041\n",
        "lags +0.033 [0.025, 0.041].\n",
    )
    b = _study(tmp_path, "study-b", "row,ratio\nDiff,1.7955\n", "costs 1.80x.\n")
    assert missing_numbers((a / "README.md").read_text(), [a]) == []
    assert missing_numbers((b / "README.md").read_text(), [b]) == []
    planted_sign = "lags −0.033 [0.025, 0.041].\n"
    assert missing_numbers(planted_sign, [a]) == ["-0.033"]
    borrowed = "lags +0.033 [0.025, 0.041] and costs 1.80x.\n"
    assert missing_numbers(borrowed, [a]) == ["1.80x"]
    index = f"- `{a.name}/`: lags +0.033.\n- `{b.name}/`: costs 1.80x.\n- elsewhere: 1.80x.\n"
    assert missing_in_index(index, [a, b]) == ["1.80x"]  # the last item names no folder
    assert missing_in_index(f"- `{a.name}/`: costs 1.80x.\n", [a, b]) == ["1.80x"]
