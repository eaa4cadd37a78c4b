"""A report folder is written as a whole (ablate.report.folder), from an export that is data, never code
(ablate.store.export_checks.check_settings), with a stored command that names no password and keeps its quoting.

Each test rebuilds `exported-mini/` (a two-run study of the mini recipe kept as a fixture) with the real CLI
(`ablate.cli.main`; in fresh interpreters where they are killed), in a copy under tmp_path: no workspace, no
store.
"""

from __future__ import annotations

import os
import random
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from exported_mini import FIXTURE, copy_export, edit_meta, files_under, one_line
from mini_project import cli_command, run_cli, run_cli_here


def _report_here(tmp_path: Path) -> subprocess.CompletedProcess:
    """`ablate report --from reports/mini/` run in `tmp_path`, in this interpreter (the verb's whole path:
    the killed-report test below runs it in fresh ones)."""
    return run_cli_here("report", "--from", "reports/mini/", cwd=tmp_path)


def _report_in_a_fresh_interpreter(tmp_path: Path) -> subprocess.CompletedProcess:
    return run_cli("report", "--from", "reports/mini/", cwd=tmp_path)


# --- trust: an export is data ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "edit, fragment",
    [
        (lambda m: m["report"].update(overrides=[["data.task", {"class_path": "os.system"}]]), "base.*"),
        (lambda m: m["report"].update(overrides=[["base.data.task", {"class_path": "os.system"}]]), "plain"),
        (
            lambda m: m["report"].update(overrides=[["base.model.attention.class_path", "os.system"]]),
            "imports",
        ),
        (lambda m: m["report"].update(recipe="/etc/mini.yaml"), "relative path"),
        (lambda m: m["report"].update(recipe="../mini.yaml"), "relative path"),
        (lambda m: m["report"].update(fit={"form": "grid", "compare_with": "/etc"}), "fit.compare_with"),
        (lambda m: m["report"].update(compare_with=["reports/x", "../elsewhere"]), "report.compare_with"),
        (lambda m: m["report"].update(compare_with="reports/x"), "report.compare_with"),
    ],
    ids=[
        "key-outside-base",
        "class-path-value",
        "class-path-key",
        "absolute-recipe",
        "dotdot-recipe",
        "absolute-compared-grid",
        "dotdot-compared-folder",
        "compared-folders-not-a-list",
    ],
)
def test_report_from_an_export_that_would_run_code_is_one_line(tmp_path, edit, fragment):
    folder = copy_export(tmp_path)
    edit_meta(folder, edit)
    before = files_under(tmp_path)
    proc = _report_here(tmp_path)
    one_line(proc, "--from:", "runs.parquet", fragment)
    assert files_under(tmp_path) == before  # nothing written, nothing lost


