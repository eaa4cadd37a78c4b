"""Training runs end to end: a real Lightning Trainer, a real MLflow store, real files. No mocks."""

from __future__ import annotations

import json
from pathlib import Path

import lightning.pytorch as L
import numpy as np
import pytest
import torch
from crash_callback import CrashAt
from mini_project import write_recipe

from ablate.cli import main
from ablate.core.workspace import Workspace
from ablate.recipe.loading import load_recipe
from ablate.store import tracking
from ablate.store.stores import Stores
from ablate.train.optimizer import lr_factor
from ablate.train.run import train_run
from components.attention.triton import configs as triton_configs


def _run(recipe_path: Path, variant: str, overrides=(), seed: int = 0):
    (run,) = load_recipe(recipe_path, list(overrides)).resolve(None, seeds=[seed], variants=[variant])
    return run


def _client(workspace: Path):
    return Stores(workspace).client()


def _history(client, run_id: str, key: str) -> dict[int, float]:
    return {m.step: m.value for m in client.get_metric_history(run_id, key)}


class FirstBatch(L.Callback):
    def __init__(self):
        self.batch = None

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if self.batch is None:
            self.batch = batch.clone()


def test_run_records_metrics_params_tags_and_recipe(mini_recipe, tmp_path):
    workspace = tmp_path / "ws"
    previous = triton_configs.chooser()
    try:
        result = train_run(_run(mini_recipe, "diff"), Stores(workspace), progress=False)
        # the `triton` kernels' launch configurations measured in this process are kept in the workspace
        assert triton_configs.chooser().folder == Workspace(workspace).kernel_configs
    finally:
        triton_configs.use(previous)
    assert result.steps == 8 and np.isfinite(result.val_loss)
    client = _client(workspace)
    (experiment,) = [e for e in client.search_experiments() if e.name == "mini"]
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_id == result.run_id
    metrics = set(run.data.metrics)
    for key in (
        "train/loss",
        "val/loss",
        "val/ar_hit",
        "val/others",
        "val/ar_hit_share",
        "tokens",
        "tokens_per_s",
        "mean_tokens_per_s",
        "lr",
        "grad_norm",
        "lambda/layer_00",
        "lambda/layer_01",
    ):
        assert key in metrics, key
    # tokens_per_s is the rate since the previous log line; the run's mean is its own metric, the figure
    # the summary line and final_metrics.json give (one meaning per name)
    assert run.data.metrics["mean_tokens_per_s"] == result.mean_tokens_per_s > 0
    assert f"{result.mean_tokens_per_s:,.0f} tokens/s on average" in result.summary()
    assert run.data.params["model.d_model"] == "32" and run.data.params["train.lr"] == "0.003"
    tags = run.data.tags
    assert (
        tags["ablate.recipe"],
        tags["ablate.variant"],
        tags["ablate.scale"],
        tags["ablate.seed"],
    ) == (
        "mini",
        "diff",
        "paper",
        "0",
    )
    assert tags["ablate.code_version"] and tags["ablate.heads"] == "2" and tags["ablate.gn"] == "yes"
    assert tags["ablate.attention_kernel"] == "sdpa"  # the recipe's backend, resolved for this device
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"resolved_recipe.yaml", "final_metrics.json", "data.json"} <= artifacts
    recipe_text = Path(
        client.download_artifacts(run.info.run_id, "resolved_recipe.yaml", str(tmp_path))
    ).read_text()
    assert "attention_backend: sdpa" in recipe_text and "seed: 0" in recipe_text
    # λ starts at λ_init (Eq. 2: the exp terms start near exp(0) - exp(0)) and is logged per layer.
    assert abs(_history(client, run.info.run_id, "lambda/layer_00")[4] - 0.2) < 0.1
    # The slices partition the validation tokens: the weighted slice losses add up to the total.
    m = run.data.metrics
    share = m["val/ar_hit_share"]
    assert share * m["val/ar_hit"] + (1 - share) * m["val/others"] == pytest.approx(m["val/loss"], rel=1e-6)


