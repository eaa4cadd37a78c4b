"""A size x budget grid end to end: each (size, arm, seed) trained once, one MLflow run per budget, counted
through MLflow; `ablate fit` over it writes its folder with the runs' export, and `ablate fit --from` writes
the same folder again from that export alone. (The fit's numbers are tested on synthetic grids in
tests/ablate/test_fit_grid.py.)"""

from __future__ import annotations

import csv
import io
import shutil
from collections import Counter
from pathlib import Path

import pytest
from mini_project import write_recipe

from ablate.cli import main
from ablate.store.stores import Stores

SIZES = {  # head_dim 8: 2, 4 and 6 Transformer heads; 1, 2 and 3 Diff heads
    "s16": {"model": {"d_model": 16, "n_layers": 1}},
    "s32": {"model": {"d_model": 32, "n_layers": 1}},
    "s48": {"model": {"d_model": 48, "n_layers": 1}},
}
BUDGETS = [4, 8, 16]  # steps of 256 tokens; each cools down over its last 20% (1, 2 and 3 steps)
SEEDS = ["0", "1"]


@pytest.mark.slow
def test_a_size_budget_grid_trains_each_size_arm_seed_once_with_one_run_per_budget(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(
        tmp_path
    )  # the checkout the export names its recipe in (a relative path: data, not code)
    recipe = write_recipe(
        tmp_path,
        sizes=SIZES,
        base__train__schedule="wsd",
        base__train__val_every=4,
        base__train__warmup_steps=1,
        budgets={"steps": BUDGETS},
    )
    ws = tmp_path / "ws"
    sweep = ["sweep", str(recipe), "--seeds", *SEEDS, "--yes", "--workspace", str(ws)]
    assert main([*sweep, "--reports", str(tmp_path / "rep")]) == 0

    client = Stores(ws).client()
    exp = client.get_experiment_by_name("mini")
    runs = [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("ablate.role") != "sweep"]
    tags = [r.data.tags for r in runs]
    assert {r.info.status for r in runs} == {"FINISHED"}
    key = [(t["ablate.variant"], t["ablate.size"], t["ablate.seed"]) for t in tags]
    # one run per (size, arm, seed, budget): 3 x 2 x 2 x 3
    assert Counter(zip(key, (int(t["ablate.budget_steps"]) for t in tags))) == {
        ((v, s, seed), b): 1
        for v in ("transformer", "diff")
        for s in SIZES
        for seed in SEEDS
        for b in BUDGETS
    }
    # trained from step 0 once per (size, arm, seed): the largest budget; the others branch off that run
    fresh = {r.info.run_id: k for r, k, t in zip(runs, key, tags) if "ablate.branched_from" not in t}
    assert sorted(fresh.values()) == sorted(set(key)) and len(fresh) == 12
    assert all(
        int(t["ablate.budget_steps"]) == BUDGETS[-1] for r, t in zip(runs, tags) if r.info.run_id in fresh
    )
    for k, t in zip(key, tags):
        if "ablate.branched_from" in t:
            assert fresh[t["ablate.branched_from"]] == k  # a branch of its own (size, arm, seed)
    for r, t in zip(
        runs, tags
    ):  # a branch trains only its cooldown: its first logged step is past its branch
        steps = [m.step for m in client.get_metric_history(r.info.run_id, "train/loss")]
        assert (
            min(steps) > int(t["ablate.branch_step"]) - 1 if "ablate.branched_from" in t else min(steps) <= 1
        )

    # `ablate fit` over it: the fits, CSVs and README, and beside them the runs' export
    fit = tmp_path / "fit"
    assert main(["fit", recipe.name, "--workspace", str(ws), "--out", str(fit), "--bootstrap", "20"]) == 0
    first = {p.relative_to(fit): p.read_bytes() for p in fit.rglob("*") if p.is_file()}
    assert {Path("runs.parquet"), Path("metrics.parquet"), Path("README.md"), Path("ratios.csv")} <= set(
        first
    )
    readme = first[Path("README.md")].decode()
    assert "the runs' `ablate.machine` tag" in readme and "ablate fit --from" in readme
    ratios = list(csv.DictReader(io.StringIO(first[Path("ratios.csv")].decode())))
    assert ratios and all(r["n_boot"] == "20" for r in ratios)  # 2 seeds: paired-seed intervals
    assert any(r["lo"] and r["hi"] for r in ratios)
    # the same grid beside an earlier fit's folder (here: itself): every ratio and gap equal to its own
    compared = tmp_path / "compared"
    fit_compared = ["fit", recipe.name, "--workspace", str(ws), "--bootstrap", "20"]
    assert main([*fit_compared, "--out", str(compared), "--compare-with", "fit"]) == 0
    _check_comparison(compared, fit)
    how_made = "--out <this folder> --compare-with fit\n"
    assert how_made in (compared / "README.md").read_text()
    for wrong, fragment in [(["--compare-with", "ws"], "ratios.csv"), (["--form", "size"], "grid fits")]:
        compare = [] if "--compare-with" in wrong else ["--compare-with", "fit"]
        capsys.readouterr()
        assert main([*fit_compared, "--out", str(tmp_path / "wrong"), *compare, *wrong]) == 2
        err = capsys.readouterr().err
        assert fragment in err and len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / "wrong").exists()
    compared_files = {p.relative_to(compared): p.read_bytes() for p in compared.rglob("*") if p.is_file()}

    # a person's words below the generated part survive; everything else comes back byte for byte
    with open(fit / "README.md", "a") as f:
        f.write("\n# What these runs say\n\nHand-written.\n")
    shutil.rmtree(ws)  # no store left: only the folder
    for p in fit.rglob("*"):
        if p.is_file() and p.suffix not in (".parquet",) and p.name != "README.md":
            p.unlink()
    assert main(["fit", "--from", str(fit)]) == 0
    again = {p.relative_to(fit): p.read_bytes() for p in fit.rglob("*") if p.is_file()}
    assert again.pop(Path("README.md")).decode() == readme + "\n# What these runs say\n\nHand-written.\n"
    first.pop(Path("README.md"))
    assert again == first
    for p in compared.rglob("*"):  # the comparison too, reading the compared folder again
        if p.is_file() and p.suffix != ".parquet":
            p.unlink()
    assert main(["fit", "--from", str(compared)]) == 0
    assert {
        p.relative_to(compared): p.read_bytes() for p in compared.rglob("*") if p.is_file()
    } == compared_files

    # a sweep's report folder is not a fit's, and the other way round: one line each, exit 2
    capsys.readouterr()
    assert main(["report", "--from", str(fit)]) == 2
    assert "use ablate fit --from" in capsys.readouterr().err


