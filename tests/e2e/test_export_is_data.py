"""An export is data all the way down (ablate.store.export): `--from` imports nothing, whatever recipe the
export names, and every malformed or oversized field of a crafted export is one line.

Each test rewrites a copy of `exported-mini/` (a two-run study of the mini recipe kept as a fixture) under
tmp_path and runs the real CLI on it: no workspace, no store. A crafted export ends in one line and exit 2,
with nothing written or lost in its folder.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from exported_mini import FIXTURE, copy_export, edit_column, edit_meta, edit_runs, files_under, one_line
from mini_project import run_cli, run_cli_here


def _recipe_beside_the_export(tmp_path: Path, folder: Path, marker: Path) -> None:
    """A recipe inside the export's own folder that imports a module beside it, which writes `marker`."""
    recipe = (FIXTURE / "mini.yaml").read_text()
    (folder / "evil.yaml").write_text("imports: [payload]\n" + recipe)
    (folder / "payload.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    (tmp_path / "payload.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")  # on sys.path under -m
    edit_meta(folder, lambda m: m["report"].update(recipe="reports/mini/evil.yaml"))


def test_report_from_imports_nothing_the_named_recipe_lists(tmp_path):
    folder = copy_export(tmp_path)
    marker = tmp_path / "payload-ran"
    _recipe_beside_the_export(tmp_path, folder, marker)
    before = files_under(tmp_path)
    one_line(
        run_cli_here("report", "--from", "reports/mini/", cwd=tmp_path), "--from:", "evil.yaml", "imports"
    )
    assert not marker.exists() and files_under(tmp_path) == before


def test_report_from_under_python_m_from_the_folders_parent_runs_no_module_beside_it(tmp_path):
    folder = copy_export(tmp_path)
    marker = tmp_path / "payload-ran"
    _recipe_beside_the_export(tmp_path, folder, marker)
    before = files_under(tmp_path)
    one_line(run_cli("report", "--from", "reports/mini/", cwd=tmp_path), "--from:", "imports")
    assert not marker.exists() and files_under(tmp_path) == before


def test_a_recipe_naming_a_class_path_is_refused_from_an_export(tmp_path):
    folder = copy_export(tmp_path)
    recipe = (FIXTURE / "mini.yaml").read_text().replace("name: softmax", "class_path: payload.Attention")
    assert "class_path" in recipe
    (tmp_path / "mini.yaml").write_text(recipe)
    before = files_under(tmp_path)
    one_line(
        run_cli_here("report", "--from", "reports/mini/", cwd=tmp_path),
        "mini.yaml",
        "model.attention.class_path",
    )
    assert files_under(tmp_path) == before and folder.is_dir()


def _trial(meta: dict, **fields) -> None:
    meta["trials"][0].update(fields)


CRAFTED = {
    "state-bogus": (lambda m: _trial(m, state="BOGUS"), "trials[0].state"),
    "bad-date": (lambda m: _trial(m, start="yesterday"), "trials[0].start"),
    "user-attrs-list": (lambda m: _trial(m, user_attrs=[1, 2]), "trials[0].user_attrs"),
    "missing-run-id": (
        lambda m: m["trials"][0]["user_attrs"].update(mlflow_run_id="0" * 32),
        "0" * 32,
    ),
    "trials-string": (lambda m: m.update(trials="many"), "trials is str"),
    "params-without-distributions": (lambda m: _trial(m, params={"x": 1}), "trials[0].distributions"),
    "study-attrs-list": (lambda m: m.update(user_attrs=[]), "user_attrs"),
    "too-many-trials": (lambda m: m.update(trials=m["trials"] * 60_000), "more than 100,000"),
}


@pytest.mark.parametrize("edit, fragment", CRAFTED.values(), ids=CRAFTED.keys())
def test_a_crafted_study_in_an_export_is_one_line(tmp_path, edit, fragment):
    folder = copy_export(tmp_path)
    edit_meta(folder, edit)
    before = files_under(tmp_path)
    one_line(run_cli_here("report", "--from", "reports/mini/", cwd=tmp_path), "--from:", fragment)
    assert files_under(tmp_path) == before


FIT = {"form": "grid", "bootstrap": 1000, "seed": 0, "params_count": "non_embedding"}
CRAFTED_FIT = {
    "seed-missing": ({k: v for k, v in FIT.items() if k != "seed"}, "fit.seed"),
    "bootstrap-fraction": ({**FIT, "bootstrap": 1.5}, "fit.bootstrap"),
    "bootstrap-string": ({**FIT, "bootstrap": "1000"}, "fit.bootstrap"),
    "bootstrap-huge": ({**FIT, "bootstrap": 10**30}, "fit.bootstrap"),
    "bootstrap-million": ({**FIT, "bootstrap": 10**6}, "outside 0 to 100,000"),
}


@pytest.mark.parametrize("fit, fragment", CRAFTED_FIT.values(), ids=CRAFTED_FIT.keys())
def test_a_crafted_fit_setting_is_one_line_before_any_resample(tmp_path, fit, fragment):
    folder = copy_export(tmp_path)
    edit_meta(folder, lambda m: m["report"].update(fit=fit))
    before = files_under(tmp_path)
    one_line(run_cli_here("fit", "--from", "reports/mini/", cwd=tmp_path), "--from:", fragment)
    assert files_under(tmp_path) == before


def _spec_beside_the_export(folder: Path, marker: Path, space: str) -> None:
    """A search spec inside the export's folder whose searched values name a class in a module beside it
    (`payload.py`, which writes `marker` when imported), and the export's settings naming that spec."""
    (folder / "payload.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\nclass Attention: pass\n")
    (folder / "spec.yaml").write_text(f"name: evil\nspace:\n  {space}\n")
    edit_meta(folder, lambda m: m["report"].update(search="reports/mini/spec.yaml"))


SPECS = {
    "class-path-value": (
        "base.model.attention: {values: [{class_path: reports.mini.payload.Attention}]}",
        "space.base.model.attention.values[0].class_path",
    ),
    "class-path-dotted-key": (
        "base.model.attention.class_path: {values: [reports.mini.payload.Attention]}",
        "space.base.model.attention.class_path",
    ),
}


@pytest.mark.parametrize("space, key", SPECS.values(), ids=SPECS.keys())
def test_a_search_spec_naming_code_is_refused_under_python_m_from_the_folders_parent(tmp_path, space, key):
    """`python -m ablate.cli` puts the current folder on sys.path: `reports.mini.payload` would import."""
    folder = copy_export(tmp_path)
    marker = tmp_path / "payload-ran"
    _spec_beside_the_export(folder, marker, space)
    before = files_under(tmp_path)
    proc = run_cli("report", "--from", "reports/mini/", cwd=tmp_path)
    one_line(proc, "--from:", "search spec", "spec.yaml", key)
    assert not marker.exists() and files_under(tmp_path) == before


def test_a_search_spec_naming_a_module_of_the_standard_library_imports_nothing(tmp_path):
    folder = copy_export(tmp_path)
    (folder / "spec.yaml").write_text("space:\n  base.model.attention: {values: [{class_path: this.Zen}]}\n")
    edit_meta(folder, lambda m: m["report"].update(search="reports/mini/spec.yaml"))
    before = files_under(tmp_path)
    proc = run_cli("report", "--from", "reports/mini/", cwd=tmp_path)
    one_line(proc, "--from:", "class_path")
    assert "Beautiful is better than ugly" not in proc.stdout + proc.stderr  # `import this` prints it
    assert files_under(tmp_path) == before


def test_a_grid_fits_export_reads_its_recipe_through_the_same_check(tmp_path):
    folder = copy_export(tmp_path)
    marker = tmp_path / "payload-ran"
    _recipe_beside_the_export(tmp_path, folder, marker)
    edit_meta(folder, lambda m: m["report"].update(fit=FIT))
    before = files_under(tmp_path)
    one_line(run_cli_here("fit", "--from", "reports/mini/", cwd=tmp_path), "--from:", "evil.yaml", "imports")
    assert not marker.exists() and files_under(tmp_path) == before


def test_while_an_export_is_read_no_module_path_is_resolved_whatever_names_it(tmp_path):
    """The registry's refusal `ablate.store.export.reading` holds: a spec's class_path and an `imports:`
    module are one line, not an import, even where no file check saw them; registered names still build."""
    import sys

    from ablate.core import registry
    from ablate.core.errors import UserError

    (tmp_path / "payload_never.py").write_text("raise SystemExit('imported')\n")
    sys.path.insert(0, str(tmp_path))
    try:
        with registry.importing_nothing("an export is data"):
            with pytest.raises(UserError, match=r"model.attention.class_path: 'payload_never.A' is not imp"):
                registry.build("attention", {"class_path": "payload_never.A"}, key="model.attention")
            with pytest.raises(UserError, match=r"imports: 'payload_never' is not imported: an export is"):
                registry.load_plugins(["payload_never"])
            assert registry.get("attention", "softmax") is not None
        assert "payload_never" not in sys.modules
        with pytest.raises(SystemExit, match="imported"):  # outside the block, the same spec imports
            registry.load_plugins(["payload_never"])
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("payload_never", None)


def _plan(plan: str):
    """An edit of the export: every trial's plan set to `plan`."""

    def edit(meta: dict) -> None:
        for trial in meta["trials"]:
            trial["user_attrs"]["plan"] = plan

    return lambda folder: edit_meta(folder, edit)


def _run_field(column: str, key: str, value):
    """An edit of the export: every run's `key` in `column` set to `value`."""
    return lambda folder: edit_runs(folder, lambda rows: edit_column(rows, column, key, value))


def _without_values(folder: Path) -> None:
    import pyarrow.parquet as pq

    table = pq.read_table(folder / "metrics.parquet")
    pq.write_table(table.drop(["value"]), folder / "metrics.parquet")


def _values_as_text(folder: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(folder / "metrics.parquet")
    values = pa.array([str(v) for v in table.column("value").to_pylist()], pa.string())
    pq.write_table(table.set_column(3, "value", values), folder / "metrics.parquet")


CRAFTED_FIELDS = {  # each field of an export a report reads, crafted: (edit of the folder, the line's words)
    "plan-not-json": (_plan("{seed: 0"), "trials[0].user_attrs.plan is '{seed: 0', not a JSON object"),
    "plan-a-list": (_plan("[0, 1]"), "user_attrs.plan is '[0, 1]'"),
    "plan-a-number": (_plan("7"), "user_attrs.plan is '7', not a JSON"),
    "plan-seed-text": (_plan('{"seed": "zero"}'), "user_attrs.plan.seed is 'zero', not an integer"),
    "tokens-lots": (
        _run_field("tags", "ablate.tokens", "lots"),
        "tags.ablate.tokens is 'lots', not an integer (as text)",
    ),
    "data-json-not-json": (
        _run_field("artifacts", "data.json", "{vocab"),
        "artifacts.data.json is '{vocab', not a JSON object",
    ),
    "data-json-a-list": (
        _run_field("artifacts", "data.json", "[]"),
        "artifacts.data.json is '[]', not a JSON object",
    ),
    "metric-text": (_run_field("metrics", "val/loss", "low"), "metrics.val/loss is 'low', not a number"),
    "lr-a-list": (
        _run_field("params", "train.lr", [0.1]),
        "params.train.lr is [0.1], not a number (as text)",
    ),
    "metrics-without-values": (_without_values, "metrics.parquet has no column 'value'"),
    "metrics-values-text": (_values_as_text, "column 'value' holds string, not floating-point numbers"),
    "readme-not-utf8": (
        lambda f: (f / "README.md").write_bytes(b"# How this report was made\n\xff\xfe notes\n"),
        "README.md: '",
    ),
}


@pytest.mark.parametrize("edit, fragment", CRAFTED_FIELDS.values(), ids=CRAFTED_FIELDS.keys())
def test_every_field_of_an_export_is_read_through_its_kind(tmp_path, edit, fragment):
    """One line naming the file and the field, exit 2; nothing in the checkout written or lost."""
    folder = copy_export(tmp_path)
    edit(folder)
    before = files_under(tmp_path)
    proc = run_cli_here("report", "--from", "reports/mini/", cwd=tmp_path)
    one_line(proc, fragment)
    assert "runs.parquet" in proc.stderr or "metrics.parquet" in proc.stderr or "README.md" in proc.stderr
    assert files_under(tmp_path) == before


def test_a_readme_that_is_not_utf8_is_named_where_it_lies(tmp_path):
    folder = copy_export(tmp_path)
    (folder / "README.md").write_bytes(b"# How this report was made\n\xff notes\n")
    before = files_under(tmp_path)
    proc = run_cli_here("report", "--from", "reports/mini/", cwd=tmp_path)
    one_line(proc, f"{folder / 'README.md'}' is not UTF-8 text (byte 27)")
    assert files_under(tmp_path) == before


@pytest.mark.parametrize(
    "data", [bytes(range(256)) * 4, b"fit,quantity\n\x00\x01,\xc3\n"], ids=["bytes", "nul"]
)
def test_fit_from_with_a_compared_siblings_csv_made_of_bytes_is_one_line(tmp_path, data):
    folder = copy_export(tmp_path)
    other = tmp_path / "reports" / "other"
    other.mkdir()
    (other / "ratios.csv").write_bytes(data)
    (other / "points.csv").write_text("arch,size,seed,params,tokens,passes,loss\n")
    edit_meta(folder, lambda m: m["report"].update(fit={**FIT, "compare_with": "reports/other"}))
    before = files_under(tmp_path)
    proc = run_cli_here("fit", "--from", "reports/mini/", cwd=tmp_path)
    one_line(proc, "--compare-with: 'reports/other/ratios.csv'")
    assert files_under(tmp_path) == before


def test_every_committed_export_reads_through_the_typed_reader():
    """The kinds are those ablate writes: every export under reports/ reads back whole."""
    from ablate.store.export import ExportedRuns, exported_study, has_export

    root = FIXTURE.parents[2] / "reports"
    folders = sorted({p.parent for p in root.rglob("runs.parquet") if has_export(p.parent)})
    assert len(folders) >= 5
    for folder in folders:
        ExportedRuns(folder)
        exported_study(folder)
