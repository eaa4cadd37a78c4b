"""How training windows are drawn (`data.sampling`, ablate.data.loader), in real Lightning runs on a small
corpus: a pass reads every window once; a resumed run and a budget's branch read the windows of the run
that never stopped; `random` trains as the code did before `permutation` existed, bit for bit."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import lightning.pytorch as L
import numpy as np
import pytest
import torch
import yaml
from crash_callback import CrashAt
from mini_project import MINI, write_corpus, write_recipe

from ablate.core.workspace import Workspace
from ablate.data import load_tokens
from ablate.recipe.loading import load_recipe
from ablate.store.stores import Stores
from ablate.train.branches import train_budgets
from ablate.train.run import train_run

FIXTURE = Path(__file__).parent / "fixtures" / "random_sampling.json"


class Batches(L.Callback):
    """Every train micro-batch a run reads, with the optimizer step it goes into (1-based)."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, torch.Tensor]] = []

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.seen.append((trainer.global_step + 1, batch.clone()))

    def windows(self, steps: range | None = None) -> list[bytes]:
        """The windows read (in steps `steps`, default all), in the order read, as bytes."""
        return [
            row.numpy().tobytes()
            for step, batch in self.seen
            if steps is None or step in steps
            for row in batch
        ]


def _recipe(tmp_path: Path, **changes) -> Path:
    """The mini recipe on a 3-document corpus: 2,809 training tokens, 87 windows of 33 tokens (stride 32),
    8 windows a step, so the first pass ends inside step 11's second micro-batch."""
    corpus = write_corpus(tmp_path / "small", n_docs=3)
    return write_recipe(tmp_path, base__data__source=str(corpus), base__train__deterministic=True, **changes)


def _all_windows(run, workspace: Path) -> dict[bytes, int]:
    """Every window of the run's training split (stride seq_len, seq_len + 1 tokens) -> its number."""
    train = load_tokens(run.data, Workspace(workspace)).train
    width, stride = run.train.seq_len + 1, run.train.seq_len
    n = (len(train) - 1) // stride
    windows = {
        np.asarray(train[k * stride : k * stride + width], dtype=np.int64).tobytes(): k for k in range(n)
    }
    assert len(windows) == n  # no two windows of this corpus have the same text, so bytes name a window
    return windows


def _losses(client, run_id: str, key: str = "train/loss") -> dict[int, float]:
    return {m.step: m.value for m in client.get_metric_history(run_id, key)}


def test_one_pass_reads_every_window_of_the_split_once_and_the_next_pass_another_order(tmp_path):
    recipe = _recipe(tmp_path, base__train__steps=11, base__train__val_every=11)
    (run,) = load_recipe(recipe).runs_for(variants=["transformer"])
    assert run.data.sampling == "permutation"  # the default
    seen = Batches()
    result = train_run(run, Stores(tmp_path / "ws"), progress=False, callbacks=[seen])
    params = Stores(tmp_path / "ws").client().get_run(result.run_id).data.params
    assert params["data.sampling"] == "permutation"  # every run records how it drew its windows
    windows = _all_windows(run, tmp_path / "ws")
    read = [windows[w] for w in seen.windows()]  # KeyError: a window not at a multiple of the stride
    assert len(windows) == 87 and len(read) == 11 * 8
    first_pass, second = read[: len(windows)], read[len(windows) :]
    assert sorted(first_pass) == list(range(len(windows)))  # each window once, none left out
    assert first_pass != sorted(first_pass)  # in a shuffled order
    # the inputs (and the targets) of one pass tile the split: token positions 0 .. 87*32 - 1, each once
    inputs = np.concatenate([np.arange(k * 32, k * 32 + 32) for k in first_pass])
    assert np.array_equal(np.sort(inputs), np.arange(87 * 32))
    # the second pass starts another permutation (seed, pass 1), not the first one again
    assert len(second) == 1 and second != first_pass[:1]


