"""Sweeps end to end: real Optuna journal storage, real MLflow store, real processes and real kills."""

from __future__ import annotations

import collections
import csv
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
from mini_project import run_cli, sweep_argv, write_recipe
from optuna.trial import TrialState

from ablate.cli import main
from ablate.recipe.schema import Variant
from ablate.report.run_records import RunRecord
from ablate.report.table import comparisons_note, table_rows
from ablate.store.stores import Stores


def _study(workspace: Path, name: str = "mini"):
    from optuna.storages.journal import JournalFileBackend

    storage = optuna.storages.JournalStorage(JournalFileBackend(str(workspace / "optuna.journal")))
    return optuna.load_study(study_name=name, storage=storage)


def _mlflow_runs(workspace: Path, experiment: str = "mini"):
    client = Stores(workspace).client()
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("ablate.role") == "sweep"]
    children = [r for r in runs if r.data.tags.get("ablate.role") != "sweep"]
    return parents, children


def _plans_by_state(study) -> dict[str, collections.Counter]:
    states: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for t in study.get_trials():
        states[t.user_attrs["plan"]][t.state] += 1
    return states


def _sweep_args(recipe: Path, tmp_path: Path, *extra: str) -> list[str]:
    return sweep_argv(recipe, tmp_path, *extra)


def test_sweep_trains_every_variant_reports_and_rerun_changes_nothing(tmp_path, capsys):
    recipe = write_recipe(tmp_path, seeds=[0, 1])
    assert main(_sweep_args(recipe, tmp_path)) == 0
    out = capsys.readouterr().out
    assert "trial 1/4" in out and "report:" in out and "ablate ui" in out
    report = tmp_path / "rep" / "mini"
    for name in ("table.md", "table.csv", "loss_curves.png", "README.md"):
        assert (report / name).stat().st_size > 0, name
    assert (report / "loss_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = (report / "table.md").read_text()
    assert "Diff Transformer" in table and "[" in table  # two seeds: intervals are shown
    parents, children = _mlflow_runs(tmp_path / "ws")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED" and len(children) == 4
    assert all(c.info.status == "FINISHED" for c in children)
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parents[0].info.run_id}
    study = _study(tmp_path / "ws")
    assert [t.state for t in study.get_trials()] == [TrialState.COMPLETE] * 4
    assert {t.user_attrs["mlflow_run_id"] for t in study.get_trials()} == {c.info.run_id for c in children}

    before = (report / "table.md").stat().st_mtime_ns
    assert main(_sweep_args(recipe, tmp_path)) == 0  # nothing retrained: the lines below, not a clock
    assert "nothing to do" in capsys.readouterr().out
    assert (report / "table.md").stat().st_mtime_ns == before
    assert len(_study(tmp_path / "ws").get_trials()) == 4
    assert len(_mlflow_runs(tmp_path / "ws")[1]) == 4


def test_diverging_run_is_marked_failed_and_the_sweep_completes(tmp_path, capsys):
    recipe = write_recipe(
        tmp_path, variants__unstable={"label": "Unstable", "train": {"lr": 1.0e30, "warmup_steps": 1}}
    )
    assert main(_sweep_args(recipe, tmp_path)) == 0
    study = _study(tmp_path / "ws")
    by_variant = {t.user_attrs["variant"]: t for t in study.get_trials()}
    assert by_variant["transformer"].state == by_variant["diff"].state == TrialState.COMPLETE
    failed = by_variant["unstable"]
    assert failed.state == TrialState.FAIL and "diverged" in failed.user_attrs["failure_reason"]
    client = Stores(tmp_path / "ws").client()
    run = client.get_run(failed.user_attrs["mlflow_run_id"])
    assert run.info.status == "FAILED" and "nan" in run.data.tags["ablate.failure_reason"].lower()
    table = (tmp_path / "rep" / "mini" / "table.md").read_text()
    assert "FAILED" in table and "Unstable" in table


def test_plan_over_an_hour_needs_yes(tmp_path, capsys):
    recipe = write_recipe(tmp_path, base__train__steps=10_000_000)
    code = main(
        ["sweep", str(recipe), "--workspace", str(tmp_path / "ws"), "--reports", str(tmp_path / "rep")]
    )
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert code == 2 and "--yes" in err and len(err.splitlines()) == 1
    assert "plan:" in captured.out  # the estimate was shown
    assert not _study(tmp_path / "ws").get_trials()  # nothing was started


