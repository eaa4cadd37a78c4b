"""What reads runs back (`ablate status`, the export beside a report, time.csv's training seconds) says which
run it could not read and why, instead of counting it as zero or leaving it out without a word: a real
finished run whose final_metrics.json was damaged on disk, and a tracking server that does not answer."""

from __future__ import annotations

import json
from types import SimpleNamespace

import mlflow
import optuna
import pyarrow.parquet as pq
from mini_project import write_recipe

from ablate.recipe.loading import load_recipe
from ablate.report.budget_cost import train_seconds
from ablate.store.export import RUNS_FILE
from ablate.store.export_write import write_export
from ablate.store.stores import Stores
from ablate.store.study import open_study
from ablate.sweep.queue import claim_waiting, enqueue_missing
from ablate.sweep.status import status_report
from ablate.train.run import train_run
from ablate.verbs.options import Shared, sweep_context


def test_a_damaged_artifact_is_named_by_the_export_and_time_csv(tmp_path, capsys):
    recipe = write_recipe(tmp_path)
    stores = Stores(tmp_path / "ws")
    (run,) = load_recipe(recipe, []).resolve(None, seeds=[0], variants=["transformer"])
    run_id = train_run(run, stores, progress=False).run_id
    client = stores.client()
    (final,) = (tmp_path / "ws" / "artifacts").rglob(f"{run_id}/**/final_metrics.json")
    final.write_bytes(b'{"seconds": \xff\xfe}')  # damaged on disk: not text
    capsys.readouterr()

    seconds = train_seconds(
        SimpleNamespace(stores=stores), [SimpleNamespace(run_id=run_id, state="finished")]
    )
    out = capsys.readouterr().out
    assert seconds[run_id] != seconds[run_id]  # nan, and said:
    assert f"[report] time.csv: run {run_id}: final_metrics.json not read (UnicodeDecodeError" in out

    study = optuna.create_study()
    study.add_trial(optuna.trial.create_trial(value=1.0, user_attrs={"mlflow_run_id": run_id}))
    write_export(client, study, {}, tmp_path / "export")
    out = capsys.readouterr().out
    assert f"[export] run {run_id}: final_metrics.json not read (UnicodeDecodeError" in out
    (row,) = pq.read_table(tmp_path / "export" / RUNS_FILE).to_pylist()
    assert sorted(json.loads(row["artifacts"])) == ["data.json", "resolved_recipe.yaml"]  # the rest is kept


def test_status_names_the_running_trial_it_could_not_read(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    recipe = write_recipe(tmp_path)
    ctx = sweep_context(str(recipe), Shared(workspace=str(tmp_path / "ws")), None, 60.0, None)
    study, storage = open_study(ctx)
    enqueue_missing(study, ctx.plans())
    trial = claim_waiting(study, storage)
    trial.set_user_attr("mlflow_run_id", "0123abcd")
    unreachable = mlflow.MlflowClient("http://127.0.0.1:9")  # nothing listens: the store does not answer
    text = status_report(ctx, study, client=unreachable)
    (line,) = [x for x in text.splitlines() if x.startswith("not read:")]
    assert f"trial {trial.number} (transformer-s0, MLflow run 0123abcd): its tokens so far not read" in line
    assert "MlflowException" in line
