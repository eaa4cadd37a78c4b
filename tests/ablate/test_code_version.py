"""A run's code version: the commit, '+dirty' only for modified tracked code (real git repositories)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from ablate.store.tracking import code_version


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "clone"
    (repo / "ablate").mkdir(parents=True)
    (repo / "reports" / "table6-tiny").mkdir(parents=True)
    (repo / "ablate" / "train.py").write_text("print('train')\n")
    (repo / "reports" / "table6-tiny" / "table.md").write_text("| old |\n")
    _git(repo.parent, "init", "-q", str(repo))
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "first")
    return repo


def test_untracked_files_and_rewritten_reports_do_not_make_a_run_dirty(tmp_path):
    repo = _repo(tmp_path)
    commit = _git(repo, "rev-parse", "--short", "HEAD")
    assert code_version(repo) == commit
    # the quickstart: a virtual environment in the clone, a workspace, then the sweep rewrites its report
    (repo / ".venv" / "lib").mkdir(parents=True)
    (repo / ".venv" / "lib" / "site.py").write_text("x = 1\n")
    (repo / "ablate-runs").mkdir()
    (repo / "reports" / "table6-tiny" / "table.md").write_text("| new |\n")
    assert code_version(repo) == commit
    assert code_version(repo / "ablate") == commit  # asked from inside the package folder


def test_a_modified_tracked_source_file_makes_it_dirty(tmp_path):
    repo = _repo(tmp_path)
    commit = _git(repo, "rev-parse", "--short", "HEAD")
    (repo / "ablate" / "train.py").write_text("print('changed')\n")
    assert code_version(repo) == commit + "+dirty"
    _git(repo, "add", "ablate/train.py")  # staged counts too
    assert code_version(repo) == commit + "+dirty"
