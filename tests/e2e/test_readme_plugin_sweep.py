"""The docs' "Add a component" example (docs/recipes-and-components.md), as a user adds it: its own file, `imports:` in a recipe beside
Table 6's `transformer` and `diff` rows, `ablate check` without --allow-unmatched, then a short sweep that
ends with three FINISHED runs."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from mini_project import MINI, run_cli, sweep_argv, write_recipe

from ablate.store.stores import Stores

ROOT = Path(__file__).resolve().parents[2]


def readme_example() -> str:
    section = (ROOT / "docs" / "recipes-and-components.md").read_text().split("### Add a component", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_plugin_checks_and_sweeps_beside_table6_rows(tmp_path):
    (tmp_path / "my_attention.py").write_text(readme_example())
    table6 = yaml.safe_load((ROOT / "recipes" / "table6.yaml").read_text())["variants"]
    recipe = write_recipe(
        tmp_path,
        imports=["my_attention"],
        base__train__steps=4,
        base__train__val_every=2,
        variants={
            "transformer": table6["transformer"],
            "diff": table6["diff"],
            "gated": {"label": "Gated", "model": {"attention": {"name": "gated"}}},
        },
    )
    assert list(yaml.safe_load(recipe.read_text())["variants"]) == ["transformer", "diff", "gated"]
    check = run_cli("check", str(recipe), cwd=tmp_path, check=True)  # matched without --allow-unmatched
    (row,) = [line for line in check.stdout.splitlines() if line.startswith("| gated")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    heads, width = (
        MINI["base"]["model"]["d_model"] // MINI["base"]["model"]["head_dim"],
        MINI["base"]["model"]["head_dim"],
    )
    assert cells[2:4] == [str(heads), str(width)] and cells[-1] == "ok", row  # its describe(): #heads, d
    assert "counted" in check.stdout and "gated" in check.stdout.split("FLOPs:", 1)[1]  # FLOPs counted for it

    run_cli(
        *sweep_argv(recipe, tmp_path),
        cwd=tmp_path,
        check=True,
        timeout=600,
    )
    client = Stores(tmp_path / "ws").client()
    runs = client.search_runs([client.get_experiment_by_name("mini").experiment_id])
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert sorted(r.info.run_name for r in children) == ["diff-s0", "gated-s0", "transformer-s0"]
    assert all(r.info.status == "FINISHED" for r in children)
