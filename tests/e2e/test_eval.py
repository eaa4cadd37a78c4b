"""`ablate eval` end to end: a real sweep (Trainer, Optuna journal, MLflow store), probes on its checkpoints,
metrics back on the same MLflow runs, the report's probe tables and plot; a second call that does nothing;
a process killed mid-eval and re-run."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from mini_project import cli_command, run_cli, sweep_argv, write_recipe

from ablate.cli import main
from ablate.core.errors import UserError
from ablate.probes.run import eval_settings, probe_after_trial
from ablate.recipe.loading import load_recipe
from ablate.store.stores import Stores
from ablate.verbs.eval import run_eval

SLOW_PROBE = '''
"""A plugin probe for the kill test: it records each call as a file and, while `block` exists, hangs on
every call after the first, so the test can kill `ablate eval` in the middle of a run."""
import os
import time
from pathlib import Path

from ablate.probes.base import Probe
from ablate.core.registry import register


@register("probe", "slow")
class SlowProbe(Probe):
    """Counts its calls; hangs while a block file exists."""

    def __init__(self):
        self._options = {}

    def run(self, model, batches):
        folder = Path(os.environ["SLOW_PROBE_DIR"])
        n = len(list(folder.glob("call-*")))
        (folder / f"call-{n}").touch()
        if n >= 1 and (folder / "block").exists():
            time.sleep(600)
        return {"calls/seen": float(n), "calls/windows": float(sum(b.shape[0] for b in batches))}
'''


def _client(workspace: Path):
    return Stores(workspace).client()


def _children(workspace: Path, experiment: str = "mini"):
    client = _client(workspace)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id])
    return [r for r in runs if r.data.tags.get("ablate.role") != "sweep"], [
        r for r in runs if r.data.tags.get("ablate.role") == "sweep"
    ]


SHORT = {"base__train__steps": 4, "base__train__val_every": 2}  # probes need checkpoints, not good models


def _sweep(recipe: Path, tmp_path: Path) -> None:
    assert main(sweep_argv(recipe, tmp_path)) == 0


def _eval_args(recipe: Path, tmp_path: Path, *extra: str) -> list[str]:
    return [
        "eval",
        str(recipe),
        "--workspace",
        str(tmp_path / "ws"),
        "--reports",
        str(tmp_path / "rep"),
        *extra,
    ]


def _histories(client, run_id: str) -> dict[str, int]:
    """metric -> how many values it has (1: logged once)."""
    run = client.get_run(run_id)
    return {k: len(client.get_metric_history(run_id, k)) for k in run.data.metrics if k.startswith("probe/")}


def test_eval_probes_every_run_reports_and_a_second_call_does_nothing(tmp_path, capsys):
    recipe = write_recipe(tmp_path, seeds=[0, 1], **SHORT)
    _sweep(recipe, tmp_path)
    capsys.readouterr()
    assert main(_eval_args(recipe, tmp_path, "--tokens", "256")) == 0
    out = capsys.readouterr().out
    assert out.count("probed outliers, quantization") == 4

    workspace, report = tmp_path / "ws", tmp_path / "rep" / "mini"
    client = _client(workspace)
    children, (parent,) = _children(workspace)
    assert len(children) == 4
    layers = 2
    for run in children:
        m = run.data.metrics
        for group in ("logits", "hidden"):
            for stat in ("top1", "top2", "top3", "top10", "top100", "median"):
                assert m[f"probe/outliers/{group}/{stat}"] > 0
                for layer in range(layers):
                    assert f"probe/outliers/{group}/layer_{layer:02d}/{stat}" in m
            assert (
                m[f"probe/outliers/{group}/top1"]
                >= m[f"probe/outliers/{group}/top100"]
                >= m[f"probe/outliers/{group}/median"]
            )
        losses = [m[f"probe/quantization/loss/bits_{b}"] for b in (16, 8, 6, 4)]
        assert all(2.0 < v < 7.0 for v in losses)  # byte-level loss of a briefly trained model
        assert abs(losses[0] - m["val/loss"]) < 0.5  # the same held-out split, other windows
        assert m["probe/outliers/tokens"] == m["probe/quantization/tokens"] == 256
        assert run.data.tags["ablate.probe.outliers"] and run.data.tags["ablate.probe.quantization"]
        assert set(_histories(client, run.info.run_id).values()) == {1}

    table = (report / "probes.md").read_text()
    for heading in (
        "## outliers: logits",
        "## outliers: hidden",
        "## quantization: loss\n",
        "## quantization: loss_increase",
    ):
        assert heading in table
    assert "Diff Transformer" in table and "Δ vs Transformer (paired)" in table and "[" in table
    assert re.search(r"\| Model +\| top1 +\| top2 +\| top3 +\| top10 +\| top100 +\| median +\| seeds", table)
    for plot in ("quantization_loss_vs_bits.png", "quantization_loss_increase_vs_bits.png"):
        assert (report / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len((report / "probes.csv").read_text().strip().splitlines()) == 1 + 4
    # every cell of the tables as numbers: the mean over seeds and the paired difference, recomputed here
    per_run = list(csv.DictReader(open(report / "probes.csv")))
    summary = list(csv.DictReader(open(report / "probes_summary.csv")))
    assert {(r["probe"], r["group"]) for r in summary} == {
        ("outliers", "logits"),
        ("outliers", "hidden"),
        ("quantization", "loss"),
        ("quantization", "loss_increase"),
    }
    for cell in summary:
        key = f"{cell['probe']}/{cell['group']}/{cell['statistic']}"
        mine = {r["seed"]: float(r[key]) for r in per_run if r["variant"] == cell["variant"]}
        first = {r["seed"]: float(r[key]) for r in per_run if r["variant"] == "transformer"}
        assert float(cell["mean"]) == pytest.approx(sum(mine.values()) / len(mine), rel=1e-12)
        if cell["variant"] != "transformer":
            paired = sum(mine[s] - first[s] for s in mine) / len(mine)
            assert float(cell["diff_vs_first"]) == pytest.approx(paired, rel=1e-9, abs=1e-12)
    attached = {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    assert {"report/probes.md", "report/probes.csv", "report/quantization_loss_vs_bits.png"} <= attached

    before = {p.name: p.stat().st_mtime_ns for p in report.iterdir()}
    assert main(_eval_args(recipe, tmp_path, "--tokens", "256")) == 0
    assert "nothing to do" in capsys.readouterr().out
    assert {p.name: p.stat().st_mtime_ns for p in report.iterdir()} == before
    for run in children:
        assert set(_histories(client, run.info.run_id).values()) == {1}

    # Other settings are other results: a new budget probes again (only the probe asked for).
    assert main(_eval_args(recipe, tmp_path, "--tokens", "512", "--probes", "quantization")) == 0
    assert capsys.readouterr().out.count("probed quantization (already had") == 0
    for run in children:
        history = _histories(client, run.info.run_id)
        assert history["probe/quantization/loss/bits_16"] == 2 and history["probe/outliers/logits/top1"] == 1
        assert client.get_run(run.info.run_id).data.metrics["probe/quantization/tokens"] == 512


def test_eval_killed_mid_run_then_rerun_probes_every_run_once(tmp_path, monkeypatch):
    (tmp_path / "slow_probe.py").write_text(SLOW_PROBE)
    monkeypatch.syspath_prepend(str(tmp_path))
    calls = tmp_path / "calls"
    calls.mkdir()
    monkeypatch.setenv("SLOW_PROBE_DIR", str(calls))
    recipe = write_recipe(tmp_path, imports=["slow_probe"], **SHORT)
    _sweep(recipe, tmp_path)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
        "PYTHONUNBUFFERED": "1",
    }
    args = _eval_args(recipe, tmp_path, "--tokens", "128", "--probes", "outliers", "slow")

    (calls / "block").touch()
    proc = subprocess.Popen(
        cli_command(*args),
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    while not (calls / "call-1").exists():  # the second run's slow probe hangs (pytest's timeout: a hang)
        assert proc.poll() is None, "eval ended before it could be killed"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()

    workspace = tmp_path / "ws"
    client = _client(workspace)
    children, _ = _children(workspace)
    by_name = {r.info.run_name: r for r in children}
    first, second = by_name["transformer-s0"], by_name["diff-s0"]  # probed in the recipe's order
    assert "ablate.probe.slow" in first.data.tags and "ablate.probe.slow" not in second.data.tags
    assert "ablate.probe.outliers" in second.data.tags  # its outliers were recorded before the kill
    kept = dict(first.data.metrics)

    (calls / "block").unlink()
    proc = run_cli(*args, cwd=tmp_path, env=env, check=True)
    assert "diff-s0: probed slow (already had outliers)" in proc.stdout
    assert "transformer-s0: probed" not in proc.stdout
    assert sorted(p.name for p in calls.glob("call-*")) == [
        "call-0",
        "call-1",
        "call-2",
    ]  # killed call redone once
    for run in _children(workspace)[0]:
        tags = run.data.tags
        assert "ablate.probe.outliers" in tags and "ablate.probe.slow" in tags
        assert set(_histories(client, run.info.run_id).values()) == {1}, run.info.run_name  # probed once
        assert run.data.metrics["probe/slow/calls/windows"] == 4  # 128 tokens / seq_len 32
    assert {k: v for k, v in client.get_run(first.info.run_id).data.metrics.items()} == kept  # nothing lost
    assert "nothing to do" in run_cli(*args, cwd=tmp_path, env=env, check=True).stdout
    assert "## slow: calls" in (tmp_path / "rep" / "mini" / "probes.md").read_text()


def test_after_trial_entry_point_and_eval_settings(tmp_path):
    recipe_path = write_recipe(tmp_path, **SHORT)
    _sweep(recipe_path, tmp_path)
    recipe = load_recipe(recipe_path)
    children, _ = _children(tmp_path / "ws")
    run_id = next(r.info.run_id for r in children if r.info.run_name == "diff-s0")
    (run,) = recipe.resolve(None, seeds=[0], variants=["diff"])
    assert probe_after_trial(recipe, run, run_id, Stores(tmp_path / "ws")) == []  # after_trial off
    recipe.raw["eval"] = {"tokens": 64, "probes": ["outliers"], "after_trial": True}
    recipe.raw.setdefault("scales", {})["tiny"] = {"eval": {"tokens": 999}}  # a scale overlays the section
    assert eval_settings(recipe, "paper").tokens == 64 and eval_settings(recipe, "tiny").tokens == 999
    assert probe_after_trial(recipe, run, run_id, Stores(tmp_path / "ws")) == ["outliers"]
    assert probe_after_trial(recipe, run, run_id, Stores(tmp_path / "ws")) == []  # already probed
    summary = run_eval(recipe, Stores(tmp_path / "ws"), reports=tmp_path / "rep")
    assert summary.probed == ["transformer-s0: outliers"] and summary.skipped == ["diff-s0: outliers"]
    last = run_eval(recipe, Stores(tmp_path / "ws"), reports=tmp_path / "rep", checkpoint="last")
    assert len(last.probed) == 2  # another checkpoint is another setting: probed again
    settings = json.loads(
        _client(tmp_path / "ws").get_run(run_id).data.tags["ablate.probe.outliers.settings"]
    )
    assert settings["checkpoint"] == "last" and settings["tokens_used"] == 64

    for bad, match in (
        ({"tokens": 0}, "eval.tokens"),
        ({"checkpoint": "first"}, "eval.checkpoint"),
        ({"probes": ["outlier"]}, "did you mean 'outliers'"),
        ({"after": True}, "eval.after"),
        ({"probes": [{"name": "quantization", "bits": [3, 1]}]}, "bits"),
    ):
        recipe.raw["eval"] = bad
        with pytest.raises(UserError, match=match):
            run_eval(recipe, Stores(tmp_path / "ws"), reports=tmp_path / "rep")


def test_eval_without_a_sweep_is_one_line_exit_2(tmp_path, capsys):
    recipe = write_recipe(tmp_path)
    assert main(_eval_args(recipe, tmp_path)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "ablate sweep" in err and "Traceback" not in err
