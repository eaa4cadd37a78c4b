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


@dataclass(frozen=True)
class Workspace:
    """The layout of one workspace folder; `root` is made absolute, so the paths stay right when a child
    process starts elsewhere."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root).resolve())

    def __str__(self) -> str:
        return str(self.root)

    @property
    def runs(self) -> Path:
        return self.root / "runs"

    def run_folder(self, experiment: str, run_folder_name: str) -> Path:
        """One run's folder: its checkpoints, result and lock."""
        return self.runs / experiment / run_folder_name

    def stable_folder(self, experiment: str, stable_name: str) -> Path:
        """Where a budgeted study keeps one (row, size, seed)'s stable-phase state."""
        return self.runs / experiment / "stable" / stable_name

    @property
    def token_cache(self) -> Path:
        return self.root / "cache" / "tokens"

    @property
    def tokenizer_cache(self) -> Path:
        return self.root / "cache" / "tokenizers"

    @property
    def attention_choices(self) -> Path:
        return self.root / "cache" / "attention_choices.json"

    @property
    def kernel_configs(self) -> Path:
        return self.root / "cache" / "kernels"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def slurm(self) -> Path:
        return self.root / "slurm"

    @property
    def mlflow_db(self) -> Path:
        return self.root / "mlflow.db"

    @property
    def artifacts(self) -> Path:
        return self.root / "artifacts"

    @property
    def journal(self) -> Path:
        return self.root / "optuna.journal"

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
