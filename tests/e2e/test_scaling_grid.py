"""A size x budget grid end to end: each (size, arm, seed) trained once, one MLflow run per budget, counted
through MLflow. (The grid's fit and report are tested on synthetic grids in tests/ablate/test_fit_grid.py.)"""

from __future__ import annotations

from collections import Counter

import pytest
from mini_project import write_recipe

from ablate.cli import main
from ablate.store.stores import Stores

SIZES = {  # head_dim 8: 2 and 4 Transformer heads; 1 and 2 Diff heads
    "s16": {"model": {"d_model": 16, "n_layers": 1}},
    "s32": {"model": {"d_model": 32, "n_layers": 1}},
}
BUDGETS = [4, 8]  # steps of 256 tokens; each cools down over its last 20% (1 and 2 steps)


@pytest.mark.slow
def test_a_size_budget_grid_trains_each_size_arm_seed_once_with_one_run_per_budget(tmp_path, capsys):
    recipe = write_recipe(
        tmp_path,
        sizes=SIZES,
        base__train__schedule="wsd",
        base__train__val_every=4,
        base__train__warmup_steps=1,
        budgets={"steps": BUDGETS},
    )
    ws = tmp_path / "ws"
    assert (
        main(["sweep", str(recipe), "--yes", "--workspace", str(ws), "--reports", str(tmp_path / "rep")]) == 0
    )

    client = Stores(ws).client()
    exp = client.get_experiment_by_name("mini")
    runs = [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("ablate.role") != "sweep"]
    tags = [r.data.tags for r in runs]
    assert {r.info.status for r in runs} == {"FINISHED"}
    key = [(t["ablate.variant"], t["ablate.size"], t["ablate.seed"]) for t in tags]
    # one run per (size, arm, seed, budget): 2 x 2 x 1 x 2
    assert Counter(zip(key, (int(t["ablate.budget_steps"]) for t in tags))) == {
        ((v, s, "0"), b): 1 for v in ("transformer", "diff") for s in SIZES for b in BUDGETS
    }
    # trained from step 0 once per (size, arm, seed): the largest budget; the others branch off that run
    fresh = {r.info.run_id: k for r, k, t in zip(runs, key, tags) if "ablate.branched_from" not in t}
    assert sorted(fresh.values()) == sorted(set(key)) and len(fresh) == 4
    assert all(
        int(t["ablate.budget_steps"]) == BUDGETS[-1] for r, t in zip(runs, tags) if r.info.run_id in fresh
    )
    for k, t in zip(key, tags):
        if "ablate.branched_from" in t:
            assert fresh[t["ablate.branched_from"]] == k  # a branch of its own (size, arm, seed)
    for r, t in zip(
        runs, tags
    ):  # a branch trains only its cooldown: its first logged step is past its branch
        steps = [m.step for m in client.get_metric_history(r.info.run_id, "train/loss")]
        assert (
            min(steps) > int(t["ablate.branch_step"]) - 1 if "ablate.branched_from" in t else min(steps) <= 1
        )

    # `ablate fit` over it: 4 points per arm are fewer than the joint form's 5 parameters; one line, exit 2
    capsys.readouterr()
    assert main(["fit", str(recipe), "--workspace", str(ws), "--out", str(tmp_path / "fit")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has 4 points" in err[0] and "needs at least 5 points" in err[0]
    assert not (tmp_path / "fit").exists()
