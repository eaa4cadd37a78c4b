"""Damaged state that can be rebuilt is rebuilt, said in a line, and nothing earlier is lost: a truncated
`last.ckpt` (resume from the best checkpoint, or from step 0), an unreadable `result.json` (written again
from the finished run's last checkpoint), a truncated cached BPE tokenizer (trained again). Real runs of the
mini recipe in a workspace under tmp_path."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as L
import pytest
from mini_project import write_corpus, write_recipe

from ablate.core.workspace import Workspace
from ablate.data.tokenizers import bpe_cache_path, get_tokenizer
from ablate.recipe.loading import load_recipe
from ablate.store.stores import Stores
from ablate.train.run import train_run


def _run(recipe_path: Path, steps: int = 8):
    overrides = [("base.train.steps", steps)]
    (run,) = load_recipe(recipe_path, overrides).resolve(None, seeds=[0], variants=["transformer"])
    return run


class Killed(RuntimeError):
    pass


class _KillAfter(L.Callback):
    """Ends training as a kill would, after optimizer step `step` (the checkpoints of step 4 are on disk)."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step >= self.step:
            raise Killed(f"killed after step {trainer.global_step}")


def _killed_at_step_5(tmp_path: Path) -> tuple[Path, Stores, Path]:
    """The mini recipe's run in tmp_path/ws killed after step 5: the recipe, the stores, its checkpoints."""
    recipe = write_recipe(tmp_path)
    workspace = tmp_path / "ws"
    stores = Stores(workspace)
    with pytest.raises(Killed):
        train_run(_run(recipe), stores, progress=False, callbacks=[_KillAfter(5)])
    return recipe, stores, next(workspace.rglob("checkpoints"))


def test_a_truncated_last_checkpoint_resumes_from_the_best_one_or_from_the_start(tmp_path, capsys):
    recipe, stores, checkpoints = _killed_at_step_5(tmp_path)
    last = checkpoints / "last.ckpt"
    whole = last.read_bytes()
    last.write_bytes(whole[: len(whole) // 3])  # a kill or a full disk while it was written
    capsys.readouterr()
    result = train_run(_run(recipe), stores, progress=False)
    out = capsys.readouterr().out
    assert result.steps == 8 and result.status == "finished"
    assert "last.ckpt cannot be read" in out and "resuming from its best checkpoint" in out
    assert (checkpoints / "last.ckpt.unreadable").read_bytes() == whole[: len(whole) // 3]  # kept, not lost


def test_both_checkpoints_unreadable_resume_from_step_0(tmp_path, capsys):
    recipe, stores, checkpoints = _killed_at_step_5(tmp_path)
    for name in ("last.ckpt", "best.ckpt"):
        (checkpoints / name).write_bytes(b"not a checkpoint")
    capsys.readouterr()
    result = train_run(_run(recipe), stores, progress=False)
    out = capsys.readouterr().out
    assert result.steps == 8 and "resuming from step 0" in out
    assert result.history[0]["step"] <= 4  # trained again from the start: validations before step 4 again


def test_an_unreadable_result_is_written_again_from_the_finished_run(tmp_path, capsys):
    recipe = write_recipe(tmp_path)
    workspace = tmp_path / "ws"
    stores = Stores(workspace)
    first = train_run(_run(recipe), stores, progress=False)
    result_file = next(workspace.rglob("result.json"))
    result_file.write_text('{"val_loss": 4.1, "ste')  # damaged
    capsys.readouterr()
    again = train_run(_run(recipe), stores, progress=False)
    out = capsys.readouterr().out
    assert "result.json cannot be read" in out and again.steps == 8
    assert abs(again.val_loss - first.val_loss) < 1e-5  # the same final validation, from the last checkpoint
    assert (result_file.parent / "result.json.unreadable").read_text() == '{"val_loss": 4.1, "ste'
    assert '"val_loss"' in result_file.read_text()  # written again, whole


def test_a_truncated_cached_tokenizer_is_trained_again(tmp_path, capsys):
    corpus = write_corpus(tmp_path / "corpus", n_docs=5)
    docs = [p.read_text() for p in sorted(corpus.iterdir())]
    spec = {"name": "bpe", "vocab_size": 300}
    fingerprint = {"corpus": "five docs"}
    workspace = tmp_path / "ws"
    first = get_tokenizer(
        spec, workspace=Workspace(workspace), fingerprint=fingerprint, train_documents=lambda: docs
    )
    path = bpe_cache_path(Workspace(workspace), fingerprint, 300)
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])
    again = get_tokenizer(
        spec, workspace=Workspace(workspace), fingerprint=fingerprint, train_documents=lambda: docs
    )
    assert "cannot be read" in capsys.readouterr().out
    assert path.read_bytes() == whole  # rebuilt, the same file
    assert list(again.encode(docs[0])) == list(first.encode(docs[0]))
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # nothing else left beside it