def test_same_seed_gives_identical_first_batch_and_initial_loss_across_variants(mini_recipe, tmp_path):
    seen = {}
    results = {}
    for variant in ("transformer", "diff"):
        callback = FirstBatch()
        results[variant] = train_run(
            _run(mini_recipe, variant, [("base.train.steps", 2)]),
            Stores(tmp_path / "ws"),
            progress=False,
            callbacks=[callback],
        )
        seen[variant] = callback.batch
    assert torch.equal(seen["transformer"], seen["diff"])
    client = _client(tmp_path / "ws")
    first = {v: _history(client, r.run_id, "train/loss")[1] for v, r in results.items()}
    assert first["transformer"] == first["diff"]  # zero-initialised residual outputs: same function at step 0
    assert first["transformer"] == pytest.approx(np.log(260), rel=0.05)
    # ... and a different seed sees different data.
    callback = FirstBatch()
    train_run(
        _run(mini_recipe, "transformer", [("base.train.steps", 1)], seed=1),
        Stores(tmp_path / "ws"),
        progress=False,
        callbacks=[callback],
    )
    assert not torch.equal(callback.batch, seen["transformer"])


def test_same_seed_same_curve_in_deterministic_fp32(mini_recipe, tmp_path):
    overrides = [("base.train.deterministic", True)]
    curves = []
    for i in range(2):
        result = train_run(_run(mini_recipe, "diff", overrides), Stores(tmp_path / f"ws{i}"), progress=False)
        curves.append(_history(_client(tmp_path / f"ws{i}"), result.run_id, "train/loss"))
    assert len(curves[0]) == 8 and curves[0] == curves[1]


def test_crashed_run_resumes_at_same_step_and_lr_without_second_mlflow_run(mini_recipe, tmp_path):
    overrides = [("base.train.deterministic", True)]
    reference = train_run(
        _run(mini_recipe, "transformer", overrides), Stores(tmp_path / "ref"), progress=False
    )
    ref_loss = _history(_client(tmp_path / "ref"), reference.run_id, "train/loss")

    run = _run(mini_recipe, "transformer", overrides)
    workspace = tmp_path / "ws"
    with pytest.raises(RuntimeError, match="simulated crash"):
        train_run(run, Stores(workspace), progress=False, callbacks=[CrashAt(step=6)])  # checkpoint at step 4
    client = _client(workspace)
    (crashed,) = client.search_runs([client.get_experiment_by_name("mini").experiment_id])
    assert crashed.info.status == "RUNNING"  # left for the next attempt

    result = train_run(run, Stores(workspace), progress=False)
    runs = client.search_runs([client.get_experiment_by_name("mini").experiment_id])
    assert len(runs) == 1 and runs[0].info.run_id == crashed.info.run_id and runs[0].info.status == "FINISHED"
    assert result.steps == 8
    lrs = _history(client, result.run_id, "lr")
    cfg = run.train
    for step in (5, 6, 7, 8):  # the step after resuming continues the schedule where it was
        assert lrs[step] == pytest.approx(cfg.lr * lr_factor(step, cfg), rel=1e-6), step
    resumed_loss = _history(client, result.run_id, "train/loss")
    for step in (5, 6, 7, 8):  # the same batches and the same weights as the run that never stopped
        assert resumed_loss[step] == pytest.approx(ref_loss[step], rel=1e-5), step
    # its training time counts the crashed attempt up to the checkpoint it resumed from, as reports read it
    assert reference.earlier_attempts_seconds == 0.0 and result.earlier_attempts_seconds > 0
    final = json.loads(tracking.artifact_text(client, result.run_id, "final_metrics.json"))
    assert final["earlier_attempts_seconds"] == result.earlier_attempts_seconds


def test_finished_run_is_not_trained_again(mini_recipe, tmp_path):
    run = _run(mini_recipe, "transformer", [("base.train.steps", 2)])
    first = train_run(run, Stores(tmp_path / "ws"), progress=False)
    again = train_run(run, Stores(tmp_path / "ws"), progress=False)
    assert (
        again.status == "already-finished"
        and again.run_id == first.run_id
        and again.val_loss == first.val_loss
    )


def test_lr_schedule_is_linear_warmup_then_linear_decay(mini_recipe):
    cfg = _run(
        mini_recipe,
        "transformer",
        [("base.train.steps", 100), ("base.train.warmup_steps", 10), ("base.train.min_lr", 0.0)],
    ).train
    assert lr_factor(0, cfg) == pytest.approx(0.1) and lr_factor(9, cfg) == pytest.approx(1.0)
    assert lr_factor(10, cfg) == pytest.approx(1.0) and lr_factor(55, cfg) == pytest.approx(0.5)
    assert lr_factor(100, cfg) == pytest.approx(0.0)


def _train_diff(recipe, workspace, *args: str) -> int:
    """`ablate train RECIPE --variant diff --workspace WORKSPACE ARGS...`: its exit code."""
    return main(["train", str(recipe), "--variant", "diff", "--workspace", str(workspace), *args])


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


