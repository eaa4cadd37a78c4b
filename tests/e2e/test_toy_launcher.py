"""A new launcher is one module and one line of `ablate.sweep.launchers.LAUNCHERS`: a toy one, written here
as a user would, runs a real sweep's trials through the same interface as `local` and `slurm`."""

from __future__ import annotations

import sys
import textwrap

from mini_project import sweep_argv, write_recipe

import ablate.sweep.launchers
from ablate.cli import main

TOY = '''
"""A toy launcher: the sweep's own process trains, and says so."""

from ablate.sweep.worker import work


def start(ctx, workers, *, overrides_argv, wait=False, after_trial=None):
    def run(study, storage):
        print(f"[toy] {workers} worker(s) asked; training here", flush=True)
        work(ctx, study, storage, after_trial=after_trial)
        return True

    return run
'''


def test_a_toy_launcher_is_a_module_and_a_table_line(tmp_path, monkeypatch, capsys):
    (tmp_path / "toy_launcher.py").write_text(textwrap.dedent(TOY))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(ablate.sweep.launchers.LAUNCHERS, "toy", "toy_launcher")  # the one line
    recipe = write_recipe(tmp_path)
    assert main(sweep_argv(recipe, tmp_path, "--launcher", "toy")) == 0
    out = capsys.readouterr().out
    assert "[toy] 1 worker(s) asked; training here" in out
    assert (tmp_path / "rep" / "mini" / "table.md").exists()
    sys.modules.pop("toy_launcher", None)
    # a name the table does not hold: one line with the ones it does
    assert main(sweep_argv(recipe, tmp_path, "--launcher", "toi")) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err
        == "ablate: error: --launcher: unknown launcher 'toi' (did you mean 'toy'?); launchers: local, slurm, toy"
    )
