"""Extending a budgeted study (ablate.sweep.extend, ablate.train.branches): budgets 4, 8 steps grown to
4, 8, 16 train only the new steps, and give bitwise the numbers of a fresh study of 4, 8, 16."""

from __future__ import annotations

import csv

import pytest
from mini_project import write_recipe

from ablate.core.workspace import Workspace
from ablate.recipe.loading import load_recipe
from ablate.store.stores import Stores
from ablate.train.branches import stable_folder
from ablate.train.resume import run_dir

WSD = dict(
    base__train__schedule="wsd",
    base__train__val_every=2,
    variants={"diff": {"label": "Diff Transformer", "model": {"attention": {"name": "diff"}}}},
)


def _sweep(main, recipe, workspace, reports, *more):
    return main(
        ["sweep", str(recipe), "--yes", "--workspace", str(workspace), "--reports", str(reports), *more]
    )


def _runs_by_budget(workspace) -> dict[tuple[str, int], object]:
    client = Stores(workspace).client()
    experiment = client.get_experiment_by_name("mini")
    return {
        (r.data.tags["ablate.variant"], int(r.data.tags["ablate.budget_steps"])): r
        for r in client.search_runs([experiment.experiment_id])
        if r.data.tags.get("ablate.role") != "sweep"
    }


def _history(workspace, run_id: str, metric: str) -> dict[int, float]:
    client = Stores(workspace).client()
    return {m.step: m.value for m in client.get_metric_history(run_id, metric)}


@pytest.mark.slow
def test_an_extended_budgeted_study_trains_only_the_new_steps_and_matches_a_fresh_one(tmp_path, capsys):
    from ablate.cli import main

    short = write_recipe(tmp_path, "short.yaml", budgets={"steps": [4, 8]}, **WSD)
    extended = write_recipe(tmp_path, "long.yaml", budgets={"steps": [4, 8, 16]}, **WSD)
    ws, fresh_ws, rep = tmp_path / "ws", tmp_path / "fresh", tmp_path / "rep"

    assert _sweep(main, short, ws, rep) == 0
    runs = load_recipe(short).runs
    for run in runs:  # one kept stable-phase checkpoint per (row, seed): the longest run's cooldown start
        assert [p.name for p in stable_folder(Workspace(ws), run).glob("*.ckpt")] == ["step-6.ckpt"]  # 8 - 2
    assert "kept 1 stable-phase checkpoints, one per (row, seed)" in capsys.readouterr().out
    finished = {
        (r.variant, b): (run_dir(Workspace(ws), r.at_budget(b)) / "result.json").stat().st_mtime_ns
        for r in runs
        for b in (4, 8)
    }

    assert _sweep(main, extended, ws, rep, "--no-train") == 0  # the extension enqueued, not trained yet
    out = capsys.readouterr().out
    assert "plan: 1 trials, 2.56K tokens" in out  # steps 7-16 of 256 tokens: the new steps only
    assert main(["status", str(extended), "--workspace", str(ws)]) == 0
    status = capsys.readouterr().out  # the short study's finished trial does not count for the extension
    assert "sweep mini: 0/1 trials finished, 0 running, 1 waiting" in status, status
    assert main(["report", str(extended), "--workspace", str(ws), "--reports", str(tmp_path / "mid")]) == 0
    capsys.readouterr()  # while the extension waits, the report shows the budgets the study finished
    rows = list(csv.DictReader(open(tmp_path / "mid" / "mini" / "budgets.csv")))
    assert sorted((r["variant"], int(r["tokens"]) // 256) for r in rows) == [("diff", 4), ("diff", 8)]
    assert _sweep(main, extended, ws, rep) == 0
    out = capsys.readouterr().out
    assert out.count("continuing from the stable phase kept at step 6; training 10 steps") == 1
    for (variant, budget), mtime in finished.items():  # finished budgets were not retrained
        run = next(r for r in runs if r.variant == variant)
        assert (run_dir(Workspace(ws), run.at_budget(budget)) / "result.json").stat().st_mtime_ns == mtime
    for run in load_recipe(extended).runs:  # still one per (row, seed), now at the new cooldown start
        assert [p.name for p in stable_folder(Workspace(ws), run).glob("*.ckpt")] == [
            "step-13.ckpt"
        ]  # 16 - 3

    assert _sweep(main, extended, fresh_ws, tmp_path / "fresh-rep") == 0
    capsys.readouterr()
    grown, fresh = _runs_by_budget(ws), _runs_by_budget(fresh_ws)
    assert sorted(grown) == sorted(fresh) == [("diff", 4), ("diff", 8), ("diff", 16)]
    for variant in ("diff",):
        new = grown[(variant, 16)]
        assert new.data.tags["ablate.continued_step"] == "6"
        assert new.data.tags["ablate.continued_from"] == grown[(variant, 8)].info.run_id
        trained = sorted(_history(ws, new.info.run_id, "train/loss"))
        assert trained == list(range(7, 17))  # only the new steps were trained, each once
        val = _history(ws, new.info.run_id, "val/loss")
        fresh_val = _history(fresh_ws, fresh[(variant, 16)].info.run_id, "val/loss")
        assert sorted(val) == list(range(8, 17, 2))
        assert val == {s: v for s, v in fresh_val.items() if s > 6}  # == on floats: bitwise
        for budget in (4, 8):  # the finished budgets are the fresh study's too
            assert (
                grown[(variant, budget)].data.metrics["val/loss"]
                == fresh[(variant, budget)].data.metrics["val/loss"]
            )
    rows = list(csv.DictReader(open(rep / "mini" / "budgets.csv")))
    assert sorted((r["variant"], int(r["tokens"]) // 256) for r in rows) == sorted(grown)
    # the cost, in tokens of 256: a fresh study trains 16 steps and the cooldowns of 8 (from 6) and 4
    # (from 3); the short study trained 8 + 1, the extension 10 (steps 7-16)
    (cost,) = list(csv.DictReader(open(rep / "mini" / "time.csv")))
    (fresh_cost,) = list(csv.DictReader(open(tmp_path / "fresh-rep" / "mini" / "time.csv")))
    assert int(cost["extension_trained_tokens"]) == 10 * 256
    assert int(cost["trained_tokens"]) == int(cost["fresh_study_tokens"]) == (16 + 2 + 1) * 256
    assert int(fresh_cost["fresh_study_tokens"]) == int(fresh_cost["trained_tokens"]) == (16 + 2 + 1) * 256
    assert int(fresh_cost["extension_trained_tokens"]) == 0
    assert (
        "the extension trained 2.56K of them (52.6% of a fresh study's)"
        in (rep / "mini" / "budgets.md").read_text()
    )

    # anything but the budgets changed is a new study: refused in one line naming the key
    other = write_recipe(tmp_path, "lr.yaml", budgets={"steps": [4, 8, 16, 32]}, base__train__lr=1e-3, **WSD)
    assert _sweep(main, other, ws, rep) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(
        "ablate: error: train.lr: study 'mini' was trained with 0.003"
    )
    assert not any(
        stable_folder(Workspace(ws), r).joinpath("step-26.ckpt").exists() for r in load_recipe(other).runs
    )

    # the study is final: its kept checkpoints go
    assert _sweep(main, extended, ws, rep, "--final") == 0
    assert "final: deleted 1 stable-phase checkpoints" in capsys.readouterr().out
    assert not any(stable_folder(Workspace(ws), r).exists() for r in load_recipe(extended).runs)
