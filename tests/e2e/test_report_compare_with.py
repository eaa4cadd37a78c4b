"""`ablate report RECIPE --compare-with FOLDER` on a real store: each run set beside the other folder's,
the folder kept in the export, and `ablate report --from` writing the comparison again byte for byte."""

from __future__ import annotations

import csv
import shutil

from mini_project import sweep_argv, write_recipe

from ablate.cli import main
from ablate.store.export import read_meta


def test_report_compare_with_pairs_every_run_and_is_written_again_from_the_export(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the export keeps the recipe and the compared folder relative to here
    write_recipe(tmp_path, seeds=[0, 1])
    assert main(sweep_argv("mini.yaml", tmp_path)) == 0
    shutil.copytree(
        tmp_path / "rep" / "mini", tmp_path / "earlier" / "mini"
    )  # the same runs, as another folder
    argv = ["report", "mini.yaml", "--workspace", "ws", "--reports", "rep", "--compare-with", "earlier/mini/"]
    assert main(argv) == 0
    folder = tmp_path / "rep" / "mini"
    assert read_meta(folder)["report"]["compare_with"] == ["earlier/mini"]
    assert "`compared_mini.csv`" in (folder / "README.md").read_text()
    with open(folder / "compared_mini.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    with open(folder / "table.csv", newline="") as f:
        runs = [r for r in csv.DictReader(f) if r["state"] == "finished"]
    assert len(rows) == len({r["variant"] for r in runs}) >= 2
    for row in rows:  # each run beside itself: the same data, no change, both sides alike
        assert row["seeds"] == "2" and row["same_data"] == "yes"
        assert float(row["loss_change"]) == 0.0 and row["loss"] == row["compared_loss"]
        assert row["gap"] == row["compared_gap"] and row["read_twice"] == row["compared_read_twice"]
        assert float(row["read_twice"]) == 0.0  # under one pass, windows by permutation: nothing read twice
    written = (folder / "compared_mini.csv").read_bytes()
    (folder / "compared_mini.csv").unlink()
    assert main(["report", "--from", "rep/mini/"]) == 0
    assert (folder / "compared_mini.csv").read_bytes() == written
