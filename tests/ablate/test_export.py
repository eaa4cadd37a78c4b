"""The export (ablate.store.export) against a real MLflow store and a real Optuna study: what it reads back
is what the store gave, in the store's order; machine tags are left out; a missing artifact reads as none."""

from __future__ import annotations

import math

import optuna
from optuna.trial import TrialState

from ablate.core.workspace import Workspace
from ablate.store import tracking
from ablate.store.export import SCHEME, exported_study, read_meta
from ablate.store.export_write import write_export
from ablate.store.stores import Stores


def _store_and_study(tmp_path):
    workspace = Workspace(tmp_path / "ws").create()
    client = Stores(workspace).client()  # the embedded SQLite store a sweep uses
    experiment = tracking.get_experiment_id(client, "e", workspace)
    tags = {"ablate.variant": "diff", "mlflow.user": "someone", "mlflow.source.name": "/srv/someone/x.py"}
    run_id = client.create_run(experiment, tags=tags).info.run_id
    client.log_param(run_id, "model.d_model", "32")
    for step, value in ((2, 5.5), (4, 5.25), (4, 5.125)):  # a repeated step keeps its order
        client.log_metric(run_id, "val/loss", value, step=step)
    client.log_metric(run_id, "val/nan_slice", math.nan, step=4)
    client.log_text(run_id, '{"val_loss": 5.125}', "final_metrics.json")
    client.set_terminated(run_id, "FINISHED")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="s", storage=optuna.storages.InMemoryStorage())
    study.set_user_attr(
        "command", "ablate sweep r.yaml --workspace /home/someone/runs --reports /scratch/rep"
    )
    study.add_trial(
        optuna.trial.create_trial(
            state=TrialState.COMPLETE,
            value=5.125,
            params={"base.train.lr": 0.003},
            distributions={"base.train.lr": optuna.distributions.CategoricalDistribution([0.001, 0.003])},
            user_attrs={"mlflow_run_id": run_id, "plan": '{"seed": 0}'},
        )
    )
    return client, study, run_id


def test_the_export_reads_back_what_the_store_holds(tmp_path):
    client, study, run_id = _store_and_study(tmp_path)
    folder = tmp_path / "report"
    settings = {
        "recipe": "r.yaml",
        "scale": "tiny",
        "seeds": [0],
        "search": None,
        "grace_period": 60.0,
        "overrides": [],
    }
    written = write_export(client, study, settings, folder)
    assert [p.name for p in written] == ["runs.parquet", "metrics.parquet"]

    runs = Stores(tmp_path / "no-workspace", SCHEME + str(folder)).client()
    original, exported = client.get_run(run_id), runs.get_run(run_id)
    assert exported.info.status == "FINISHED"
    assert exported.data.params == original.data.params
    assert exported.data.tags == {
        k: v for k, v in original.data.tags.items() if not k.startswith(("mlflow.user", "mlflow.source."))
    }
    assert "ablate.variant" in exported.data.tags and "mlflow.user" not in exported.data.tags
    assert exported.data.metrics["val/loss"] == original.data.metrics["val/loss"] == 5.125
    assert math.isnan(exported.data.metrics["val/nan_slice"])
    history = [(m.step, m.value) for m in runs.get_metric_history(run_id, "val/loss")]
    assert history == [(m.step, m.value) for m in client.get_metric_history(run_id, "val/loss")]
    assert history == [(2, 5.5), (4, 5.25), (4, 5.125)]
    assert tracking.read_json_artifact(runs, run_id, "final_metrics.json") == {"val_loss": 5.125}
    assert tracking.read_json_artifact(runs, run_id, "data.json") is None  # never logged

    study.enqueue_trial({}, user_attrs={"plan": '{"seed": 1}'})  # withdrawn before a worker took it:
    (waiting,) = study.get_trials(states=(TrialState.WAITING,))  # failed with no start, as storages allow
    study._storage.set_trial_state_values(waiting._trial_id, TrialState.FAIL)
    write_export(client, study, settings, folder)

    again = exported_study(folder)
    # the command as a reader can run it: the places of the machine that trained are named, not given
    assert again.study_name == "s"
    assert again.user_attrs == {"command": "ablate sweep r.yaml --workspace WORKSPACE --reports REPORTS"}
    t, withdrawn = again.get_trials()
    o, w = study.get_trials()
    assert (t.state, t.value, t.params, t.user_attrs) == (o.state, o.value, o.params, o.user_attrs)
    assert (t.datetime_start, t.datetime_complete) == (o.datetime_start, o.datetime_complete)
    assert w.datetime_start is None and (withdrawn.state, withdrawn.user_attrs) == (w.state, w.user_attrs)
    assert withdrawn.datetime_start == withdrawn.datetime_complete == w.datetime_complete  # Optuna needs one
    assert read_meta(folder)["report"] == settings
