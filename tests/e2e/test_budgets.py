"""Token budgets from one run (ablate.train.branches): a budget's cooldown branch is the fresh run of that
budget, a budgeted sweep survives a killed worker, and its report has a table per budget."""

from __future__ import annotations

import csv
import json
import math
import os
import re
import signal
import subprocess
import sys
import time

import lightning.pytorch as L
import pytest
from mini_project import run_cli, sweep_argv, write_recipe

from ablate.core.errors import UserError
from ablate.core.workspace import Workspace
from ablate.recipe.loading import load_recipe
from ablate.store.stores import Stores
from ablate.train.branches import train_budgets
from ablate.train.config import TrainConfig
from ablate.train.optimizer import lr_factor
from ablate.train.resume import run_dir
from ablate.train.run import train_run


def _train(**changes) -> TrainConfig:
    base = dict(seq_len=8, batch_tokens=8, micro_batch_size=1, steps=100, lr=1e-3, warmup_steps=10)
    return TrainConfig(**{**base, **changes})


@pytest.mark.parametrize("shape", ["linear", "sqrt"])
def test_wsd_schedule_is_warmup_constant_then_cooldown(shape):
    cfg = _train(schedule="wsd", cooldown_fraction=0.25, cooldown_shape=shape, min_lr=1e-4)
    floor = 0.1
    for step in range(cfg.steps):
        if step < 10:
            want = (step + 1) / 10
        elif step < 75:
            want = 1.0
        else:
            t = (step - 75) / 25
            want = floor + (1 - floor) * (1 - (math.sqrt(t) if shape == "sqrt" else t))
        assert lr_factor(step, cfg) == pytest.approx(want, abs=1e-12), step
    # a shorter budget's schedule is the longer one's until its own cooldown starts (step 30 of 40)
    short = _train(schedule="wsd", cooldown_fraction=0.25, cooldown_shape=shape, min_lr=1e-4, steps=40)
    assert short.cooldown_start == 30
    assert [lr_factor(s, short) for s in range(30)] == [lr_factor(s, cfg) for s in range(30)]
    assert lr_factor(30, short) == 1.0 and lr_factor(39, short) < lr_factor(38, short) < 1.0
    # the paper's linear decay stays the default
    assert lr_factor(55, _train()) == pytest.approx((100 - 55) / 90)


def test_budgets_need_wsd_and_whole_steps(tmp_path):
    recipe = write_recipe(tmp_path, budgets={"steps": [8, 16]})
    with pytest.raises(UserError, match=r"budgets: need train.schedule: wsd, got 'linear'"):
        load_recipe(recipe)
    recipe = write_recipe(tmp_path, base__train__schedule="wsd", budgets={"tokens": [2048, 3000]})
    with pytest.raises(
        UserError, match=r"budgets.tokens: 3000 is not a multiple of train.batch_tokens \(256\)"
    ):
        load_recipe(recipe)
    recipe = write_recipe(tmp_path, base__train__schedule="wsd", budgets={"steps": [2, 16]})
    with pytest.raises(UserError, match=r"budget of 2 steps would cool down from step 2, with no cooldown"):
        load_recipe(recipe)
    recipe = write_recipe(tmp_path, base__train__schedule="wsd", budgets={"tokens": [2048, 4096]})
    runs = load_recipe(recipe).runs
    assert {r.budgets for r in runs} == {(8, 16)} and {r.train.steps for r in runs} == {16}
    assert [b.train.steps for b in runs[0].branches()] == [8]


