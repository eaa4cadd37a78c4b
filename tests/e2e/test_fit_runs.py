"""`ablate fit RECIPE` end to end: a miniature sizes grid swept into a real Optuna journal and MLflow store,
then fitted; the CSV path on the same points; and the mistakes a user can make (exit 2, one line)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from mini_project import write_recipe

from ablate.cli import main
from ablate.store.stores import Stores

# d_model 16..64 (head_dim 8: 2..8 Transformer heads, 1..4 Diff heads): non-embedding params 3.1K..99K.
SIZES = {
    "s16": {"model": {"d_model": 16, "n_layers": 1}},
    "s32": {"model": {"d_model": 32, "n_layers": 1}},
    "s48": {"model": {"d_model": 48, "n_layers": 2}},
    "s64": {"model": {"d_model": 64, "n_layers": 2}},
}
# Validations at steps 2, 4, 6, 8; warmup ends at step 2, so 3 validations per run count for the token axis.
TRAIN = {"steps": 8, "val_every": 2, "warmup_steps": 2}
BOOT = ["--bootstrap", "40"]


def _swept(folder: Path, **changes) -> tuple[Path, Path]:
    recipe = write_recipe(folder, **changes)
    workspace = folder / "ws"
    code = main(
        ["sweep", str(recipe), "--yes", "--workspace", str(workspace), "--reports", str(folder / "rep")]
    )
    assert code == 0
    return recipe, workspace


@pytest.fixture(scope="module")
def grid(tmp_path_factory) -> tuple[Path, Path]:
    """4 sizes x 2 archs, 8 steps each, swept once for the module."""
    folder = tmp_path_factory.mktemp("grid")
    return _swept(folder, sizes=SIZES, **{f"base__train__{k}": v for k, v in TRAIN.items()})


@pytest.fixture(scope="module")
def lopsided(tmp_path_factory) -> tuple[Path, Path]:
    """2 sizes; diff diverges (lr 1e30) so only the Transformer finishes."""
    folder = tmp_path_factory.mktemp("lopsided")
    sizes = {k: SIZES[k] for k in ("s16", "s32")}
    return _swept(folder, sizes=sizes, variants__diff__train={"lr": 1.0e30, "warmup_steps": 1})


def _client(workspace: Path):
    return Stores(workspace).client()


def _children(workspace: Path) -> list:
    client = _client(workspace)
    exp = client.get_experiment_by_name("mini")
    return [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("ablate.role") != "sweep"]


def _transformer_non_embedding(d: int, layers: int) -> int:
    """Independent count: per layer q, k, v, o (d x d each), SwiGLU w1, w3, w2 (d x round(8d/3)) and two
    RMSNorm weights; then the final norm. RoPE has no parameters."""
    hidden = round(8 * d / 3)
    return layers * (4 * d * d + 3 * d * hidden + 2 * d) + d


def _fit(recipe: Path, workspace: Path, out: Path, *args: str) -> int:
    """`ablate fit RECIPE --workspace WORKSPACE --out OUT ARGS...`: its exit code."""
    return main(["fit", str(recipe), "--workspace", str(workspace), "--out", str(out), *args])


def test_fit_size_grid_writes_fit_files_tags_runs_and_logs_to_the_parent(grid, tmp_path, monkeypatch, capsys):
    recipe, workspace = grid
    monkeypatch.chdir(tmp_path)  # the default output folder is ./reports/<recipe>
    assert main(["fit", str(recipe), "--workspace", str(workspace), *BOOT]) == 0
    out = tmp_path / "reports" / "mini"
    printed = capsys.readouterr().out
    for name in ("fit.json", "fit.md", "loss_vs_params.png"):
        assert f"reports/mini/{name}" in printed and (out / name).stat().st_size > 0, name
    assert (out / "loss_vs_params.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (out / "loss_vs_tokens.png").exists()  # the size form draws loss against parameters only

    doc = json.loads((out / "fit.json").read_text())
    assert doc["form"] == "size" and doc["reference"] == "transformer" and doc["n_boot"] == 40
    assert set(doc["archs"]) == {
        "transformer",
        "diff",
    }  # the reference is the Transformer in any recipe order
    for arch in doc["archs"].values():
        assert set(arch["params"]) == set(arch["ci"]) == {"E", "A", "alpha"}
        assert arch["n_points"] == arch["n_runs"] == 4
        lo, hi = arch["ci"]["alpha"]
        assert lo <= arch["params"]["alpha"] <= hi
    assert [r["at"] for r in doc["ratios"]] == sorted(r["params"] for r in doc["runs"] if r["arch"] == "diff")
    assert all(r["sentence"].startswith("diff ") for r in doc["ratios"])
    assert doc["source"]["study"] == "mini" and doc["source"]["params_count"] == "non_embedding"

    # Points are the runs' final validations, with N from the run's tag and the same count for both arms.
    children = {c.info.run_id: c for c in _children(workspace)}
    assert len(children) == 8 and {r["run_id"] for r in doc["runs"]} == set(children)
    for r in doc["runs"]:
        child = children[r["run_id"]]
        assert r["loss"] == pytest.approx(child.data.metrics["val/loss"], rel=1e-12)
        assert r["tokens"] == 8 * 256 and r["params"] == float(child.data.tags["ablate.non_embedding_params"])
        if r["arch"] == "transformer":
            spec = SIZES[r["size"]]["model"]
            assert r["params"] == _transformer_non_embedding(spec["d_model"], spec["n_layers"])
        assert child.data.tags["ablate.fit.converged"] in ("yes", "no")
        assert (child.data.tags["ablate.fit.converged"] == "yes") == r["converged"]
    by_size = {(r["arch"], r["size"]): r["params"] for r in doc["runs"]}
    for size in SIZES:  # diff adds only its λ vectors and per-head norm weights: matched within 2%
        assert by_size[("diff", size)] == pytest.approx(by_size[("transformer", size)], rel=0.02)

    md = (out / "fit.md").read_text()
    assert "## Equal-loss ratios (reference: transformer)" in md and (
        "diff needs" in md or "no solution" in md
    )
    assert "## Runs" in md and md.count("| transformer-s") == 4 and md.count("| diff-s") == 4
    assert "non-embedding parameters" in md

    parent = _client(workspace).get_run(children[doc["runs"][0]["run_id"]].data.tags["mlflow.parentRunId"])
    logged = {a.path for a in _client(workspace).list_artifacts(parent.info.run_id, "fit")}
    assert {"fit/fit.json", "fit/fit.md", "fit/loss_vs_params.png"} <= logged
    assert parent.data.metrics["fit.transformer.alpha"] == pytest.approx(
        doc["archs"]["transformer"]["params"]["alpha"]
    )

    # --params-count total: every N grows by the embedding and LM head (vocab 260 x d_model each).
    assert _fit(recipe, workspace, tmp_path / "total", "--params-count", "total", *BOOT) == 0
    total = json.loads((tmp_path / "total" / "fit.json").read_text())
    for r_ne, r_tot in zip(doc["runs"], total["runs"]):
        d = SIZES[r_ne["size"]]["model"]["d_model"]
        assert r_tot["params"] - r_ne["params"] == 2 * 260 * d


def test_fit_csv_of_the_same_points_gives_the_same_fit(grid, tmp_path):
    recipe, workspace = grid
    assert _fit(recipe, workspace, tmp_path / "recipe", *BOOT) == 0
    doc = json.loads((tmp_path / "recipe" / "fit.json").read_text())
    rows = "".join(
        f"{r['arch']},{r['params']!r},{r['tokens']!r},{r['loss']!r},{r['run_id']}\n" for r in doc["runs"]
    )
    csv = tmp_path / "points.csv"
    csv.write_text("arch,params,tokens,loss,run_id\n" + rows)
    assert main(["fit", "--csv", str(csv), "--out", str(tmp_path / "csv"), *BOOT]) == 0
    again = json.loads((tmp_path / "csv" / "fit.json").read_text())
    for arch, fit in doc["archs"].items():
        for key, value in fit["params"].items():
            assert again["archs"][arch]["params"][key] == pytest.approx(value, rel=1e-9), (arch, key)
            assert again["archs"][arch]["ci"][key] == pytest.approx(fit["ci"][key], rel=1e-9), (arch, key)
    assert [r["ratio"] for r in again["ratios"]] == pytest.approx(
        [r["ratio"] for r in doc["ratios"]], rel=1e-9
    )


def test_fit_joint_form_uses_validations_and_says_checkpoints_are_not_runs(grid, tmp_path):
    recipe, workspace = grid
    assert _fit(recipe, workspace, tmp_path / "joint", "--form", "joint", *BOOT) == 0
    out = tmp_path / "joint"
    doc = json.loads((out / "fit.json").read_text())
    assert doc["form"] == "joint"
    for arch in doc["archs"].values():
        assert (
            arch["n_runs"] == 4 and arch["n_points"] == 4 * 3
        )  # validations at steps 4, 6, 8 (after warmup)
        assert arch["ranges"]["tokens"] == [4 * 256, 8 * 256]
    assert {r["quantity"] for r in doc["ratios"]} == {"params", "tokens"}
    text = (out / "fit.md").read_text()
    assert "not a separate run at that token budget" in text
    assert any("not a separate run at that token budget" in n for n in doc["notes"])
    for name in ("loss_vs_params.png", "loss_vs_tokens.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _one_line_error(capsys, code: int) -> str:
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_fit_without_a_sweep_says_how_to_run_it_and_creates_nothing(tmp_path, capsys):
    recipe = write_recipe(tmp_path, sizes=SIZES)
    workspace = tmp_path / "nowhere"
    err = _one_line_error(capsys, main(["fit", str(recipe), "--workspace", str(workspace)]))
    assert "no finished runs of mini" in err and f"ablate sweep {recipe}" in err
    assert not workspace.exists()


def test_fit_tokens_form_on_a_size_grid_is_an_error(grid, tmp_path, capsys):
    recipe, workspace = grid
    err = _one_line_error(
        capsys,
        _fit(recipe, workspace, tmp_path / "x", "--form", "tokens"),
    )
    assert "--form tokens" in err and "4 sizes" in err
    assert not (tmp_path / "x").exists()


def test_fit_ratio_of_a_single_finished_architecture_is_an_error(lopsided, tmp_path, capsys):
    recipe, workspace = lopsided
    err = _one_line_error(capsys, _fit(recipe, workspace, tmp_path / "x"))
    assert "equal-loss ratio needs two architectures" in err and "'transformer'" in err and "diff" in err
    assert "ablate sweep" in err


def test_fit_fewer_points_than_parameters_is_an_error(lopsided, tmp_path, capsys):
    recipe, workspace = lopsided
    # The same study (recipe name "mini"), read through a recipe with the Transformer alone: no ratio is
    # asked, and the size form's 3 parameters meet 2 runs.
    raw = yaml.safe_load(recipe.read_text())
    del raw["variants"]["diff"]
    alone = tmp_path / "alone.yaml"
    alone.write_text(yaml.safe_dump(raw))
    err = _one_line_error(capsys, _fit(alone, workspace, tmp_path / "x"))
    assert "has 2 points" in err and "needs at least 3" in err


def test_fit_one_size_fits_tokens_over_validations_without_false_intervals(tmp_path):
    # No sizes axis: the default form is L(D) through each run's validations after warmup (Figure 3b).
    recipe, workspace = _swept(tmp_path, **{f"base__train__{k}": v for k, v in TRAIN.items()})
    out = tmp_path / "tokens"
    assert _fit(recipe, workspace, out, *BOOT) == 0
    doc = json.loads((out / "fit.json").read_text())
    assert doc["form"] == "tokens" and doc["n_boot"] == 0  # one run per arch: nothing to resample
    for arch in doc["archs"].values():
        assert (
            arch["n_runs"] == 1 and arch["n_points"] == 3 and arch["ranges"]["tokens"] == [4 * 256, 8 * 256]
        )
        assert all(v is None for pair in arch["ci"].values() for v in pair)
    assert {r["quantity"] for r in doc["ratios"]} == {"tokens"} and len(doc["ratios"]) == 3
    text = (out / "fit.md").read_text()
    assert "not a separate run at that token budget" in text and "No intervals" in text
    assert (out / "loss_vs_tokens.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
