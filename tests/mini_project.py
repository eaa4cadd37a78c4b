"""A miniature recipe and corpus, so real Trainers, Optuna studies and MLflow stores run in seconds, and
the CLI in a fresh interpreter: shared by tests/e2e and tests/scaleout (pytest puts tests/ on the path,
pyproject's `pythonpath`). Not in a conftest.py: importing a conftest by name clashes across folders."""

from __future__ import annotations

import copy
import os
import random
import subprocess
import sys
from pathlib import Path

import yaml

MINI = {
    "name": "mini",
    "seeds": [0],
    "base": {
        "model": {
            "vocab_size": 260,
            "d_model": 32,
            "n_layers": 2,
            "head_dim": 8,
            "attention": {"name": "softmax"},
            "attention_backend": "sdpa",
        },
        "train": {
            "seq_len": 32,
            "batch_tokens": 256,
            "micro_batch_size": 4,
            "steps": 8,
            "lr": 3.0e-3,
            "warmup_steps": 2,
            "val_every": 4,
            "val_batches": 2,
            "log_every": 1,
            "precision": "32-true",
        },
        # a 35K-token corpus that many tests train past one pass of: they test other things than that
        "data": {"source": "CORPUS", "tokenizer": "byte", "val_fraction": 0.2, "repeat": "allow"},
    },
    "variants": {
        "transformer": {"label": "Transformer", "model": {"attention": {"name": "softmax"}}},
        "diff": {"label": "Diff Transformer", "model": {"attention": {"name": "diff"}}},
    },
}


def write_corpus(folder: Path, n_docs: int = 30, seed: int = 0) -> Path:
    """Documents of words from a small vocabulary with repeats, so a model can learn something."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(60)] + ["def", "return", "self", "(", ")", ":", "\n"]
    folder.mkdir(parents=True, exist_ok=True)
    for d in range(n_docs):
        text = " ".join(rng.choice(words[: 20 + d % 40]) for _ in range(400))
        (folder / f"doc{d:03d}.txt").write_text(text)
    return folder


def write_recipe(folder: Path, filename: str = "mini.yaml", **changes) -> Path:
    """MINI with `a__b__c=value` changes, its corpus in `folder/corpus`."""
    recipe = copy.deepcopy(MINI)  # keeps the variants' order: the first is the reference row
    recipe["base"]["data"]["source"] = str(write_corpus(folder / "corpus"))
    for dotted, value in changes.items():
        node = recipe
        *parents, last = dotted.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    path = folder / filename
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def sweep_argv(recipe: Path, folder: Path, *extra: str) -> list[str]:
    """`ablate sweep RECIPE --yes` with its workspace (`folder/ws`) and reports (`folder/rep`) in `folder`."""
    return [
        "sweep",
        str(recipe),
        "--yes",
        "--workspace",
        str(folder / "ws"),
        "--reports",
        str(folder / "rep"),
        *extra,
    ]


def cli_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "ablate.cli", *args]


def run_cli(
    *args: str, cwd: Path, timeout: float = 300, check: bool = False, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`ablate ARGS` in a fresh interpreter, as a user runs it (`env`: default this one's, unbuffered)."""
    env = env or {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        cli_command(*args), cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"ablate {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def run_cli_here(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`ablate ARGS` run in `cwd` in this interpreter (`ablate.cli.main`): a verb's whole path without a
    fresh interpreter's seconds of imports; what run_cli returns, stdout and stderr captured."""
    import contextlib
    import io

    from ablate.cli import main

    out, err, before = io.StringIO(), io.StringIO(), os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(args))
    finally:
        os.chdir(before)
    return subprocess.CompletedProcess(["ablate", *args], code, out.getvalue(), err.getvalue())


def one_line_refusal(capsys, code: int, *fragments: str) -> str:
    """The verb's exit `code` is 2 and what it wrote to stderr (read from `capsys`) is one line, no
    traceback, naming every fragment: that line."""
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for fragment in fragments:
        assert fragment in err, err
    return err
