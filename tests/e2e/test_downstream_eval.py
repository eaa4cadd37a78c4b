"""`ablate eval --downstream` end to end: a real budgeted sweep of 2 rows x 2 seeds (Trainer, Optuna journal,
MLflow store), LM Eval Harness on every run and every budget branch from a local task folder, the metrics on
each run at its tokens, the downstream table with paired differences and Holm; a second call scores nothing;
a task without local data is one line and exit 2, nothing downloaded, with the network variables pointing
nowhere."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest
from mini_project import one_line_refusal, sweep_argv, write_recipe

pytest.importorskip("lm_eval")

from ablate.cli import main  # noqa: E402
from ablate.store import names  # noqa: E402
from ablate.store.stores import Stores  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ablate"))
from test_hf_harness import write_task  # noqa: E402


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(name, "1")
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")  # a port nothing listens on
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))


def _downloaded(tmp_path: Path) -> list[Path]:
    """Files in the hub's and datasets' caches (lock files and empty folders hold no data)."""
    found = []
    for folder in (tmp_path / "hf-home", tmp_path / "datasets-cache"):
        found += [
            p for p in folder.rglob("*") if p.is_file() and p.stat().st_size > 0 and p.suffix != ".lock"
        ]
    return sorted(found)


@pytest.mark.slow
def test_downstream_table_of_a_budgeted_two_by_two_sweep(tmp_path, capsys):
    recipe = write_recipe(
        tmp_path,
        seeds=[0, 1],
        base__train__steps=6,
        base__train__val_every=3,
        base__train__schedule="wsd",
        budgets={"steps": [3, 6]},
    )
    assert main(sweep_argv(recipe, tmp_path)) == 0
    tasks = write_task(tmp_path / "tasks", "tiny_mc", n=8)
    write_task(tasks, "tiny_mc2", n=6, seed=1)
    args = [
        "eval",
        str(recipe),
        "--downstream",
        "--tasks",
        "tiny_mc",
        "tiny_mc2",
        "--task_folder",
        str(tasks),
    ]
    args += ["--workspace", str(tmp_path / "ws"), "--reports", str(tmp_path / "rep")]
    capsys.readouterr()
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.count("scored tiny_mc, tiny_mc2") == 8  # 2 rows x 2 seeds x 2 budgets
    rows = list(csv.DictReader((tmp_path / "rep" / "mini" / "downstream.csv").open()))
    assert {r["task"] for r in rows} == {"tiny_mc", "tiny_mc2"}
    assert {int(r["tokens"]) for r in rows} == {3 * 256, 6 * 256}
    diffs = [r for r in rows if r["variant"] == "diff"]
    assert len(diffs) == 2 * 3 * 2 and all(r["seeds"] == "2" for r in rows)
    assert all(r["diff_vs_first"] != "" and r["p_value"] != "" for r in diffs)
    assert all(r["holm_survives"] in ("true", "false", "chance") for r in diffs)
    assert all(
        r["diff_vs_first"] == "" and r["holm_survives"] == "" for r in rows if r["variant"] == "transformer"
    )
    # every run, every branch: its metrics at its own tokens, and the settings tag
    client = Stores(tmp_path / "ws").client()
    exp = client.get_experiment_by_name("mini")
    children = [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get(names.ROLE) != "sweep"]
    assert len(children) == 8
    steps = set()
    for run in children:
        assert names.DOWNSTREAM in run.data.tags
        history = client.get_metric_history(run.info.run_id, "downstream/tiny_mc/acc")
        assert len(history) == 1 and 0.0 <= history[0].value <= 1.0
        assert client.get_metric_history(run.info.run_id, "downstream/tiny_mc2/bpb")[0].value > 0
        steps.add(history[0].step)
    assert steps == {3 * 256, 6 * 256}
    assert (tmp_path / "rep" / "mini" / "downstream.md").read_text().startswith("# Downstream tasks (0-shot")
    # again: read back from the runs, nothing scored
    assert main(args) == 0
    assert "scored" not in capsys.readouterr().out
    # a budget branch exports by its MLflow run id, and its record links the folder
    pytest.importorskip("transformers")
    branch = next(
        r for r in children if names.BRANCHED_FROM in r.data.tags and r.data.tags[names.VARIANT] == "diff"
    )
    out = tmp_path / "branch"
    code = main(
        [
            "export",
            str(recipe),
            "--run",
            branch.info.run_id,
            "--out",
            str(out),
            "--workspace",
            str(tmp_path / "ws"),
        ]
    )
    assert code == 0
    record = json.loads((out / "ablate_export.json").read_text())
    assert (
        record["run_key"] == branch.data.tags[names.RUN_KEY]
        and record["architecture"] == "DiffLlamaForCausalLM"
    )
    assert client.get_run(branch.info.run_id).data.tags[names.HF_EXPORT] == str(out.resolve())
    # a task whose data is a hub data set (the harness's arc_easy's) this machine does not have: one line,
    # exit 2, nothing downloaded
    (tasks / "hub_only.yaml").write_text(
        (tasks / "tiny_mc.yaml").read_text().split("dataset_kwargs")[0].replace("tiny_mc", "hub_only")
        .replace("dataset_path: json", "dataset_path: allenai/ai2_arc\ndataset_name: ARC-Easy")
        + "test_split: test\noutput_type: multiple_choice\ndoc_to_text: question\ndoc_to_choice: choices\ndoc_to_target: 0\n"
    )  # fmt: skip
    before = _downloaded(tmp_path)  # the local tasks' JSON, as the datasets library caches it
    code = main([*args[:4], "hub_only", *args[6:]])
    one_line_refusal(capsys, code, "--tasks: hub_only", "nothing is downloaded", "--task_folder")
    assert _downloaded(tmp_path) == before