def test_a_resumed_run_and_a_budgets_branch_read_the_windows_of_the_run_that_never_stopped(tmp_path):
    """Float32 on one machine: the same windows in the same steps, and the same losses (== on floats). The
    steps compared cross the end of the first pass (in step 11)."""
    recipe = _recipe(
        tmp_path, base__train__schedule="wsd", base__train__val_every=4, budgets={"steps": [12, 16]}
    )
    (run,) = load_recipe(recipe).runs_for(variants=["diff"])
    every_run = Batches()  # the longest run (16 steps, never stopped), then the branch of budget 12
    results = train_budgets(
        run, Stores(tmp_path / "branched"), progress=False, every_run_callbacks=[every_run]
    )
    longest, branch = results
    client = Stores(tmp_path / "branched").client()
    uninterrupted = Batches()
    uninterrupted.seen = every_run.seen[: 16 * 2]
    assert [step for step, _ in uninterrupted.seen] == [s for s in range(1, 17) for _ in range(2)]

    crashed, resumed = Batches(), Batches()
    with pytest.raises(RuntimeError, match="simulated crash"):
        train_run(
            run.at_budget(16), Stores(tmp_path / "ws"), progress=False, callbacks=[crashed, CrashAt(step=10)]
        )
    again = train_run(run.at_budget(16), Stores(tmp_path / "ws"), progress=False, callbacks=[resumed])
    assert min(step for step, _ in resumed.seen) == 9  # resumed from the checkpoint at step 8
    after = range(9, 17)
    assert resumed.windows() == uninterrupted.windows(after)
    resumed_loss = _losses(Stores(tmp_path / "ws").client(), again.run_id)
    assert {s: resumed_loss[s] for s in after} == {s: _losses(client, longest.run_id)[s] for s in after}
    assert again.val_loss == longest.val_loss

    assert branch.steps == 12 and run.at_budget(12).train.cooldown_start == 10
    fresh_batches = Batches()
    fresh = train_run(
        run.at_budget(12), Stores(tmp_path / "fresh"), progress=False, callbacks=[fresh_batches]
    )
    branch_windows = [row.numpy().tobytes() for step, b in every_run.seen[16 * 2 :] for row in b]
    assert branch_windows == fresh_batches.windows(range(11, 13)) == uninterrupted.windows(range(11, 13))
    branched_loss = _losses(client, branch.run_id)
    assert sorted(branched_loss) == [11, 12]  # the branch trained its cooldown only
    assert branched_loss == {
        s: _losses(Stores(tmp_path / "fresh").client(), fresh.run_id)[s] for s in (11, 12)
    }
    assert branch.val_loss == fresh.val_loss


def test_random_sampling_trains_as_before_bit_for_bit(tmp_path):
    """`data.sampling: random` reads the batches the code read before the key existed (their sha256, any
    machine) and gives its losses (bit for bit on the machine kind the fixture was recorded on, float32
    rounding elsewhere); its runs keep the keys they had, so their workspaces and studies resume."""
    before = json.loads(FIXTURE.read_text())
    recipe = write_recipe(tmp_path, base__train__deterministic=True, base__data__sampling="random")
    (run,) = load_recipe(recipe, []).resolve(None, seeds=[0], variants=["transformer"])
    seen = Batches()
    result = train_run(run, Stores(tmp_path / "ws"), progress=False, callbacks=[seen])
    assert [hashlib.sha256(b.numpy().tobytes()).hexdigest() for _, b in seen.seen] == before["batches_sha256"]
    losses = _losses(Stores(tmp_path / "ws").client(), result.run_id)
    recorded = {int(s): float.fromhex(v) for s, v in before["train_loss"].items()}
    val = {h["step"]: h["val/loss"] for h in result.history}
    recorded_val = {int(s): float.fromhex(v) for s, v in before["val_loss"].items()}
    if _cpu() == before["cpu"]:
        assert losses == recorded and val == recorded_val
    else:
        assert losses == pytest.approx(recorded, rel=1e-5) and val == pytest.approx(recorded_val, rel=1e-5)

    fixed = copy.deepcopy(MINI)
    fixed["base"]["data"]["source"] = "stdlib"
    keys = {}
    for sampling in ("random", "permutation"):
        fixed["base"]["data"]["sampling"] = sampling
        (tmp_path / f"{sampling}.yaml").write_text(yaml.safe_dump(fixed, sort_keys=False))
        runs = load_recipe(tmp_path / f"{sampling}.yaml", []).resolve(None, seeds=[0, 1])
        keys[sampling] = {r.name: r.key for r in runs}
    assert keys["random"] == before["run_keys"]
    assert not set(keys["permutation"].values()) & set(keys["random"].values())  # other windows, other runs


def _cpu() -> str:
    """The CPU's model name as Linux gives it ('' elsewhere)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return ""
    for line in lines:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return ""
