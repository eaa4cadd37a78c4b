"""`ablate report --from reports/NAME/` (`ablate fit --from` for a grid fit's folder) rebuilds a committed
report folder from its export alone.

Each committed folder with an export (`runs.parquet`, `metrics.parquet`: ablate.store.export) is copied,
with the recipes it names, into an empty folder with no workspace and no store, and rewritten there by the
CLI in a fresh interpreter: every file must come back byte-identical (on the BLAS kernels the folders were
made on; elsewhere within what a fit may move by: `_assert_rebuilt`), and nothing else may appear (no
workspace, no store). So is `exported-mini/` beside this file, a two-run study of the mini recipe kept as
a fixture, so the rebuild is tested whichever report folders have an export.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from mini_project import run_cli

from ablate.cli import main
from ablate.recipe.search import load_search_spec
from ablate.report.compare_runs import output_name
from ablate.store.export import has_export, read_meta

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).resolve().parent / "exported-mini"
EXPORTED = [(FIXTURE, "mini")] + [
    (ROOT, p.name) for p in sorted((ROOT / "reports").iterdir()) if p.is_dir() and has_export(p)
]


INPUTS = ("runs.parquet", "metrics.parquet", "README.md")  # the export and the README's hand-written part
PREDICTIONS = ("predictions.csv", "claims.csv")  # written before the runs: inputs its README names as such


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# The OpenBLAS kernels (threadpoolctl's `architecture`) the committed folders' fits ran on. L-BFGS-B calls
# BLAS, so under other kernels (another CPU, or `OPENBLAS_CORETYPE` set) a fit ends a few ulps apart; most
# values then move in their 6th digit, but a bootstrap interval of a fit with a parameter at its bound, or
# of an extrapolation, moves by up to a few percent (2.4% the most, measured on every committed folder).
MADE_ON = "SkylakeX"
NUMBER = re.compile(rb"-?\d+(?:\.(\d+))?(?:[eE][-+]?\d+)?")
RELATIVE, UNITS, PIXELS = 0.05, 3, 0.01  # what a fit may move by under other kernels


def _blas_kernels() -> str | None:
    from threadpoolctl import threadpool_info

    return next(
        (i.get("architecture") for i in threadpool_info() if i.get("internal_api") == "openblas"), None
    )


def _text_moved(rebuilt: bytes, committed: bytes) -> str | None:
    """None when the two texts are the same but for numbers, each within UNITS of its last printed digit
    or RELATIVE of its value; else what differs."""
    if NUMBER.sub(b"#", rebuilt) != NUMBER.sub(b"#", committed):
        return "its text (not only its numbers) differs"
    for new, old in zip(NUMBER.finditer(rebuilt), NUMBER.finditer(committed), strict=True):
        a, b = float(new.group()), float(old.group())
        unit = 0.0 if b"e" in old.group().lower() else 10.0 ** -len(old.group(1) or b"")
        if abs(a - b) > max(UNITS * unit, RELATIVE * abs(b)):
            return f"{new.group().decode()} where it was {old.group().decode()}"
    return None


def _pixels_moved(rebuilt: bytes, committed: bytes) -> str | None:
    """None when the two plots have one size and at most PIXELS of their pixels differ; else how much."""
    import io

    from matplotlib.image import imread

    new, old = imread(io.BytesIO(rebuilt)), imread(io.BytesIO(committed))
    if new.shape != old.shape:
        return f"it is {new.shape} pixels where it was {old.shape}"
    moved = float((abs(new - old).max(axis=-1) > 0).mean())
    return None if moved <= PIXELS else f"{moved:.2%} of its pixels differ"


def _assert_rebuilt(copy: Path, committed: Path) -> None:
    """Byte for byte on the kernels the folder was made on; elsewhere the same files, each within what a
    fit may move by."""
    rebuilt, expected = _tree(copy), _tree(committed)
    if _blas_kernels() == MADE_ON:
        assert rebuilt == expected
        return
    assert sorted(rebuilt) == sorted(expected)
    for name, data in expected.items():
        if rebuilt[name] != data:
            why = (_pixels_moved if name.endswith(".png") else _text_moved)(rebuilt[name], data)
            assert why is None, f"{name} (OpenBLAS {_blas_kernels()}, made on {MADE_ON}): {why}"


@pytest.mark.slow
@pytest.mark.parametrize("root, name", EXPORTED, ids=[name for _, name in EXPORTED])
def test_report_from_export_rebuilds_the_committed_folder_byte_identical(root, name, tmp_path):
    for recipe in root.glob("*.yaml"):  # the fixture's recipe
        shutil.copy(recipe, tmp_path)
    for inputs in ("recipes", "sweeps"):  # the recipe and the search spec the export names
        if (root / inputs).is_dir():
            shutil.copytree(root / inputs, tmp_path / inputs)
    committed = root / "reports" / name
    copy = tmp_path / "reports" / name
    shutil.copytree(committed, copy)
    search = read_meta(committed)["report"].get("search")
    compared = search and load_search_spec(root / search).compare_with  # an earlier grid's CSV it reads
    if compared and not (tmp_path / compared.path).exists():
        (tmp_path / compared.path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(root / compared.path, tmp_path / compared.path)
    settings = read_meta(committed)["report"]
    grid = settings.get("fit", {}).get("compare_with")  # an earlier grid fit's folder
    compared = settings.get("compare_with", [])  # the folders a report sets its runs beside
    for other in [grid] * bool(grid) + compared:
        if not (tmp_path / other).exists():
            shutil.copytree(root / other, tmp_path / other)
    # all go but the inputs: the export, the README's hand-written part, and a prediction written before
    # the runs (ablate.report.predict, ablate.report.claims), which the report sets the measurement beside
    # and the README names. Every CSV else goes (provenance.csv and every comparison with another folder
    # too), and the verb writes it again from the export (and the compared folders).
    readme = (committed / "README.md").read_text()
    for generated in copy.iterdir():
        if generated.is_dir():
            shutil.rmtree(generated)
        elif generated.name in PREDICTIONS:
            assert f"`{generated.name}`" in readme, (
                f"{name}/README.md does not name its input {generated.name}"
            )
        elif generated.name not in INPUTS:
            generated.unlink()
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    verb = "fit" if "fit" in read_meta(copy)["report"] else "report"  # a grid fit's folder: ablate fit --from
    run_cli(verb, "--from", f"reports/{name}/", cwd=tmp_path, check=True)
    _assert_rebuilt(copy, committed)
    for other in compared:
        assert (copy / output_name(other)).read_bytes() == (committed / output_name(other)).read_bytes()
    after = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert set(after) - set(before) == {Path("reports", name, f) for f in _tree(committed)} - set(before)


def _one_line_error(code: int, err: str, *fragments: str) -> None:
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert all(f in err for f in fragments), err


def test_report_from_a_folder_without_an_export_is_one_line(tmp_path, capsys):
    (tmp_path / "old").mkdir()
    code = main(["report", "--from", str(tmp_path / "old")])
    _one_line_error(code, capsys.readouterr().err, "--from:", "has no export", "runs.parquet")
    code = main(["report", "recipes/table6.yaml", "--from", str(tmp_path / "old")])
    _one_line_error(code, capsys.readouterr().err, "give no recipe")
