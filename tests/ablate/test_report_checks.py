"""The report's statements about itself (ablate.report.checks, report.honesty_checks) on synthetic runs
whose answers are known by construction."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from ablate.report import checks as rc
from ablate.report.honesty import honesty_checks
from ablate.report.run_records import RunRecord
from ablate.report.stats import paired_difference
from ablate.report.table import row_diffs, table_rows

WARMUP = 10_000.0  # tokens: 10 steps x 1000
VALIDATIONS = [2e4, 4e4, 6e4, 8e4, 1e5]


def flat_curve(level: float) -> list[tuple[float, float]]:
    # L = level + 0.5 t^-0.5: at 1e5 tokens, doubling gains 0.5 * 0.00316 * 0.29 / level ~ 0.01%: converged
    return [(t, level + 0.5 * t**-0.5) for t in VALIDATIONS]


def falling_curve(level: float) -> list[tuple[float, float]]:
    # L = level + 50 t^-0.3: at 1e5 tokens, doubling gains 1.58 * (1 - 2^-0.3) / (level + 1.58) ~ 6%: not converged
    return [(t, level + 50.0 * t**-0.3) for t in VALIDATIONS]


def record(
    variant: str,
    seed: int,
    valid: float,
    curve=None,
    lr: float | None = None,
    state: str = "finished",
) -> RunRecord:
    params = {"train.warmup_steps": "10", "train.batch_tokens": "1000", "train.lr": str(lr or 0.003)}
    return RunRecord(
        variant=variant,
        seed=seed,
        size="",
        state=state,
        run_id=f"{variant}-{seed}-{lr}",
        values={"valid": valid, "ar_hit": valid, "others": valid, "ar_hit_share": 0.3},
        searched={"base.train.lr": lr} if lr is not None else {},
        tags={"ablate.tokens": "100000"},
        curve=curve or flat_curve(valid),
        params=params,
    )


def context(scale: str = "cpu", raw_scales: dict | None = None):
    from ablate.recipe.schema import ScaleOverlay, Variant

    variants = {
        "a": Variant(label="Transformer"),
        "b": Variant(label="Diff"),
        "c": Variant(label="Transformer"),
    }
    scales = raw_scales or {scale: {}}
    recipe = SimpleNamespace(
        variants=variants,
        scale_overlay=lambda name: ScaleOverlay(**scales.get(name, {})),
        sizes=lambda name: None,
    )
    return SimpleNamespace(recipe=recipe, scale=scale)


# --- convergence --------------------------------------------------------------------------------------
def test_run_convergence_tells_a_falling_curve_from_a_flat_one():
    flat = rc.run_convergence(flat_curve(3.0), WARMUP)
    falling = rc.run_convergence(falling_curve(3.0), WARMUP)
    assert flat.converged is True and flat.predicted_gain < 0.01
    assert falling.converged is False
    # independent: the gain of the generating curve itself, (L(t) - L(2t)) / L(t) at t = 1e5
    expected = 50 * (1e5**-0.3 - 2e5**-0.3) / (3.0 + 50 * 1e5**-0.3)
    assert falling.predicted_gain == pytest.approx(expected, rel=0.05)
    # two validations after warmup: a curve with three parameters cannot be fitted
    short = rc.run_convergence([(5e3, 5.0), (2e4, 4.0), (4e4, 3.9)], WARMUP)
    assert short.converged is None and "3" in short.reason


def test_a_row_with_a_run_that_had_not_converged_is_marked():
    records = [record("a", s, 3.0 + 0.01 * s) for s in range(3)]
    records += [
        record("b", 0, 3.1, curve=falling_curve(3.1 - 1.58)),
        record("b", 1, 3.11),
        record("b", 2, 3.12),
    ]
    ctx = context()
    honesty = honesty_checks(ctx, records, records)
    assert honesty.marks == {("", "b"): rc.NOT_CONVERGED}
    _, rows, csv_rows = table_rows(ctx, records, marks=honesty.marks)
    assert [row[0] for row in rows] == ["Transformer [a]", f"Diff {rc.NOT_CONVERGED}"]  # c shares its label
    header = " ".join(honesty.header)
    assert "Tokens per run: 100K" in header and "Converged: NO, 1 of 6 runs had not" in header
    # what the runs reach: the largest predicted gain is the falling run's (fit tested above), and the
    # median is a flat run's (under 1%)
    worst = rc.run_convergence(falling_curve(3.1 - 1.58), WARMUP).predicted_gain
    assert worst > 0.01 and f"to {worst:.1%})" in header
    assert "predicted gain from twice the tokens: median 0." in header
    assert any(n.startswith(rc.NOT_CONVERGED) for n in honesty.notes)
    # every run converged: the header says so and no row is marked
    good = [r for r in records if not (r.variant == "b" and r.seed == 0)] + [record("b", 0, 3.1)]
    honesty = honesty_checks(ctx, good, good)
    assert honesty.marks == {} and "Converged: yes, 6 of 6 runs" in " ".join(honesty.header)


def test_too_short_runs_are_marked_unknown_not_converged():
    short = [(2e4, 4.0), (4e4, 3.9)]
    records = [record("a", s, 3.0, curve=short) for s in range(2)] + [
        record("b", s, 3.1, curve=short) for s in range(2)
    ]
    honesty = honesty_checks(context(), records, records)
    assert set(honesty.marks.values()) == {rc.UNKNOWN}
    assert "Converged: unknown" in " ".join(honesty.header)


# --- intervals ------------------------------------------------------------------------------------------
def test_all_intervals_containing_zero_gives_the_sentence():
    # b - a per seed: +0.02, -0.03, +0.01 and c - a: -0.01, +0.02, -0.02: both intervals straddle zero
    a = [3.00, 3.10, 3.20]
    noisy = (
        [record("a", s, v) for s, v in enumerate(a)]
        + [record("b", s, v + d) for s, (v, d) in enumerate(zip(a, [0.02, -0.03, 0.01]))]
        + [record("c", s, v + d) for s, (v, d) in enumerate(zip(a, [-0.01, 0.02, -0.02]))]
    )
    diffs = row_diffs(["a", "b", "c"], noisy)
    assert all(d.lo < 0 < d.hi for d in diffs.values())  # the premise, checked independently of the rule
    assert rc.ALL_CONTAIN_ZERO in honesty_checks(context(), noisy, noisy).notes
    # one resolved row (c - a: -0.10, -0.11, -0.12) and the sentence is gone
    resolved = [r for r in noisy if r.variant != "c"] + [
        record("c", s, v - 0.1 - 0.01 * s) for s, v in enumerate(a)
    ]
    assert rc.ALL_CONTAIN_ZERO not in honesty_checks(context(), resolved, resolved).notes
    # one seed: no intervals at all, so nothing is claimed
    single = [record("a", 0, 3.0), record("b", 0, 3.01)]
    assert rc.ALL_CONTAIN_ZERO not in honesty_checks(context(), single, single).notes


def test_all_intervals_contain_zero_rule():
    straddles = paired_difference({0: 1.0, 1: 2.0, 2: 3.0}, {0: 1.1, 1: 1.9, 2: 3.05})
    excludes = paired_difference({0: 1.0, 1: 2.0, 2: 3.0}, {0: 1.5, 1: 2.6, 2: 3.4})
    one_seed = paired_difference({0: 1.0}, {0: 2.0})
    assert rc.all_intervals_contain_zero([straddles])
    assert not rc.all_intervals_contain_zero([straddles, excludes])
    assert not rc.all_intervals_contain_zero([straddles, one_seed])
    assert not rc.all_intervals_contain_zero([])


# --- learning-rate sensitivity ------------------------------------------------------------------------------
def lr_grid() -> list[RunRecord]:
    """b beats a at lr 1e-3 and loses at 1e-2 (a flip); c is worse than a at every lr."""
    losses = {
        "a": {1e-3: 3.30, 3e-3: 3.10, 1e-2: 3.20},
        "b": {1e-3: 3.25, 3e-3: 3.15, 1e-2: 3.40},
        "c": {1e-3: 3.50, 3e-3: 3.30, 1e-2: 3.45},
    }
    return [
        record(v, s, loss + 0.001 * s, lr=lr)
        for v, by_lr in losses.items()
        for lr, loss in by_lr.items()
        for s in range(2)
    ]


def test_a_ranking_flip_across_the_lr_grid_is_flagged():
    s = rc.lr_sensitivity(lr_grid(), ["a", "b", "c"])
    assert [rc.point_label(p) for p in s.points] == ["lr=0.001", "lr=0.003", "lr=0.01"]
    assert s.flips == {("", "b"): True, ("", "c"): False}
    lr3 = (("base.train.lr", 3e-3),)
    assert s.loss[("", "b")][lr3] == pytest.approx(3.1505)  # mean over the two seeds
    assert s.order_changes[""] is True
    labels = {"a": "Transformer [a]", "b": "Diff", "c": "Transformer [c]"}
    text = rc.sensitivity_markdown(s, labels)
    diff_row = next(line for line in text.splitlines() if line.startswith("| Diff"))
    assert f"{rc.FLIPS} flips" in diff_row and "3.151 (n=2)" in diff_row and "lr=0.003" in diff_row  # best lr
    assert "WARNING: the sign against the reference flips across the grid for: Diff." in text
    assert "lr=0.001: Diff < Transformer [a] < Transformer [c]" in text
    rows = {(r["variant"], r["point"]): r for r in rc.sensitivity_rows(s, labels)}  # lr_sensitivity.csv
    assert len(rows) == 9 and rows[("b", "lr=0.01")]["base.train.lr"] == 1e-2
    # independent arithmetic: b at 1e-2 is 3.4005 (mean of 3.400, 3.401), a 3.2005: +0.2 above it
    assert rows[("b", "lr=0.01")]["vs_reference"] == pytest.approx(0.2)
    assert rows[("b", "lr=0.001")]["vs_reference"] == pytest.approx(-0.05)
    assert rows[("a", "lr=0.003")]["vs_reference"] == 0.0 and rows[("a", "lr=0.003")]["sign_flips"] == ""
    assert [rows[("b", p)]["best_point"] for p in ("lr=0.001", "lr=0.003", "lr=0.01")] == ["no", "yes", "no"]
    assert (
        rows[("b", "lr=0.003")]["sign_flips"] == "true" and rows[("c", "lr=0.003")]["sign_flips"] == "false"
    )


def test_no_flag_when_the_ranking_holds_across_the_grid():
    records = [r for r in lr_grid() if r.variant != "b"]
    s = rc.lr_sensitivity(records, ["a", "b", "c"])
    assert s.flips == {("", "c"): False} and s.order_changes[""] is False
    assert "WARNING" not in rc.sensitivity_markdown(s, {})
    assert rc.lr_sensitivity([record("a", 0, 3.0)], ["a"]) is None  # no search, no section


def test_the_report_shows_the_sensitivity_of_every_searched_point_not_only_the_best():
    records = lr_grid()
    best = [r for r in records if r.searched["base.train.lr"] == 3e-3]
    honesty = honesty_checks(context(), records, best)
    assert "lr=0.01" in honesty.sensitivity and f"{rc.FLIPS} flips" in honesty.sensitivity
    assert "Learning rates: each row at its best point of the searched grid" in " ".join(honesty.header)


# --- purpose and protocol -------------------------------------------------------------------------------------
def test_the_tiny_scale_says_it_is_a_pipeline_check_and_a_recipe_purpose_is_shown():
    records = [record("a", 0, 3.0), record("b", 0, 3.1)]
    assert honesty_checks(context("tiny"), records, records).header[0] == rc.TINY_PURPOSE
    assert "pipeline check" in rc.TINY_PURPOSE
    own = context(
        "cpu", {"cpu": {"purpose": "Past the transient: every run within 1% of its fitted asymptote."}}
    )
    assert honesty_checks(own, records, records).header[0].startswith("Past the transient")
    assert not honesty_checks(context("cpu"), records, records).header[0].startswith(("The `tiny`", "Past"))
    overridden = context("tiny")
    overridden.recipe.base_overrides = [("train.steps", 12)]
    purpose = honesty_checks(overridden, records, records).header[0]
    assert purpose.startswith(rc.TINY_PURPOSE) and "overrode `train.steps=12`" in purpose


def test_the_lr_protocol_is_stated():
    records = [record("a", 0, 3.0), record("b", 0, 3.1)]
    assert rc.lr_protocol(records, searched=False) == (
        "Learning rate: 0.003 shared by every row (one lr for all, not tuned per row), 10 warmup steps."
    )
    assert math.isnan(rc.run_tokens(RunRecord("a", 0, "", "finished", None)))


# --- per-layer statistics ----------------------------------------------------------------------------------
def with_layers(
    r: RunRecord, embed: list[float], attn: list[list[float]], lam: list[float] | None = None
) -> RunRecord:
    tokens = [2e4, 1e5]
    r.layer_curves = {"rms/embed": list(zip(tokens, embed))}
    for layer, values in enumerate(attn):
        r.layer_curves[f"rms/attn_out/layer_{layer:02d}"] = list(zip(tokens, values))
        r.layer_curves[f"rms/residual/layer_{layer:02d}"] = list(zip(tokens, [1.0, 1.0]))
    for layer, value in enumerate(lam or []):
        r.layer_curves[f"lambda/layer_{layer:02d}"] = list(zip(tokens, [0.8, value]))
    return r


def test_layer_diagnostics_flag_attention_that_swamps_the_embeddings_early():
    quiet = [
        with_layers(record("a", s, 3.0), embed=[0.02, 0.05], attn=[[0.01, 0.04], [0.03, 0.06]])
        for s in range(2)
    ]
    loud = [
        with_layers(record("b", s, 3.2), embed=[0.02, 0.05], attn=[[0.4, 0.1], [0.6, 0.1]], lam=[0.5, 0.7])
        for s in range(2)
    ]
    # independent arithmetic: a: mean(0.01, 0.03) / 0.02 = 1.0; b: mean(0.4, 0.6) / 0.02 = 25.0, later 2.0
    assert rc.attention_to_embedding(quiet[0].layer_curves, 0) == pytest.approx(1.0)
    assert rc.attention_to_embedding(loud[0].layer_curves, -1) == pytest.approx(2.0)
    text = rc.layer_report(quiet + loud, ["a", "b"], {"a": "Transformer", "b": "+ GroupNorm"})[0]
    row = next(line for line in text.splitlines() if line.startswith("| + GroupNorm"))
    assert [c.strip() for c in row.strip("|").split("|")] == ["+ GroupNorm", "25.00", "2.00", "0.600"]
    assert "+ GroupNorm: its attention writes 25.0x the embeddings' RMS at the first validation" in text
    assert "Transformer: its attention" not in text
    _, cells = rc.layer_report(quiet + loud, ["a", "b"], {"a": "Transformer", "b": "+ GroupNorm"})
    assert [(c["variant"], c["seeds"]) for c in cells] == [("a", 2), ("b", 2)]  # layer_stats.csv
    assert cells[1]["attn_over_embed_rms_first"] == pytest.approx(25.0)
    assert cells[1]["attn_over_embed_rms_last"] == pytest.approx(2.0)
    assert cells[1]["mean_lambda_last"] == pytest.approx(0.6) and math.isnan(cells[0]["mean_lambda_last"])
    calm, _ = rc.layer_report(
        quiet + [with_layers(record("b", 0, 3.0), [0.02, 0.05], [[0.02, 0.04], [0.02, 0.04]])], ["a", "b"], {}
    )
    assert "swamps" not in calm
    assert rc.layer_report([record("a", 0, 3.0)], ["a"], {})[0] == ""  # runs without layer statistics


def test_a_loud_row_is_said_to_lag_only_when_its_mean_loss_is_above_the_reference_rows():
    quiet = [with_layers(record("a", s, 3.0), [0.02, 0.05], [[0.01, 0.04], [0.03, 0.06]]) for s in range(2)]

    def loud(losses: list[float]) -> list[RunRecord]:
        return [
            with_layers(record("b", s, v), [0.02, 0.05], [[0.4, 0.1], [0.6, 0.1]])
            for s, v in enumerate(losses)
        ]

    lag = "a lag of this row may be a transient"
    lagging = rc.layer_report(quiet + loud([3.2, 2.9]), ["a", "b"], {"b": "Diff"})[0]  # mean 3.05 > 3.0
    leading = rc.layer_report(quiet + loud([2.7, 3.1]), ["a", "b"], {"b": "Diff"})[0]  # mean 2.9 < 3.0
    assert "Diff: its attention writes 25.0x" in lagging and lag in lagging
    assert "Diff: its attention writes 25.0x" in leading and lag not in leading
    assert "its mean final validation loss is not above the reference row's even so" in leading


def test_sensitivity_rows_go_by_the_recipes_size_order_not_by_name():
    import dataclasses

    sizes = ["s64", "s96", "s128", "s160"]  # as a recipe lists them; by name s128 and s160 come first
    records = [
        dataclasses.replace(record("a", 0, 3.0 - i / 10, lr=lr), size=size, run_id=f"{size}-{lr}")
        for i, size in enumerate(sizes)
        for lr in (1e-3, 3e-3)
    ]
    s = rc.lr_sensitivity(records, ["a"], sizes)
    assert [size for size, _ in s.rows] == sizes
    assert [size for size, _ in rc.lr_sensitivity(records, ["a"]).rows] == sorted(sizes)  # no order given


def test_a_row_of_shorter_runs_is_not_paired_with_the_references_longer_ones():
    from ablate.report.table import comparisons_note

    records = [record("a", s, 3.0 + 0.01 * s) for s in range(3)]
    records += [record("b", s, 3.5 + 0.01 * s) for s in range(3)]
    for r in records:  # a budgeted study: b's runs stopped at half the reference's tokens (an extension
        r.tags = {"ablate.tokens": "100000", "ablate.budget_steps": "100"}  # it missed)
    for r in records[3:]:
        r.tags = {"ablate.tokens": "50000", "ablate.budget_steps": "50"}
    ctx = context()
    assert row_diffs(["a", "b"], records)[("", "b")].n == 0  # same seeds, other lengths: no pair
    note = comparisons_note(ctx, records)
    assert note == (
        "Not compared here, their runs being of other lengths: Diff ran 50K tokens, the reference 100K "
        "(`budgets.md` pairs each budget)."
    )
    for r in records:  # no budgets: rows of other lengths on purpose (matched compute) still pair
        r.tags = {"ablate.tokens": r.tags["ablate.tokens"]}
    assert row_diffs(["a", "b"], records)[("", "b")].n == 3
    assert comparisons_note(ctx, records).startswith("1 comparison (each row against the first row")
