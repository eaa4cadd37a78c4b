"""The mini recipe's losses, bit for bit, against a record made with an earlier version of the training
code: a change that moves code around (which module builds the Trainer, where a config lives, how the
parametrization is parsed) must not move a single number.

Pinned so that the record holds on any run of the suite: fp32 (`train.precision: 32-true`, whatever
ABLATE_NATIVE_BF16 says), one intra-op thread, the byte tokenizer on the generated corpus. Three runs cover
the training paths: Diff attention under the standard parametrization (the linear schedule), softmax
under `mup`, and a wsd run with a smaller budget branched off it (ablate.train.branches: a resumed
checkpoint). Regenerate the record only on purpose: `ABLATE_RECORD_LOSSES=1 pytest tests/e2e/test_mini_losses.py`
(then say in the commit why the numbers moved).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from mini_project import write_recipe

from ablate.recipe.loading import load_recipe
from ablate.store.stores import Stores
from ablate.train.branches import train_budgets

RECORD = Path(__file__).with_name("fixtures") / "mini_losses.json"

CASES = {  # name: (recipe changes, variant, overrides)
    "diff-standard": ({}, "diff", []),
    "softmax-mup": (
        {"base__model__parametrization": {"name": "mup", "base_d_model": 16}},
        "transformer",
        [],
    ),
    "diff-wsd-budgets": (
        {"base__train__schedule": "wsd", "base__train__cooldown_fraction": 0.5, "budgets": {"steps": [4, 8]}},
        "diff",
        [],
    ),
}


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _losses(case: str, folder: Path) -> dict[str, dict[str, dict[str, str]]]:
    """{run name and steps: {"train/loss" | "val/loss": {step: repr}}} from the runs' MLflow records."""
    changes, variant, overrides = CASES[case]
    recipe = write_recipe(folder, **changes)
    (run,) = load_recipe(recipe, overrides).resolve(None, seeds=[0], variants=[variant])
    stores = Stores(folder / "ws")
    client = stores.client()
    out = {}
    for result in train_budgets(run, stores, progress=False):
        out[f"{result.name}@{result.steps}"] = {
            key: {str(m.step): repr(m.value) for m in client.get_metric_history(result.run_id, key)}
            for key in ("train/loss", "val/loss")
        }
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_mini_losses_match_the_record_bit_for_bit(case, tmp_path, one_thread):
    losses = _losses(case, tmp_path)
    assert losses and all(v["train/loss"] and v["val/loss"] for v in losses.values())
    if os.environ.get("ABLATE_RECORD_LOSSES") == "1":
        record = json.loads(RECORD.read_text()) if RECORD.exists() else {}
        record[case] = losses
        RECORD.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    assert losses == json.loads(RECORD.read_text())[case]
