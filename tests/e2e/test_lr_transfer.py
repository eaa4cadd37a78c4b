"""A sized lr grid end to end: the report's transfer table (ablate.report.transfer) names, per (row, size),
the lr of lowest final validation loss of the runs the study stored, its move from the smallest size, the
compared grid's rows beside it, and `ablate report --from` writes it again from the export alone."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import optuna
import pytest
from mini_project import run_cli, sweep_argv, write_recipe

from ablate.cli import main

SIZES = {"s16": {"model": {"d_model": 16, "n_layers": 1}}, "s32": {"model": {"d_model": 32, "n_layers": 1}}}
LRS = [1.0e-3, 3.0e-2]  # far apart, so the two points differ in loss at 4 steps


@pytest.mark.slow
def test_the_transfer_table_holds_the_best_lr_of_the_stored_runs(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the checkout: the export names the recipe, search and compared CSV in it
    recipe = write_recipe(
        tmp_path,
        sizes=SIZES,
        base__train__steps=4,
        base__train__val_every=4,
        base__model__parametrization={"name": "mup", "base_d_model": 16},
    )
    earlier = tmp_path / "earlier.csv"  # an earlier grid's lr_sensitivity.csv: 4x down from s16 to s32
    earlier.write_text(
        "variant,label,size,point,base.train.lr,valid_mean,seeds,vs_reference,best_point,sign_flips\n"
        "transformer,Transformer,s16,lr=0.001,0.001,3.5,1,0.0,no,\n"
        "transformer,Transformer,s16,lr=0.004,0.004,3.4,1,0.0,yes,\n"
        "transformer,Transformer,s32,lr=0.001,0.001,3.3,1,0.0,yes,\n"
        "transformer,Transformer,s32,lr=0.004,0.004,3.6,1,0.0,no,\n"
    )
    spec = tmp_path / "lr2.yaml"
    spec.write_text(
        f"name: lr2\nsampler: grid\nspace:\n  base.train.lr: {{values: {LRS}}}\n"
        "compare_with: {path: earlier.csv, label: standard}\n"
    )
    assert main(sweep_argv(recipe.relative_to(tmp_path), Path("."), "--search", "lr2.yaml")) == 0
    capsys.readouterr()

    # independently: each trial's final validation loss as the study stored it, the best lr per row and size
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(tmp_path / "ws" / "optuna.journal"))
    )
    trials = optuna.load_study(study_name="mini-lr2", storage=storage).get_trials()
    assert len(trials) == 2 * 2 * len(LRS)
    loss = {
        (t.user_attrs["variant"], t.user_attrs["size"], t.params["base.train.lr"]): t.value for t in trials
    }
    assert len({round(v, 6) for v in loss.values()}) == len(loss)  # no ties: the best is one point
    best = {(v, s): min(LRS, key=lambda lr, v=v, s=s: loss[(v, s, lr)]) for v, s, _ in loss}

    folder = tmp_path / "rep" / "mini-lr2"
    rows = list(csv.DictReader(open(folder / "transfer.csv")))
    own = [r for r in rows if r["source"] == "this study"]
    assert [(r["variant"], r["size"]) for r in own] == [
        ("transformer", "s16"),
        ("transformer", "s32"),
        ("diff", "s16"),
        ("diff", "s32"),
    ]
    for r in own:
        key = (r["variant"], r["size"])
        assert float(r["best_lr"]) == best[key]
        assert float(r["best_valid_mean"]) == pytest.approx(loss[(*key, best[key])], abs=1e-12)
        assert (
            r["parametrization"] == "mup" and r["seeds"] == "1" and r["seed_best_lrs"] == f"0:{best[key]:g}"
        )
        first = best[(r["variant"], "s16")]
        assert float(r["lr_factor_vs_first_size"]) == pytest.approx(best[key] / first, rel=1e-12)
        assert r["same_point_as_first_size"] == ("yes" if best[key] == first else "no")
    compared = [(r["source"], r["parametrization"], r["size"], r["best_lr"]) for r in rows if r not in own]
    assert compared == [
        ("earlier.csv", "standard", "s16", "0.004"),
        ("earlier.csv", "standard", "s32", "0.001"),
    ]
    assert float(rows[-1]["lr_factor_vs_first_size"]) == 0.25
    table = (folder / "table.md").read_text()
    assert "## Does the best lr transfer across sizes?" in table
    assert "- Transformer (standard, `earlier.csv`): moved 4x down, 0.004 at s16 -> 0.001 at s32." in table
    assert "`transfer.csv`" in (folder / "README.md").read_text()

    # the export alone (no workspace) writes the same table again
    shutil.rmtree(tmp_path / "ws")
    written = {name: (folder / name).read_bytes() for name in ("transfer.csv", "table.md")}
    (folder / "transfer.csv").unlink()
    run_cli("report", "--from", "rep/mini-lr2/", cwd=tmp_path, check=True)
    assert {name: (folder / name).read_bytes() for name in written} == written