def _check_comparison(compared: Path, earlier: Path) -> None:
    """compared_gaps.csv against the paired gaps computed here from the earlier folder's points.csv."""
    from scipy import stats

    def rows(folder: Path, name: str) -> list[dict[str, str]]:
        with open(folder / name, newline="") as f:
            return list(csv.DictReader(f))

    loss = {
        (p["arch"], p["size"], float(p["tokens"]), p["seed"]): float(p["loss"])
        for p in rows(earlier, "points.csv")
    }
    gaps = rows(compared, "compared_gaps.csv")
    assert len(gaps) == len(SIZES) * len(BUDGETS)
    for g in gaps:
        d = [
            loss[("diff", g["size"], float(g["tokens"]), s)]
            - loss[("transformer", g["size"], float(g["tokens"]), s)]
            for s in SEEDS
        ]
        mean = sum(d) / len(d)
        half = stats.t.ppf(0.975, len(d) - 1) * stats.sem(d)
        for side in ("", "compared_"):
            assert float(g[f"{side}gap"]) == pytest.approx(mean, abs=1e-12)
            assert float(g[f"{side}gap_lo"]) == pytest.approx(mean - half, abs=1e-9)
            assert float(g[f"{side}gap_hi"]) == pytest.approx(mean + half, abs=1e-9)
            assert g[f"{side}seeds"] == "2"
        assert float(g["gap_change"]) == 0.0
    ratios = rows(compared, "compared_ratios.csv")
    headline = [r for r in rows(earlier, "ratios.csv") if r["at_largest"] == "True"]
    assert len(ratios) == len(headline) > 0
    for r in ratios:
        assert r["status"] == r["compared_status"]
        for key in ("ratio", "lo", "hi"):
            assert r[key] == r[f"compared_{key}"] or float(r[key]) == pytest.approx(
                float(r[f"compared_{key}"])
            )
    readme = (compared / "README.md").read_text()
    assert "## Beside `fit`" in readme and "compared_gaps.csv" in readme
