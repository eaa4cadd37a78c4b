"""The house's counts (benchmarks/house_counts.py, benchmarks/call_walk.py): a run's walk counted on a
planted tree whose answer is known, and the counts the tree holds today: no function of 80 lines or more,
no module of train/ or bench/ over 500 lines, a run's walk within 7 folders; the `duplicates` command's
count of pairs in one line, on planted trees (where the command is on PATH), or a line saying it is not."""

from __future__ import annotations

import shutil
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import call_walk  # noqa: E402  (benchmarks/ is not a package)
import house_counts  # noqa: E402

PLANTED = {
    "ablate/__init__.py": "",
    "ablate/train/__init__.py": "",
    "ablate/train/branches.py": """
        from ablate.train import run
        from ablate.train.helpers import Helper

        def train_budgets(x):
            h = Helper()
            return run.train_run(x) + h.twice(x) + _local(x)  # h.twice: an object's method, not resolved

        def _local(x):
            return x

        def never_called(x):
            return run.train_run(x)
        """,
    "ablate/train/run.py": """
        def train_run(x):
            from ablate.core import tables
            from ablate.core.errors import fail

            if x < 0:
                fail(x)
            return tables.show(x) + _inner(x)

        def _inner(x):
            return x
        """,
    "ablate/train/helpers.py": """
        class Helper:
            def __init__(self):
                self.n = self.scale(2)

            def scale(self, x):
                return x

            def twice(self, x):
                return 2 * x
        """,
    "ablate/core/__init__.py": "",
    "ablate/core/errors.py": """
        def fail(x):
            return _deeper(x)  # out of train/: not followed

        def _deeper(x):
            return x
        """,
    "ablate/core/tables.py": """
        def show(x):
            return x
        """,
}


def test_the_walk_counts_a_planted_tree_as_worked_out_by_hand(tmp_path):
    for name, text in PLANTED.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(text))
    run = call_walk.walk(tmp_path, "ablate.train.branches:train_budgets")
    assert run.entered == {
        "ablate.train.branches:train_budgets",
        "ablate.train.branches:_local",
        "ablate.train.run:train_run",
        "ablate.train.run:_inner",
        "ablate.train.helpers:Helper.__init__",
        "ablate.train.helpers:Helper.scale",
    }
    assert run.returns == {
        ("ablate.train.branches:train_budgets", "ablate.train.run:train_run"),
        ("ablate.train.branches:train_budgets", "ablate.train.helpers:Helper.__init__"),
        ("ablate.train.run:train_run", "ablate.core.errors:fail"),
        ("ablate.train.run:train_run", "ablate.core.tables:show"),
    }
    assert len(run.returns_within) == 2 and len(run.calls) == 7  # three calls stay in their file
    assert run.folders == {"train", "core"} and len(run.files) == 5


def test_the_tree_holds_its_counts(capsys):
    long = [
        (n, f"{p.relative_to(ROOT)}:{name}")
        for p in house_counts.sources()
        for n, name in house_counts.long_functions(p, 80)
    ]
    assert long == []
    for folder in ("train", "bench"):
        sizes = {p.name: house_counts.line_count(p) for p in (ROOT / "ablate" / folder).rglob("*.py")}
        assert max(sizes.values()) <= 500, sizes
    run = call_walk.walk(ROOT)
    assert len(run.folders) <= 7 and "train" in run.folders, run.folders
    house_counts.print_walk()
    printed = capsys.readouterr().out
    assert f"{len(run.files)} files in {len(run.folders)} folders" in printed
    assert f"{len(run.returns)} returns across files" in printed


def _shared_lines(name: str) -> str:
    """A function of eight lines alike in every file it is planted in (a pair for the finder)."""
    offsets = ", ".join(f"offset_{i}" for i in range(8))
    body = "".join(f"    total_{i} = value * {i} + offset_{i}\n" for i in range(8))
    return f"def {name}(value, {offsets}):\n{body}    return total_0\n"


@pytest.mark.skipif(shutil.which("duplicates") is None, reason="the `duplicates` command is not on PATH")
def test_the_duplicate_pairs_are_counted_in_one_line(tmp_path, capsys):
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "a.py").write_text(_shared_lines("f"))
    house_counts.print_duplicates(alone)
    assert capsys.readouterr().out == "duplicate pairs: 0\n"
    for copy in ("b.py", "c.py"):  # three places: three pairs
        (alone / copy).write_text(_shared_lines("f"))
    house_counts.print_duplicates(alone)
    assert capsys.readouterr().out == "duplicate pairs: 3\n"


def test_without_the_duplicates_command_the_line_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no `duplicates` on it
    house_counts.print_duplicates(tmp_path)
    assert capsys.readouterr().out == "duplicate pairs: not counted (no `duplicates` command on PATH)\n"
