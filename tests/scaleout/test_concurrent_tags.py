"""Tags written at the same moment by many processes onto one run (a sweep's workers ending trials together
all tag its parent run) through an MLflow server on PostgreSQL: none fails, the last value stands."""

from __future__ import annotations

import threading

import mlflow
import pytest

from ablate.store.tracking import set_tags

pytestmark = pytest.mark.scaleout

WRITERS = 8
ROUNDS = 6


def _race(write, run_id: str) -> list[BaseException]:
    """Every writer sets the same fresh keys at once, round after round; the errors they met."""
    errors: list[BaseException] = []
    barrier = threading.Barrier(WRITERS)

    def writer(index: int) -> None:
        for round_ in range(ROUNDS):
            barrier.wait()
            try:
                write(run_id, {f"race.{round_}.{k}": f"w{index}" for k in range(3)})
            except Exception as e:  # noqa: BLE001 (collected and asserted on below)
                errors.append(e)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(WRITERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_tags_written_together_onto_one_run_all_land(mlflow_server):
    client = mlflow.MlflowClient(tracking_uri=mlflow_server.url)
    experiment = client.create_experiment("concurrent-tags")
    run_id = client.create_run(experiment).info.run_id

    errors = _race(lambda run, tags: set_tags(client, run, tags, current={}), run_id)

    assert errors == []
    tags = client.get_run(run_id).data.tags
    for round_ in range(ROUNDS):
        values = {tags.get(f"race.{round_}.{k}") for k in range(3)}
        assert values <= {f"w{i}" for i in range(WRITERS)} and None not in values