def test_a_budgets_branch_is_the_fresh_run_of_that_budget_bitwise(tmp_path):
    """The cooldown branch of budget 12 (from step 10 of a 24-step run) and a fresh wsd run of 12 steps,
    same seed, float32 on one machine: every validation of the cooldown is the same float."""
    recipe = write_recipe(
        tmp_path,
        base__train__schedule="wsd",
        base__train__val_every=1,
        base__train__warmup_steps=3,
        budgets={"steps": [12, 24]},
    )
    (run,) = load_recipe(recipe).runs_for(variants=["diff"])
    results = train_budgets(run, Stores(tmp_path / "branched"), progress=False)
    assert [r.steps for r in results] == [24, 12]
    branch = results[1]
    fresh = train_run(run.at_budget(12), Stores(tmp_path / "fresh"), progress=False)
    assert run.at_budget(12).train.cooldown_start == 10  # 12 - round(0.2 x 12)
    cooldown = {h["step"]: h["val/loss"] for h in fresh.history if h["step"] > 10}
    branched = {h["step"]: h["val/loss"] for h in branch.history}
    assert sorted(cooldown) == sorted(branched) == [11, 12]
    assert branched == cooldown  # == on floats: bitwise
    # at the branch point itself (step 10) the longest run's validation is the fresh run's
    longest = {h["step"]: h["val/loss"] for h in results[0].history}
    assert longest[10] == next(h["val/loss"] for h in fresh.history if h["step"] == 10)
    # the branch trained its cooldown only, and says where it came from
    client = Stores(tmp_path / "branched").client()
    tags = client.get_run(branch.run_id).data.tags
    assert tags["ablate.branched_from"] == results[0].run_id and tags["ablate.branch_step"] == "10"
    assert tags["ablate.budget_steps"] == "12" and tags["ablate.budget_tokens"] == str(12 * 256)
    trained = [m.step for m in client.get_metric_history(branch.run_id, "train/loss")]
    assert min(trained) == 11 and max(trained) == 12
    # its time is its cooldown's: the checkpoint it started from carries the longest run's seconds, not its own
    assert branch.earlier_attempts_seconds == 0.0 and branch.seconds > 0


class StepsSeen(L.Callback):
    """Per training it is given to, the global steps seen after its training batches."""

    def __init__(self) -> None:
        self.runs: list[list[int]] = []

    def on_train_start(self, trainer: L.Trainer, *args: object) -> None:
        self.runs.append([])

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        self.runs[-1].append(trainer.global_step)


def test_every_run_callbacks_reach_the_cooldown_branches_and_callbacks_only_the_longest_run(tmp_path):
    """The sweep's taken-over check goes to every run of a trial (`every_run_callbacks`), so a worker whose
    trial was handed away stops in a branch's cooldown too; a pruner's callback sees the longest run only."""
    recipe = write_recipe(
        tmp_path, base__train__schedule="wsd", base__train__val_every=4, budgets={"steps": [8, 16]}
    )
    (run,) = load_recipe(recipe).runs_for(variants=["diff"])
    longest_only, every_run = StepsSeen(), StepsSeen()
    results = train_budgets(
        run,
        Stores(tmp_path / "ws"),
        progress=False,
        callbacks=[longest_only],
        every_run_callbacks=[every_run],
    )
    assert [r.steps for r in results] == [16, 8]
    cooldown_start = run.at_budget(8).train.cooldown_start  # the branch trains its cooldown only
    assert [max(steps) for steps in longest_only.runs] == [16]
    (longest, branch) = every_run.runs
    assert max(longest) == 16 and max(branch) == 8 and min(branch) >= cooldown_start


