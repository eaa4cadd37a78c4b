"""A training run's progress line (`ablate.train.progress`): optimizer steps, tokens, loss, tok/s, ETA."""

from __future__ import annotations

import io
import re

import lightning.pytorch as L
import torch
from mini_project import run_cli

from ablate.store.stores import Stores
from ablate.train.progress import StepProgress, format_duration, progress_line


def test_progress_line_counts_steps_tokens_and_time_left():
    line = progress_line(
        step=30, total=120, batch_tokens=8192, loss=4.51234, val_loss=4.6, tokens_per_s=4096.0, elapsed=60.0
    )
    # 90 steps of 8192 tokens left at 4096 tok/s: 180 s
    assert line == (
        "train 30/120 steps  246K/983K tokens  loss 4.512  val 4.600  4.1K tok/s  elapsed 1:00  ETA 3:00"
    )
    assert progress_line(0, 10, 100, float("nan"), float("nan"), float("nan"), 0.0).endswith(
        "- tok/s  elapsed 0:00  ETA ?"
    )
    assert format_duration(3725) == "1:02:05" and format_duration(59.6) == "1:00"


def test_a_training_run_prints_the_progress_line_in_its_log(tmp_path, mini_recipe):
    workspace = tmp_path / "ws"
    proc = run_cli(
        "train",
        str(mini_recipe),
        "--variant",
        "diff",
        "--workspace",
        str(workspace),
        cwd=tmp_path,
        check=True,
    )
    log = proc.stdout + proc.stderr
    assert "Epoch 0" not in log and "it/s" not in log  # Lightning's micro-batch bar is gone
    lines = [line for line in re.split(r"[\r\n]", log) if line.startswith("train ")]
    assert lines, log
    last = lines[-1]
    # mini: 8 steps of 256 tokens (2 micro-batches of 4 x 32 each: accumulation counts once per step)
    match = re.fullmatch(
        r"train 8/8 steps  2\.05K/2\.05K tokens  loss (\d+\.\d{3})  val (\d+\.\d{3})  "
        r"(\S+) tok/s  elapsed \d+:\d\d  ETA 0:00",
        last,
    )
    assert match, last
    client = Stores(workspace).client()
    (run,) = client.search_runs([client.get_experiment_by_name("mini").experiment_id])
    train_loss = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "train/loss")}[8]
    val_loss = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "val/loss")}[8]
    # the line shows the step's training loss and the validation loss the run logged
    assert match.group(1) == f"{train_loss:.3f}" and match.group(2) == f"{val_loss:.3f}"
    assert match.group(3) not in ("-", "0")


class _TTY(io.StringIO):
    def isatty(self) -> bool:
        return True


class _Regression(L.LightningModule):
    """A least-squares fit: a real Lightning module whose training loss is known to fall."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val/loss", torch.nn.functional.mse_loss(self.layer(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_on_a_terminal_the_line_is_redrawn_in_place_and_validation_has_no_bar(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(64, 4)
    data = torch.utils.data.TensorDataset(x, x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    tty = _TTY()
    bar = StepProgress(batch_tokens=100, stream=tty, refresh_seconds=0.0)
    trainer = L.Trainer(
        max_steps=6,
        accumulate_grad_batches=2,
        val_check_interval=4,
        limit_val_batches=2,
        callbacks=[bar],
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=tmp_path,
        accelerator="cpu",
    )
    trainer.fit(_Regression(), loader, loader)
    out = tty.getvalue()
    assert out.startswith("\r") and out.endswith("\n") and out.count("\n") == 1  # one line, redrawn
    draws = [d.rstrip() for d in out.strip("\n").split("\r")[1:]]
    steps = [int(re.match(r"train (\d+)/6 steps", d).group(1)) for d in draws]
    assert steps[0] == 1 and steps[-1] == 6 and steps == sorted(steps)  # optimizer steps, not micro-batches
    assert "600/600 tokens" in draws[-1] and "val " in draws[-1] and "Validation" not in out