def test_report_from_a_truncated_export_is_one_line(tmp_path):
    folder = copy_export(tmp_path)
    runs = folder / "runs.parquet"
    runs.write_bytes(runs.read_bytes()[: runs.stat().st_size // 2])
    before = files_under(tmp_path)
    one_line(_report_here(tmp_path), "runs.parquet", "cannot be read", "git checkout")
    assert files_under(tmp_path) == before


# --- secrets and quoting of the stored command ----------------------------------------------------------
def test_the_stored_command_names_no_password_and_keeps_its_quoting(tmp_path):
    folder = copy_export(tmp_path)
    typed = [
        "sweep",
        "mini.yaml",
        "--reports",
        "rep o'brien",
        "--storage",
        "postgresql://alice:s3cret@db.example:5432/optuna",
        "--tracking-uri",
        "http://bob:hunter2@mlflow.example:5000",
    ]
    edit_meta(folder, lambda m: m["user_attrs"].update(command=shlex.join(["ablate", *typed])))
    proc = _report_here(tmp_path)
    assert proc.returncode == 0, proc.stderr
    readme = (folder / "README.md").read_text()
    assert "s3cret" not in readme and "hunter2" not in readme
    line = next(x for x in readme.splitlines() if x.startswith("- command: `"))
    words = shlex.split(line[len("- command: `") : -1])
    assert words[words.index("--reports") + 1] == "rep o'brien"  # quoted and parsed back the same
    assert words[words.index("--storage") + 1] == "postgresql://alice:***@db.example:5432/optuna"
    assert words[words.index("--tracking-uri") + 1] == "http://bob:***@mlflow.example:5000"


def test_a_command_stored_unquoted_by_an_older_version_still_reports(tmp_path):
    folder = copy_export(tmp_path)
    edit_meta(
        folder, lambda m: m["user_attrs"].update(command="ablate sweep mini.yaml --reports rep o'brien")
    )
    proc = _report_here(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "No closing quotation" not in proc.stderr


# --- links and hand-written text ------------------------------------------------------------------------
def test_a_link_inside_the_report_folder_is_refused_and_nothing_is_written_through_it(tmp_path):
    folder = copy_export(tmp_path)
    outside = tmp_path / "outside.md"
    outside.write_text("not the report's\n")
    (folder / "table.md").unlink()
    (folder / "table.md").symlink_to(outside)
    before = files_under(tmp_path)
    one_line(_report_here(tmp_path), "table.md", "is a link")
    assert outside.read_text() == "not the report's\n" and files_under(tmp_path) == before


def test_hand_written_text_under_any_heading_level_is_kept(tmp_path):
    folder = copy_export(tmp_path)
    readme = folder / "README.md"
    notes = "## My reading\n\nDiff wins here by 0.04 nats, one seed.\n\n### Caveat\n\nOne seed.\n"
    readme.write_text(readme.read_text() + "\n" + notes)
    proc = _report_here(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert readme.read_text().endswith("\n" + notes) and readme.read_text().count("## My reading") == 1
    committed = (FIXTURE / "reports" / "mini" / "README.md").read_text()
    assert readme.read_text() == committed + "\n" + notes


# --- written as a whole: killed at random points --------------------------------------------------------
@pytest.mark.slow
def test_a_report_killed_while_it_writes_leaves_the_old_folder_or_the_new_one(tmp_path):
    """10 times: `ablate report --from` is killed (SIGKILL) at a random point of the later half of its run
    (the first half is the interpreter's start and the export's reading: the writing folder appeared at
    48% and 53% of two runs on a busy 2-core AMD EPYC, before which nothing is written); the
    folder is then byte for byte the old one or the new one. The old folder differs from the new one in a file the
    report rewrites (table.md) and keeps a person's notes, so a half-written folder shows."""
    folder = copy_export(tmp_path)
    (folder / "table.md").write_text("an older table\n")
    readme = folder / "README.md"
    readme.write_text(readme.read_text() + "\n## Notes\n\nWritten by hand.\n")
    pristine = tmp_path / "pristine"
    shutil.copytree(tmp_path / "reports", pristine / "reports")
    old = files_under(folder)
    started = time.monotonic()
    proc = _report_in_a_fresh_interpreter(tmp_path)
    full = time.monotonic() - started  # how long a run takes here: the kills are spread over it
    assert proc.returncode == 0, proc.stderr
    new = files_under(folder)
    assert new != old and new["README.md"].endswith(b"## Notes\n\nWritten by hand.\n")
    rng = random.Random(0)
    outcomes = []
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for _ in range(10):
        shutil.rmtree(tmp_path / "reports")
        shutil.copytree(pristine / "reports", tmp_path / "reports", symlinks=True)
        child = subprocess.Popen(
            cli_command("report", "--from", "reports/mini/"),
            cwd=tmp_path,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(rng.uniform(0.5, 1.05) * full)
        child.send_signal(signal.SIGKILL)
        child.wait()
        now = files_under(folder)
        assert now in (old, new), sorted(k for k in set(now) | set(old) if now.get(k) != old.get(k))
        outcomes.append("new" if now == new else "old")
        leftovers = [p.name for p in (tmp_path / "reports").iterdir() if p.name != "mini"]
        assert all(name.startswith(".mini.writing-") for name in leftovers), leftovers
    # a run after the kills clears what a killed one left beside the folder, and writes the new one
    assert _report_in_a_fresh_interpreter(tmp_path).returncode == 0
    assert files_under(folder) == new and [p.name for p in (tmp_path / "reports").iterdir()] == ["mini"]
    print(f"kills: {outcomes.count('old')} left the old folder, {outcomes.count('new')} the new one")


def test_fit_out_with_a_link_inside_is_refused_and_nothing_is_written_through_it(tmp_path, capsys):
    """`ablate fit --out FOLDER` writes FOLDER as a whole too: a link in it is one line, its target untouched."""
    from ablate.cli import main

    points = tmp_path / "points.csv"
    points.write_text(
        "params,tokens,loss\n"
        + "".join(f"{n:.0f},1e9,{2.0 + 10 * n**-0.3:.6f}\n" for n in (1e6, 3e6, 1e7, 3e7))
    )
    out, outside = tmp_path / "out", tmp_path / "elsewhere.md"
    out.mkdir()
    outside.write_text("a file of someone else's\n")
    (out / "fit.md").symlink_to(outside)
    assert main(["fit", "--csv", str(points), "--form", "size", "--out", str(out), "--bootstrap", "5"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is a link" in err and err.startswith("ablate: error: --out:"), err
    assert outside.read_text() == "a file of someone else's\n"
    assert sorted(p.name for p in out.iterdir()) == ["fit.md"]
    (out / "fit.md").unlink()  # without the link, the same command writes the folder
    assert main(["fit", "--csv", str(points), "--form", "size", "--out", str(out), "--bootstrap", "5"]) == 0
    assert {"fit.json", "fit.md", "loss_vs_params.png"} <= {p.name for p in out.iterdir()}