def test_a_killed_budgeted_sweep_resumes_without_retraining_a_finished_budget(tmp_path):
    recipe = write_recipe(
        tmp_path,
        base__train__schedule="wsd",
        base__train__cooldown_fraction=0.5,
        base__train__steps=200,
        base__train__val_every=10,
        budgets={"steps": [100, 200]},
        variants={"diff": {"label": "Diff Transformer", "model": {"attention": {"name": "diff"}}}},
    )
    workspace = tmp_path / "ws"
    args = ["sweep", str(recipe), "--yes", "--workspace", str(workspace), "--reports", str(tmp_path / "rep")]
    proc = subprocess.Popen(
        [sys.executable, "-m", "ablate.cli", *args],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    runs = workspace / "runs" / "mini"
    longest = branch = None
    # Wait for the event, however long a busy machine takes to reach it (pytest's timeout is the hang
    # guard): the longest run has finished and the branch is training its cooldown.
    while True:
        done = [p for p in runs.glob("*/result.json")]
        if done:
            longest = done[0].parent
            # the other run's folder; not `stable/`, the stable phase's kept checkpoints beside them
            branch = next(p for p in runs.iterdir() if p not in (longest, runs / "stable"))
            if (branch / "checkpoints" / "best.ckpt").exists():  # its first validation: mid-cooldown
                break
        assert proc.poll() is None, "the sweep ended before it could be killed"
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert longest is not None and not (branch / "result.json").exists(), "killed too late"
    finished = (longest / "result.json").stat().st_mtime_ns

    out = run_cli(*args, cwd=tmp_path, check=True).stdout
    assert (longest / "result.json").stat().st_mtime_ns == finished  # the finished budget was not retrained
    assert "steps in" in out and "[already finished]" in out
    branch_result = json.loads((branch / "result.json").read_text())
    assert branch_result["steps"] == 100
    client = Stores(workspace).client()
    experiment = client.get_experiment_by_name("mini")
    children = [
        r for r in client.search_runs([experiment.experiment_id]) if r.data.tags.get("ablate.role") != "sweep"
    ]
    assert sorted(r.data.tags["ablate.budget_steps"] for r in children) == ["100", "200"]
    assert all(r.info.status == "FINISHED" for r in children)
    long_run = next(r for r in children if r.data.tags["ablate.budget_steps"] == "200")
    steps = [m.step for m in client.get_metric_history(long_run.info.run_id, "train/loss")]
    assert len(steps) == len(set(steps))  # the longest run logged each step once
    assert run_dir(Workspace(workspace), load_recipe(recipe).runs[0]) == longest


def test_a_budgeted_sweep_reports_every_budget_the_gap_and_its_trend_and_fits_one_point_per_run(
    tmp_path, capsys
):
    """One study, two readers: the report (a table per budget, the gap and its trend, written again the
    same), then `ablate fit` over tokens (one point per budget run, not per validation). The fit comes
    last: it tags the runs, and the report's export carries the tags."""
    from ablate.cli import main

    recipe = write_recipe(
        tmp_path,
        seeds=[0, 1],
        base__train__schedule="wsd",
        base__train__val_every=4,  # validations inside each run that a fit must not take as points
        budgets={"steps": [8, 16, 32]},
    )
    code = main(sweep_argv(recipe, tmp_path))
    assert code == 0
    folder = tmp_path / "rep" / "mini"
    runs = list(csv.DictReader(open(folder / "budgets.csv")))
    assert len(runs) == 2 * 2 * 3 and {r["state"] for r in runs} == {"finished"}
    assert sorted({int(r["tokens"]) for r in runs}) == [8 * 256, 16 * 256, 32 * 256]
    longest = {r["mlflow_run_id"] for r in runs if not r["branched_from"]}
    assert {r["branched_from"] for r in runs if r["branched_from"]} == longest  # each branch names its run
    assert {r["branch_step"] for r in runs if r["branched_from"]} == {"6", "13"}  # 8 - 2, 16 - 3
    gaps = list(csv.DictReader(open(folder / "gap_vs_tokens.csv")))
    assert [(g["variant"], int(g["tokens"])) for g in gaps] == [
        ("diff", 2048),
        ("diff", 4096),
        ("diff", 8192),
    ]
    by_key = {(r["variant"], int(r["tokens"]), int(r["seed"])): float(r["valid"]) for r in runs}
    for g in gaps:  # the paired gap, recomputed here
        diffs = [
            by_key[("diff", int(g["tokens"]), s)] - by_key[("transformer", int(g["tokens"]), s)]
            for s in (0, 1)
        ]
        assert float(g["gap"]) == pytest.approx(sum(diffs) / 2, abs=1e-12)
    # The sweep's parent run carries each budget's difference for the MLflow UI: these rows, step = tokens.
    client = Stores(tmp_path / "ws").client()
    (parent,) = client.search_runs(
        [client.get_experiment_by_name("mini").experiment_id], "tags.`ablate.role` = 'sweep'"
    )
    for end, column in (("mean", "gap"), ("low", "lo"), ("high", "hi")):
        logged = client.get_metric_history(parent.info.run_id, f"budget/val/loss/diff/{end}")
        assert {m.step: m.value for m in logged} == {int(g["tokens"]): float(g[column]) for g in gaps}
    (trend,) = list(csv.DictReader(open(folder / "trend.csv")))
    doublings = list(csv.DictReader(open(folder / "doublings.csv")))
    assert [(int(d["from_tokens"]), int(d["to_tokens"])) for d in doublings] == [(2048, 4096), (4096, 8192)]
    for d in doublings:  # the paired change over each doubling, recomputed here: every budget enters
        a, b = int(d["from_tokens"]), int(d["to_tokens"])
        per_seed = [
            (by_key[("diff", b, s)] - by_key[("transformer", b, s)])
            - (by_key[("diff", a, s)] - by_key[("transformer", a, s)])
            for s in (0, 1)
        ]
        assert float(d["change_per_doubling"]) == pytest.approx(sum(per_seed) / 2, abs=1e-12)
        half = (
            abs(per_seed[0] - per_seed[1]) / 2
        )  # the Student-t half-width of two values: t(1) x sd / sqrt 2
        assert float(d["change_hi"]) - float(d["change_per_doubling"]) == pytest.approx(
            12.7062 * half, rel=1e-4
        )
    assert trend["change_per_doubling"] == doublings[-1]["change_per_doubling"]  # the line quotes the last
    assert float(trend["extrapolated_tokens"]) == 10 * 8192 and math.isfinite(
        float(trend["extrapolated_gap"])
    )
    text = (folder / "budgets.md").read_text()
    assert text.count("### ") == 3 and "per doubling" in text and "Extrapolation" in text
    assert (folder / "gap_vs_tokens.png").stat().st_size > 0
    (cost,) = list(csv.DictReader(open(folder / "time.csv")))
    assert float(cost["train_over_step0_runs"]) > 1.0 and float(cost["extension_runs_train_seconds"]) == 0
    assert int(cost["trained_tokens"]) == int(cost["fresh_study_tokens"])  # no extension: a fresh study

    readme = folder / "README.md"
    (files_line,) = [line for line in readme.read_text().splitlines() if line.startswith("- files: ")]
    assert {p.name for p in folder.iterdir()} - {"README.md"} == set(
        re.findall(r"`([\w.]+\.(?:md|csv|png|json|parquet))`", files_line)
    )

    # written again from the same stores: every file the same bytes, a person's section below kept
    readme.write_text(readme.read_text() + "\n# What it shows\n\nA person's words.\n")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert "ablate sweep" in readme.read_text() and "(the last trial's end)" in readme.read_text()
    ws = ["--workspace", str(tmp_path / "ws"), "--reports", str(tmp_path / "rep")]
    assert main(["report", str(recipe), *ws]) == 0
    after = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert after == before

    # fit over tokens: one point per budget run
    ws = ["--workspace", str(tmp_path / "ws")]
    assert main(["fit", str(recipe), *ws, "--out", str(tmp_path / "fit"), "--bootstrap", "20"]) == 0
    fit = json.loads((tmp_path / "fit" / "fit.json").read_text())
    assert fit["form"] == "tokens" and fit["source"]["points"] == 2 * 2 * 3  # rows x seeds x budgets
    assert sorted({r["tokens"] for r in fit["runs"]}) == [2048, 4096, 8192]
    assert any("its own token budget" in n for n in fit["notes"])
    assert not any("checkpoint inside" in n for a in fit["archs"].values() for n in a["notes"])
    assert all(a["n_runs"] == 2 for a in fit["archs"].values())  # a seed's budgets are one resampled unit


def test_the_budget_gaps_are_one_family_under_holm():
    """Every row at every budget is one family: p-values (0.001, 0.009, 0.03, 0.3) over 4 comparisons.
    Holm by hand: 0.001 <= 0.05/4 rejects, 0.009 <= 0.05/3 rejects, 0.03 > 0.05/2 stops."""
    from ablate.report.budget_gaps import holm_over_budgets

    def gap(label, tokens, p, lo):
        return {"label": label, "tokens": tokens, "p_value": p, "lo": lo, "hi": lo + 0.1}

    gaps = [
        gap("Diff", 1 << 20, 0.009, 0.05),
        gap("Diff", 1 << 21, 0.001, 0.2),
        gap("GN", 1 << 20, 0.03, 0.01),
        gap("GN", 1 << 21, 0.3, -0.05),
        gap("one seed", 1 << 21, math.nan, math.nan),
    ]
    note = holm_over_budgets(gaps)
    assert [g["holm_survives"] for g in gaps] == ["true", "true", "false", "false", ""]
    assert note.startswith("4 comparisons") and "2 of the 3 intervals that exclude 0 survive" in note
    assert note.endswith("not: GN at 1.05M.")