def test_two_local_workers_run_every_trial_exactly_once(tmp_path):
    recipe = write_recipe(tmp_path, seeds=[0, 1, 2])
    proc = run_cli(*_sweep_args(recipe, tmp_path, "--workers", "2"), cwd=tmp_path, check=True)
    assert "report:" in proc.stdout
    study = _study(tmp_path / "ws")
    states = _plans_by_state(study)
    assert len(states) == 6 and all(
        c == collections.Counter({TrialState.COMPLETE: 1}) for c in states.values()
    )
    _, children = _mlflow_runs(tmp_path / "ws")
    keys = [c.data.tags["ablate.run_key"] for c in children]
    assert len(children) == 6 and len(set(keys)) == 6 and all(c.info.status == "FINISHED" for c in children)
    assert len({t.user_attrs["worker_pid"] for t in study.get_trials()}) >= 1
    logs = [p.read_text() for p in (tmp_path / "ws" / "logs").glob("*.log")]
    assert logs and all(
        " steps " in log and "tok/s" in log for log in logs if "trial" in log
    )  # progress lines


def test_sweep_killed_mid_trial_then_rerun_finishes_each_trial_once(tmp_path):
    recipe = write_recipe(tmp_path, base__train__steps=200, base__train__val_every=2)
    args = [sys.executable, "-m", "ablate.cli", *_sweep_args(recipe, tmp_path)]
    proc = subprocess.Popen(
        args, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    runs = tmp_path / "ws" / "runs"
    while not list(runs.glob("*/diff-*/checkpoints/last.ckpt")):  # the event; pytest's timeout guards hangs
        assert proc.poll() is None, "the sweep ended before it could be killed"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # in the middle of the second trial, after a checkpoint
    proc.wait()
    study = _study(tmp_path / "ws")
    assert [t.state for t in study.get_trials()].count(TrialState.RUNNING) == 1

    run_cli(*_sweep_args(recipe, tmp_path), cwd=tmp_path, check=True)
    study = _study(tmp_path / "ws")
    for plan, counts in _plans_by_state(study).items():
        assert counts[TrialState.COMPLETE] == 1, (plan, counts)
        assert counts[TrialState.RUNNING] == counts[TrialState.WAITING] == 0
    retried = [t for t in study.get_trials() if t.state == TrialState.FAIL]
    assert len(retried) == 1 and retried[0].user_attrs["failure_reason"] == "worker died"
    _, children = _mlflow_runs(tmp_path / "ws")
    assert len(children) == 2 and all(
        c.info.status == "FINISHED" for c in children
    )  # resumed, not duplicated


def _record(variant: str, seed: int, valid: float, state: str = "finished") -> RunRecord:
    values = {"valid": valid, "ar_hit": valid - 1, "others": valid + 1, "ar_hit_share": 0.25}
    return RunRecord(variant=variant, seed=seed, size="", state=state, run_id=None, values=values)


def test_report_statistics_on_known_numbers():
    recipe = SimpleNamespace(
        variants={"a": Variant(label="A"), "b": Variant(label="B"), "c": Variant(label="C")},
        sizes=lambda scale: None,
    )
    ctx = SimpleNamespace(recipe=recipe, scale="tiny")
    # b - a per seed: -0.10, -0.12, -0.11 -> mean -0.110, sd 0.010, t(0.975, 2) = 4.3027 -> half 0.0248
    # c - a per seed: +0.05, -0.05, 0.00 -> mean 0, not significant
    records = [_record("a", s, v) for s, v in enumerate([3.00, 3.10, 3.20])]
    records += [_record("b", s, v) for s, v in enumerate([2.90, 2.98, 3.09])]
    records += [_record("c", s, v) for s, v in enumerate([3.05, 3.05, 3.20])]
    records += [_record("c", 3, float("nan"), state="failed")]
    headers, rows, csv_rows = table_rows(ctx, records)
    by_label = {row[0]: dict(zip(headers, row)) for row in rows}
    assert by_label["A"]["Valid"] == "3.100 [2.852, 3.348]"  # mean 3.1, sd 0.1, half 4.3027 * 0.1 / sqrt 3
    diff_b = by_label["B"]["Δ Valid vs row 1 (paired)"]
    assert diff_b.startswith("\u22120.110 [\u22120.135, \u22120.085] *")
    diff_c = by_label["C"]["Δ Valid vs row 1 (paired)"]
    assert diff_c.startswith("0.000 [") and "*" not in diff_c
    assert by_label["C"]["seeds"].startswith("3/4; seed 3 FAILED")
    assert by_label["B"]["Δ Valid vs row 1 (paired)"].endswith("(p=0.003)")  # t = 19.05, 2 df
    assert comparisons_note(ctx, records) == (  # p 0.003 <= 0.05 / 2: B's star survives Holm over 2
        "2 comparisons (each row against the first row of its size); 1 of the 1 star survives Holm's "
        "correction for 2 comparisons at 5%: B."
    )
    assert len(csv_rows) == 10


def test_report_columns_follow_what_the_runs_measured():
    with_paper = {"a": Variant(label="A", paper={"valid": 3.087}), "b": Variant(label="B")}
    records = [_record("a", 0, 3.0), _record("b", 0, 3.1)]
    headers, rows, _ = table_rows(
        SimpleNamespace(recipe=SimpleNamespace(variants=with_paper, sizes=lambda scale: None), scale="paper"),
        records,
    )
    assert (
        "AR-Hit" in headers
        and headers[-1] == "paper Valid / AR-Hit / Others"
        and rows[0][-1] == "3.087 / - / -"
    )
    # no paper values in the recipe: no paper column; no bigram slices in the runs (a task): no AR-Hit columns
    no_slices = [
        RunRecord(variant=v, seed=0, size="", state="finished", run_id=None, values={"valid": 3.0})
        for v in "ab"
    ]
    plain = {"a": Variant(label="A"), "b": Variant(label="B")}
    headers, rows, _ = table_rows(
        SimpleNamespace(recipe=SimpleNamespace(variants=plain, sizes=lambda scale: None), scale="paper"),
        no_slices,
    )
    assert not any("AR-Hit" in h or "Others" in h or "paper" in h for h in headers)
    assert all(len(row) == len(headers) for row in rows)


@pytest.mark.parametrize("bad", [["--workers", "0"], ["--scale", "huge"], ["--search", "nowhere.yaml"]])
def test_sweep_bad_arguments_are_one_line_exit_2(tmp_path, capsys, bad):
    recipe = write_recipe(tmp_path)
    code = main(["sweep", str(recipe), "--yes", "--workspace", str(tmp_path / "ws"), *bad])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err


def test_grid_search_keeps_best_lr_per_variant_and_warns_at_the_edge(tmp_path, capsys):
    recipe = write_recipe(tmp_path)
    spec = tmp_path / "lr.yaml"
    spec.write_text("name: lr\nsampler: grid\nspace:\n  base.train.lr: {values: [1.0e-4, 3.0e-4, 3.0e-3]}\n")
    assert main(_sweep_args(recipe, tmp_path, "--search", str(spec))) == 0
    out = capsys.readouterr().out
    for lr in ("0.0001", "0.0003", "0.003"):  # each trial's line names its grid point
        assert f"(Transformer, lr={lr})" in out
    study = _study(tmp_path / "ws", "mini-lr")
    trials = study.get_trials()
    assert len(trials) == 6 and all(t.state == TrialState.COMPLETE for t in trials)
    assert sorted({t.params["base.train.lr"] for t in trials}) == [1.0e-4, 3.0e-4, 3.0e-3]
    client = Stores(tmp_path / "ws").client()
    for t in trials:  # each trial trained with its own learning rate
        assert (
            float(client.get_run(t.user_attrs["mlflow_run_id"]).data.params["train.lr"])
            == t.params["base.train.lr"]
        )
    best = {}
    for t in trials:
        v = t.user_attrs["variant"]
        if v not in best or t.value < best[v].value:
            best[v] = t
    table = (tmp_path / "rep" / "mini-lr" / "table.md").read_text()
    for v, t in best.items():
        assert f"{v}: train.lr={t.params['base.train.lr']}" in table
        if t.params["base.train.lr"] in (1.0e-4, 3.0e-3):
            assert "lies at the edge" in table
    assert table.split("\n## ")[0].count("| Transformer") == 1  # one row per variant above the sections
    readme = (tmp_path / "rep" / "mini-lr" / "README.md").read_text()
    assert "(6 runs; the table shows each variant's best, 2 runs)" in readme
    assert re.search(r"wall-clock: \d+\.\d min from the first trial's start", readme)
    assert "precision: 32-true (" in readme
    # every run of the search is in table.csv (the table's marked), and the header says it is a search
    rows = list(csv.DictReader(open(tmp_path / "rep" / "mini-lr" / "table.csv")))
    assert len(rows) == 6 and sorted(r["in_table"] for r in rows) == ["no"] * 4 + ["yes"] * 2
    assert {r["mlflow_run_id"] for r in rows} == {t.user_attrs["mlflow_run_id"] for t in trials}
    assert "A search over train.lr at scale paper, seed 0: it chooses the setting" in table
    summary = list(csv.DictReader(open(tmp_path / "rep" / "mini-lr" / "summary.csv")))
    assert [r["variant"] for r in summary] == ["transformer", "diff"]
    # the sensitivity table as numbers: each row at each grid point, against the reference at that point
    grid = {
        (r["variant"], float(r["base.train.lr"])): r
        for r in csv.DictReader(open(tmp_path / "rep" / "mini-lr" / "lr_sensitivity.csv"))
    }
    final = {(t.user_attrs["variant"], t.params["base.train.lr"]): t.value for t in trials}
    assert set(grid) == set(final)
    for (v, lr), r in grid.items():
        assert float(r["valid_mean"]) == pytest.approx(final[(v, lr)], abs=1e-9)
        assert float(r["vs_reference"]) == pytest.approx(
            final[(v, lr)] - final[("transformer", lr)], abs=1e-9
        )
        assert r["best_point"] == ("yes" if best[v].params["base.train.lr"] == lr else "no")
    assert "`lr_sensitivity.csv`" in readme


def test_search_spec_errors_are_one_line_exit_2(tmp_path, capsys):
    recipe = write_recipe(tmp_path)
    spec = tmp_path / "bad.yaml"
    spec.write_text("sampler: grid\nspace:\n  train.lr: {values: [1.0e-3]}\n")
    code = main(["sweep", str(recipe), "--yes", "--workspace", str(tmp_path / "ws"), "--search", str(spec)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "space.train.lr" in err and "base." in err and len(err.splitlines()) == 1


@pytest.mark.slow
def test_a_tiny_table6_sweep_resolves_its_recipe_once(tmp_path, monkeypatch):
    """The recipe becomes runs once (`Recipe.resolve`, where `match:` knobs are solved and every section
    is checked): loading at --scale, the check table, the plan, enqueueing, every trial and the report all
    use those typed runs. Seven rows, two steps each, on the mini corpus."""
    from mini_project import write_corpus

    from ablate.recipe.resolve import Recipe

    calls = []
    resolve = Recipe.resolve

    def counted(self, *args, **kwargs):
        calls.append((args, kwargs))
        return resolve(self, *args, **kwargs)

    monkeypatch.setattr(Recipe, "resolve", counted)
    table6 = Path(__file__).resolve().parents[2] / "recipes" / "table6.yaml"
    short = {"steps": 2, "warmup_steps": 1, "val_every": 2, "val_batches": 1, "log_every": 1}
    short |= {"micro_batch_size": 4, "batch_tokens": 1024}
    argv = _sweep_args(table6, tmp_path, "--scale", "tiny")
    argv += [f"--base.train.{key}={value}" for key, value in short.items()]
    argv += [f"--base.data.source={write_corpus(tmp_path / 'corpus')}", "--base.data.val_fraction=0.5"]
    assert main(argv) == 0
    study = _study(tmp_path / "ws", "table6-tiny")
    assert [t.state for t in study.get_trials()] == [TrialState.COMPLETE] * 7
    assert len(calls) == 1, calls
