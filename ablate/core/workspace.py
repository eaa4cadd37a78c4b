"""A workspace folder's layout, one value: where a study keeps its runs, caches, logs and embedded stores.

Every path under `--workspace` is named here, once, so the layers that train, tokenise, log and store
ask this value where things go instead of joining folder names to a loose path:

    <root>/runs/<experiment>/<run>-<key>/     one run: checkpoints, result.json (ablate.train.resume, .records)
    <root>/runs/<experiment>/stable/<...>/    the stable phase a budgeted study keeps (ablate.train.branches)
    <root>/cache/tokens/<tokenizer>-<key>/    a corpus tokenised once (ablate.data.tokens)
    <root>/cache/tokenizers/<file>.json       a trained BPE (ablate.data.tokenizers)
    <root>/cache/attention_choices.json       `auto`'s measured attention per card and shape (ablate.train.choices.attention)
    <root>/cache/kernels/                     the `triton` kernels' measured launch configurations (ablate.model.kernels)
    <root>/logs/                              local workers' output (ablate.sweep.local)
    <root>/slurm/                             submitit's scripts and logs (ablate.sweep.slurm)
    <root>/mlflow.db, <root>/artifacts/       the embedded MLflow store (ablate.store)
    <root>/optuna.journal                     the embedded Optuna storage (ablate.store)
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from ablate.core.errors import UserError


class _Under:
    """A path below a workspace's root, read as an attribute (`workspace.logs`): the layout above, one line
    a path."""

    def __init__(self, *parts: str):
        self.parts = parts

    def __get__(self, workspace: Workspace | None, owner: type | None = None) -> Path:
        if workspace is None:  # on the class itself (help, introspection): the descriptor
            return self  # type: ignore[return-value]
        return workspace.root.joinpath(*self.parts)


@dataclass(frozen=True)
class Workspace:
    """The layout of one workspace folder; `root` is made absolute, so the paths stay right when a child
    process starts elsewhere."""

    root: Path

    runs = _Under("runs")
    token_cache = _Under("cache", "tokens")
    tokenizer_cache = _Under("cache", "tokenizers")
    attention_choices = _Under("cache", "attention_choices.json")
    kernel_configs = _Under("cache", "kernels")
    logs = _Under("logs")
    slurm = _Under("slurm")
    mlflow_db = _Under("mlflow.db")
    artifacts = _Under("artifacts")
    journal = _Under("optuna.journal")

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root).resolve())

    def __str__(self) -> str:
        return str(self.root)

    def run_folder(self, experiment: str, run_folder_name: str) -> Path:
        """One run's folder: its checkpoints, result and lock."""
        return self.runs / experiment / run_folder_name

    def stable_folder(self, experiment: str, stable_name: str) -> Path:
        """Where a budgeted study keeps one (row, size, seed)'s stable-phase state."""
        return self.runs / experiment / "stable" / stable_name

    def create(self) -> Workspace:
        """The workspace, made if missing and checked writable; one line naming --workspace if not."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(
                dir=self.root, prefix=".write-test-"
            ):  # unique: workers probe at once
                pass
        except OSError as e:
            raise UserError(f"--workspace: cannot write to {self.root}: {e.strerror or e}") from None
        return self
