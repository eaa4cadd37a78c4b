"""A sweep's MLflow parent run is one per study: the study remembers its id, and a study that lost it (the
Optuna study deleted and made again, the MLflow store kept) finds the same parent run by its tags instead of
making a second one. Real Optuna journal, real MLflow SQLite store."""

from __future__ import annotations

import optuna
from mini_project import write_recipe

from ablate.recipe.loading import load_recipe
from ablate.store import names, tracking
from ablate.store.stores import Stores
from ablate.store.study import SweepContext, open_study
from ablate.sweep.worker import parent_run_id


def sweep_parents(ctx: SweepContext) -> list:
    """Every run of the sweep's experiment that is not a trial's (trials have a parent, the sweep's none)."""
    client = ctx.stores.client()
    experiment = client.get_experiment_by_name(tracking.experiment_name(ctx.recipe.name, ctx.scale))
    runs = client.search_runs([experiment.experiment_id])
    return [r for r in runs if names.MLFLOW_PARENT not in r.data.tags]


def test_a_study_that_lost_its_parent_id_finds_its_parent_run_again(tmp_path):
    recipe = load_recipe(write_recipe(tmp_path))
    ctx = SweepContext(recipe=recipe, scale=recipe.scale, seeds=[0], stores=Stores(tmp_path / "ws"))
    study, storage = open_study(ctx)
    first = parent_run_id(ctx, study)
    assert parent_run_id(ctx, study) == first  # remembered by the study

    optuna.delete_study(study_name=ctx.study_name, storage=storage)  # the stored id goes with it
    again, _ = open_study(ctx)
    assert not again.user_attrs
    assert parent_run_id(ctx, again) == first
    assert [r.info.run_id for r in sweep_parents(ctx)] == [first]
    assert again.user_attrs["mlflow_parent_run_id"] == first  # and the new study remembers it
