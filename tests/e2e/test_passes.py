"""Passes over the training data (ablate.data.passes): a study whose largest budget outgrows its corpus
says so in its plan, its check and its report, and is refused in one line unless the recipe allows it."""

from __future__ import annotations

import csv
import re

from mini_project import run_cli, write_corpus, write_recipe

BUDGETS = {"steps": [4, 8]}  # 1024 and 2048 tokens of 256 per step


def _small_recipe(tmp_path, **changes):
    corpus = write_corpus(tmp_path / "small", n_docs=2)  # one document to train on: about 1.4K tokens
    return write_recipe(
        tmp_path,
        base__data__source=str(corpus),
        base__train__schedule="wsd",
        base__train__val_every=2,
        budgets=BUDGETS,
        **changes,
    )


def _split_tokens(text: str) -> int:
    found = re.search(r"data: \S+ under byte: (\d[\d.]*)([KM]?) training tokens", text)
    assert found, text
    return round(float(found.group(1)) * {"": 1, "K": 1e3, "M": 1e6}[found.group(2)])


def test_a_study_past_one_pass_is_refused_in_one_line_and_nothing_trains(tmp_path):
    recipe = _small_recipe(tmp_path, base__data__repeat="ask")  # the default; the mini recipe allows it
    ws = tmp_path / "ws"
    checked = run_cli("check", str(recipe), "--workspace", str(ws), cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr
    assert "passes over them" in checked.stdout and "data.repeat:" in checked.stdout
    split = _split_tokens(checked.stdout)
    assert 1024 < split < 2048  # so the 8-step budget is past one pass and the 4-step one under it
    proc = run_cli("sweep", str(recipe), "--yes", "--workspace", str(ws), "--reports", "r", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    # the plan states the passes of every budget and the share of its tokens read twice (each pass a
    # permutation: none below one pass, then what the second pass reads of the tokens), then the refusal is
    # one line naming the key and the fix
    again = 100 * (1 - split / 2048)
    again_text = f"{again:.1f}%" if again < 9.95 else f"{again:.0f}%"
    assert f"1.02K ({1024 / split:.2f}, 0%), 2.05K ({2048 / split:.2f}, {again_text})" in proc.stdout
    assert f"0-{again_text} of their tokens read twice (each pass a permutation of disjoint windows)" in (
        checked.stdout
    )
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ablate: error: data.repeat:"), proc.stderr
    assert f"{2048 / split:.2f} passes" in lines[0] and "data.repeat: allow" in lines[0]
    assert not (tmp_path / "r").exists() and not list(ws.rglob("result.json"))


def test_with_repeat_allowed_the_report_flags_the_runs_past_one_pass(tmp_path, monkeypatch, capsys):
    from ablate.cli import main

    recipe = _small_recipe(tmp_path, base__data__repeat="allow")
    monkeypatch.chdir(tmp_path)  # in this interpreter: the test above runs the verb in a fresh one
    assert main(["sweep", str(recipe), "--yes", "--workspace", str(tmp_path / "ws"), "--reports", "r"]) == 0
    split = _split_tokens(capsys.readouterr().out)
    folder = tmp_path / "r" / "mini"
    table = (folder / "table.md").read_text()
    # the header: the split and the passes; the rows (whose longest runs are past one pass) marked ↻
    assert (
        f"**Data: small: {split / 1e3:.3g}K training tokens; the runs make {2048 / split:.2f} passes" in table
    )
    assert "↻ 2 of 2 past one pass" in table and "fits text it saw again" in table
    assert "| Transformer ↻" in table or "| Transformer †↻" in table or "| Transformer ?↻" in table
    rows = list(csv.DictReader((folder / "table.csv").open()))
    assert {r["repeats_data"] for r in rows} == {"yes"}
    assert {float(r["passes"]) for r in rows} == {round(2048 / split, 4)}
    # each pass a permutation of the split's windows: past one, what the second pass reads is read twice
    assert {float(r["read_twice"]) for r in rows} == {round(1 - split / 2048, 4)}
    assert "of their tokens read twice (each pass a permutation of disjoint windows)" in table
    assert all(float(r["train_loss_end"]) > 0 for r in rows)
    # the budget report: passes per budget, the smaller budget under one pass, a generalization table
    budgets = (folder / "budgets.md").read_text()
    assert f"### 1.02K tokens (4 steps; {1024 / split:.2f} passes over the training split)" in budgets
    assert f"### 2.05K tokens (8 steps; {2048 / split:.2f} passes over the training split ↻)" in budgets
    again = 100 * (1 - split / 2048)
    again_text = f"{again:.1f}%" if again < 9.95 else f"{again:.0f}%"
    assert f"share of the tokens read twice: 0%, {again_text} (each pass a permutation" in budgets
    assert "## Generalization at each budget" in budgets and "Budget 2.05K is past one pass" in budgets
    general = list(csv.DictReader((folder / "generalization.csv").open()))
    assert {(r["variant"], int(r["tokens"])) for r in general} == {
        (v, t) for v in ("transformer", "diff") for t in (1024, 2048)
    }
    for r in general:
        assert abs(float(r["valid_minus_train"]) - (float(r["valid"]) - float(r["train"]))) < 1e-9
    gaps = list(csv.DictReader((folder / "gap_vs_tokens.csv").open()))
    assert [round(float(g["passes"]), 4) for g in gaps] == [round(1024 / split, 4), round(2048 / split, 4)]
    assert all(g["train_gap"] != "" for g in gaps)
