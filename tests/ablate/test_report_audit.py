"""Every number a committed report's README quotes is in a CSV of its own folder, with its sign and unit.

A number is a decimal written in the prose (`0.282`, `26.1 min`, `1.8x`, `+0.091`, `6.4%`): integers are
counts (seeds, runs, steps) and are left out, as is anything in backticks or a code block (commands, paths,
versions), and the generated provenance lines (date, wall-clock) of a folder without `provenance.csv` (one
whose runs' stores were not kept). It is found when a CSV value rounds to it at the README's number of
decimals:
- sign: a signed number (`+0.033`, `−0.005`) needs a value of that sign; an unsigned one may quote a
  magnitude (a cost, "lags by 0.033");
- unit: `%` is a fraction times 100 or a value in percent, `x` a ratio as it is, `min` seconds over 60 or
  minutes as they are; a number without a unit is the value as it is;
- folder: a report folder's README is checked against the CSVs of that folder (and its subfolders) only;
  `reports/README.md` paragraph by paragraph, each against the folders the paragraph names (`table6-cpu/`),
  and a number in a paragraph that names no folder is not found.

A folder with `provenance.csv` (ablate.report.provenance, written by the report verbs from its export)
quotes its date, machine and torch from it: the header's date is the CSV's `last_end`, and a paragraph
sentence that starts with "Machine" names, in its paragraph, the CSV's `machine` (or says it was not recorded) and no torch version
but the CSV's.
"""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path

import pytest

from ablate.report.provenance import FILE as PROVENANCE
from ablate.store.export import has_export

REPORTS = Path(__file__).resolve().parents[2] / "reports"
NUMBER = re.compile(r"(?<![\w.])[-+−]?\d+\.\d+(?:[KMB](?![a-zA-Z]))?(?![\w.]*\d)")
UNIT = re.compile(r"\s?(%)|(x|×)(?![a-zA-Z])|\s(min)\b")
SCALE = {"K": 1e3, "M": 1e6, "B": 1e9}
BLOCK = re.compile(r"\n\s*\n|\n(?=- )")  # paragraphs and list items


def prose(text: str, provenance_backed: bool = False) -> str:
    text = re.sub(r"```.*?```", " ", text, flags=re.S)  # code blocks
    text = re.sub(r"^    .*$", " ", text, flags=re.M)  # indented code
    text = re.sub(r"`[^`]*`", " ", text)  # code spans
    text = re.sub(r"\]\([^)]*\)", "]", text)  # link targets
    if provenance_backed:  # its date and wall-clock lines are numbers of its provenance.csv
        return text
    provenance = ("- date:", "- wall-clock:")  # a folder without an export: what its report wrote then
    return "\n".join(line for line in text.splitlines() if not line.startswith(provenance))


def quoted_numbers(text: str, provenance_backed: bool = False) -> list[str]:
    """Each number as written, its unit appended (`1.8x`, `6.4%`, `26.1min`), `−` read as `-`."""
    text = prose(text, provenance_backed)
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


def missing_numbers(text: str, folders: list[Path], provenance_backed: bool = False) -> list[str]:
    values = csv_values(folders)
    return sorted({n for n in quoted_numbers(text, provenance_backed) if not found(n, values)})


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
    backed = (folder / PROVENANCE).is_file()
    missing = missing_numbers((folder / "README.md").read_text(), [folder], backed)
    assert not missing, f"reports/{folder.name}/README.md quotes numbers in no CSV of its folder: {missing}"


def provenance_problems(readme: str, row: dict[str, str]) -> list[str]:
    """What a README says about when, on which machine and with which torch its runs trained that its
    provenance.csv row does not."""
    problems = []
    dates = re.findall(r"^- date: (.*?) \(the last trial's end\)$", readme, flags=re.M)
    if any(d != row["last_end"] for d in dates):
        problems.append(f"date {dates} where provenance.csv says {row['last_end']!r}")
    for block in BLOCK.split(readme):
        start = re.search(r"(?:^|(?<=[.:;] ))Machine\b", " ".join(block.split()))
        if not start:
            continue
        block = " ".join(block.split())[start.start() :]
        if row["machine"] not in block and "not recorded" not in block:
            problems.append(f"a Machine paragraph names no machine of provenance.csv ({row['machine']!r})")
        for version in re.findall(r"torch (\d[\w.+]*\w)", block):
            if version != row["torch"]:
                problems.append(f"torch {version} where provenance.csv says {row['torch']!r}")
    return problems


@pytest.mark.parametrize(
    "folder", [f for f in report_folders() if (f / PROVENANCE).is_file()], ids=lambda p: p.name
)
def test_a_readme_quotes_its_date_machine_and_torch_from_its_provenance_csv(folder):
    with open(folder / PROVENANCE, newline="") as f:
        (row,) = list(csv.DictReader(f))
    problems = provenance_problems((folder / "README.md").read_text(), row)
    assert not problems, f"reports/{folder.name}/README.md: {problems}"


def test_the_reports_index_lists_every_folder_with_an_export():
    index = (REPORTS / "README.md").read_text()
    rebuildable = index[index.index("Which folders can be rebuilt") :].split("\n\n")[0]
    exported = [f.name for f in report_folders() if has_export(f)]
    assert [name for name in exported if f"`{name}/`" not in rebuildable] == []


def test_every_folder_with_an_export_has_its_provenance_csv():
    exported = [f.name for f in report_folders() if has_export(f)]
    assert exported
    assert [name for name in exported if not (REPORTS / name / PROVENANCE).is_file()] == []


def test_the_provenance_audit_catches_a_date_machine_or_torch_from_elsewhere():
    row = {"last_end": "2026-11-28 06:58 UTC", "machine": "2 cores of an AMD EPYC", "torch": "2.13.0+cpu"}
    good = "- date: 2026-11-28 06:58 UTC (the last trial's end)\n\nMachine: 2 cores of an AMD EPYC; torch 2.13.0+cpu.\n"
    assert provenance_problems(good, row) == []
    assert len(provenance_problems(good.replace("06:58", "07:58"), row)) == 1
    assert len(provenance_problems(good.replace("AMD EPYC", "Intel Xeon"), row)) == 1
    assert len(provenance_problems(good.replace("2.13.0+cpu", "2.12.0"), row)) == 1
    unrecorded = row | {"machine": "not recorded", "torch": "not recorded"}
    assert provenance_problems("Made here. Machine: not recorded by these runs.\n", unrecorded) == []
    assert len(provenance_problems("Made here. Machine: an Intel Xeon.\n", unrecorded)) == 1
    assert len(provenance_problems("Machine: an Intel Xeon, torch 2.13.0.\n", unrecorded)) == 2
    wall = "- wall-clock: 40.4 min from the first trial's start\n"
    assert quoted_numbers(wall) == [] and quoted_numbers(wall, provenance_backed=True) == ["40.4min"]


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
