"""A report's `command:` line names the places of the machine that ran the study by their flag, not their path."""

from __future__ import annotations

from pathlib import Path

from ablate.store.commands import portable_command


def test_workspace_reports_and_store_paths_become_their_flag_names(tmp_path):
    here = tmp_path / "repo"
    command = (
        f"ablate sweep {here}/recipes/table6.yaml --scale cpu --search {here}/sweeps/lr.yaml --workers 2 --yes "
        "--workspace /srv/lr/ws --reports=/srv/lr/reports --storage journal:/srv/j.log "
        "--tracking-uri sqlite:////srv/mlflow.db"
    )
    assert portable_command(command, here) == (
        "ablate sweep recipes/table6.yaml --scale cpu --search sweeps/lr.yaml --workers 2 --yes "
        "--workspace WORKSPACE --reports=REPORTS --storage STORAGE --tracking-uri TRACKING_URI"
    )


def test_relative_places_servers_and_other_words_stay_as_typed(tmp_path):
    command = (
        "ablate sweep recipes/table6.yaml --scale tiny --yes --reports ablate-runs/reports --workspace ws "
        "--storage postgresql://me@db-host/studies --tracking-uri http://mlflow:5000 --base.train.lr=3e-4"
    )
    assert portable_command(command, tmp_path) == command
    assert portable_command("ablate sweep /elsewhere/r.yaml", tmp_path) == "ablate sweep /elsewhere/r.yaml"
    assert Path(portable_command(f"ablate sweep {tmp_path}/r.yaml", tmp_path).split()[-1]) == Path("r.yaml")
