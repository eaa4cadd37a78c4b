"""No link is followed where a report folder is written (ablate.report.folder), the siblings a recovery
renames included: a link planted as `.NAME.old-PID` or `.NAME.writing-PID` (PID a process that is gone)
beside a report folder that does not exist yet is one line; nothing of its target is read, renamed into
place, copied or uploaded to the sweep's MLflow run. The real `ablate report` of a finished mini sweep
(the session's `finished_sweep`), in this process."""

from __future__ import annotations

import subprocess
import sys

import pytest
from exported_mini import files_under
from mini_project import one_line_refusal

from ablate.cli import main
from ablate.report import folder as report_folder
from ablate.store.stores import Stores


def _gone_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _uploaded(workspace) -> set[str]:
    """Every artifact path under `report/` of the sweep's MLflow runs."""
    client = Stores(workspace).client()
    paths = set()
    for run in client.search_runs([e.experiment_id for e in client.search_experiments()]):
        for item in client.list_artifacts(run.info.run_id, "report"):
            paths.add(item.path)
    return paths


@pytest.mark.parametrize("kind", ["old", "writing"])
def test_a_link_planted_beside_a_new_report_folder_is_refused_and_its_target_never_read(
    finished_sweep, tmp_path, capsys, kind
):
    (recipe,) = finished_sweep.parent.glob("*.yaml")
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "secret.txt").write_text("not the report's\n")
    (target / "table.md").write_text("a planted table\n")
    reports = tmp_path / "rep"
    reports.mkdir()
    link = reports / f".mini{report_folder.OLD if kind == 'old' else report_folder.WRITING}{_gone_pid()}"
    link.symlink_to(target, target_is_directory=True)
    before, uploaded = files_under(target), _uploaded(finished_sweep)
    capsys.readouterr()
    code = main(["report", str(recipe), "--workspace", str(finished_sweep), "--reports", str(reports)])
    one_line_refusal(capsys, code, str(link), "is a link", str(target))
    assert sorted(p.name for p in reports.iterdir()) == [link.name] and link.is_symlink()  # nothing moved
    assert link.readlink() == target and files_under(target) == before
    assert _uploaded(finished_sweep) == uploaded and not any("secret" in p for p in uploaded)


def test_the_copy_of_a_folder_that_became_a_link_is_refused_not_read(tmp_path):
    """The race the checks alone leave: the folder replaced by a link after `refuse_links` looked and
    before the copy. The copy reads through a descriptor opened without following a link: refused."""
    from ablate.core.errors import UserError

    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "secret.txt").write_text("not the report's\n")
    folder = tmp_path / "rep" / "mini"
    folder.parent.mkdir()
    folder.symlink_to(target, target_is_directory=True)
    new = tmp_path / "rep" / ".mini.writing-1"
    with pytest.raises(UserError, match="is a link"):
        report_folder._copy(folder, new, "ablate report")
    assert not new.exists() and sorted(p.name for p in target.iterdir()) == ["secret.txt"]
