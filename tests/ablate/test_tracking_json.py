"""A run's JSON artifacts are strict JSON (a real SQLite MLflow store)."""

from __future__ import annotations

import json
import math

from ablate.core.workspace import Workspace
from ablate.store import tracking
from ablate.store.stores import Stores


def test_a_diverged_runs_summary_is_strict_json_with_null_for_nan(tmp_path):
    client = Stores(tmp_path / "ws").client()
    experiment = tracking.get_experiment_id(client, "strict-json", Workspace(tmp_path / "ws"))
    run_id = client.create_run(experiment).info.run_id
    summary = {"val_loss": math.nan, "best": {"loss": math.inf, "step": 4}, "curve": [1.5, -math.inf]}
    tracking.log_json(client, run_id, summary, "final_metrics.json")

    folder = tmp_path / "download"
    folder.mkdir()
    text = (tmp_path / client.download_artifacts(run_id, "final_metrics.json", str(folder))).read_text()
    strict = json.loads(text, parse_constant=lambda name: (_ for _ in ()).throw(ValueError(name)))
    assert strict == {"val_loss": None, "best": {"loss": None, "step": 4}, "curve": [1.5, None]}