def test_missing_data_path_is_one_line_exit_2(mini_recipe, tmp_path, capsys):
    code = _train_diff(mini_recipe, tmp_path / "ws", "--base.data.source", str(tmp_path / "nowhere"))
    assert code == 2 and "data.source" in _one_error_line(capsys)


def test_vocab_of_data_larger_than_model_is_one_line_exit_2(mini_recipe, tmp_path, capsys):
    code = _train_diff(mini_recipe, tmp_path / "ws", "--base.model.vocab_size", "100")
    line = _one_error_line(capsys)
    assert code == 2 and "model.vocab_size" in line and "257" in line


def test_unreadable_shard_is_one_line_exit_2(mini_recipe, tmp_path, capsys):
    shards = tmp_path / "shards"
    assert main(["prepare", str(mini_recipe), "--out", str(shards), "--workspace", str(tmp_path / "ws")]) == 0
    capsys.readouterr()
    victim = sorted(shards.rglob("*.bin"))[0]
    victim.write_bytes(victim.read_bytes()[:-3])  # truncated: its size no longer matches its header
    code = _train_diff(
        mini_recipe, tmp_path / "ws", "--base.data.source", str(shards), "--base.data.tokenizer", "null"
    )
    assert code == 2 and "data.source" in _one_error_line(capsys)


def test_tokenizer_not_available_offline_is_one_line_exit_2(mini_recipe, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty-cache"))
    code = _train_diff(
        mini_recipe, tmp_path / "ws", "--base.data.tokenizer", "{name: tiktoken, encoding: cl100k_base}"
    )
    assert code == 2 and "data.tokenizer" in _one_error_line(capsys)


def test_unwritable_workspace_is_one_line_exit_2(mini_recipe, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    code = _train_diff(mini_recipe, blocker / "ws")
    assert code == 2 and "--workspace" in _one_error_line(capsys)


def test_summary_printed_by_cli(mini_recipe, tmp_path, capsys):
    recipe = write_recipe(tmp_path / "r", base__train__steps=2)
    assert main(["train", str(recipe), "--variant", "transformer", "--workspace", str(tmp_path / "ws")]) == 0
    out = capsys.readouterr().out
    assert (
        "val loss" in out
        and "AR-Hit" in out
        and "Others" in out
        and "tokens/s" in out
        and "MLflow run" in out
    )
    result = json.loads(next((tmp_path / "ws" / "runs").rglob("result.json")).read_text())
    assert result["steps"] == 2


def test_train_on_a_recipe_with_sizes_needs_a_size(tmp_path, capsys):
    recipe = write_recipe(
        tmp_path,
        sizes={"s1": {"model": {"d_model": 32}}, "s2": {"model": {"d_model": 48}}},
        base__train__steps=1,
    )
    args = ["train", str(recipe), "--variant", "transformer", "--workspace", str(tmp_path / "ws")]
    assert main(args) == 2 and "--size" in _one_error_line(capsys)
    assert main([*args, "--size", "s3"]) == 2 and "s1, s2" in _one_error_line(capsys)
    assert main([*args, "--size", "s2"]) == 0
    assert "transformer-s2-s0" in capsys.readouterr().out


def test_the_kernel_auto_resolves_to_is_what_the_run_records():
    """`auto` depends on device, dtype and CPU kind: the tag names what the layers' cores resolve to."""
    from dataclasses import replace

    from ablate.recipe.loading import load_recipe
    from ablate.train.choices.decided import Placement
    from ablate.train.records import run_attention_kernel
    from components.attention import backends

    def attention_kernel(run, device, precision):
        return run_attention_kernel(run.model, run.train.seq_len, Placement(device, precision, ""))

    table6 = Path(__file__).resolve().parents[2] / "recipes" / "table6.yaml"
    runs = {r.variant: r for r in load_recipe(table6, scale="tiny").runs}
    diff = replace(runs["diff"], model=replace(runs["diff"].model, attention_backend="auto"))
    softmax = replace(runs["transformer"], model=replace(runs["transformer"].model, attention_backend="auto"))
    assert attention_kernel(diff, "cpu", "32-true") == "combined"  # sequences of 256 in float32
    assert attention_kernel(softmax, "cpu", "32-true") == "sdpa"
    amx = backends.cpu_has_amx()  # read here
    assert attention_kernel(diff, "cpu", "bf16-mixed") == ("blockwise" if amx else "combined")
