"""The task report's numbers (Table 2, Table 3, Figure 5) against statistics computed here with scipy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as st

from ablate.report.tasks import accuracy_table, attention_table, heatmap_grids, plot_heatmaps

ORDER = ["transformer", "diff"]
LABELS = {"transformer": "Transformer", "diff": "Diff"}


def _metrics(seed: int, variant: str, rng: np.random.Generator) -> dict[str, float]:
    m = {}
    for level in ("N1R1", "N6R2"):
        for depth in (0, 50, 100):
            for length in (128, 256):
                m[f"val/accuracy_cell/level_{level}/depth_{depth}/length_{length}"] = float(rng.uniform())
        m[f"val/accuracy/level_{level}"] = float(rng.uniform())
    m["val/accuracy"] = float(rng.uniform())
    if variant == "diff":
        for depth in (0, 50, 100):
            m[f"attn/answer_share/depth_{depth}"] = float(rng.uniform(0, 0.5))
            m[f"attn/noise_share/depth_{depth}"] = float(rng.uniform(0, 0.5))
    return m


@pytest.fixture
def metrics():
    rng = np.random.default_rng(0)
    return {(v, s): _metrics(s, v, rng) for v in ORDER for s in (0, 1, 2)}


def _ci(values) -> tuple[float, float, float]:
    x = np.asarray(values, dtype=np.float64)
    half = st.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
    return x.mean(), x.mean() - half, x.mean() + half


def _bounded_ci(values, upper: bool) -> tuple[float, float, float]:
    """Student-t on the logit (values in [0, 1]) or log (values >= 0) scale, mapped back."""
    x = np.asarray(values, dtype=np.float64)
    if upper:
        u = np.clip(x, 1e-3, 1 - 1e-3)
        _, lo, hi = _ci(np.log(u / (1 - u)))
        lo, hi = 1 / (1 + math.exp(-lo)), 1 / (1 + math.exp(-hi))
    else:
        _, lo, hi = _ci(np.log(np.maximum(x, 1e-3 * x.max())))
        lo, hi = math.exp(lo), math.exp(hi)
    return x.mean(), min(lo, x.mean()), max(hi, x.mean())


def test_bounded_intervals_stay_inside_their_bounds():
    from ablate.report.stats import bounded_mean_ci

    for values in ([0.9, 0.6, 0.0], [1.0, 1.0, 0.8], [0.02, 0.0, 0.05], [0.3, 0.5, 0.4, 0.45]):
        iv = bounded_mean_ci(values, 0.0, 1.0)
        assert 0.0 <= iv.lo <= iv.mean <= iv.hi <= 1.0
        assert (iv.mean, iv.lo, iv.hi) == pytest.approx(_bounded_ci(values, True))
        assert _ci(values)[1] < 0 or _ci(values)[2] > 1 or values[-1] == 0.45  # the t interval would leave
    iv = bounded_mean_ci([0.01, 0.3, 0.02], 0.0)
    assert iv.lo > 0 and (iv.mean, iv.lo, iv.hi) == pytest.approx(_bounded_ci([0.01, 0.3, 0.02], False))
    same = bounded_mean_ci([0.5, 0.5], 0.0, 1.0)
    assert same.lo == pytest.approx(0.5) and same.hi == pytest.approx(0.5)


def test_accuracy_table_means_intervals_and_paired_differences(metrics):
    text, rows = accuracy_table(ORDER, LABELS, metrics)
    assert "level N1R1" in text and "level N6R2" in text and "(reference)" in text
    row = {(r["variant"], r["column"]): r for r in rows}
    for variant in ORDER:
        for column, name in (("level N6R2", "val/accuracy/level_N6R2"), ("all", "val/accuracy")):
            mean, lo, hi = _bounded_ci([metrics[(variant, s)][name] for s in (0, 1, 2)], upper=True)
            r = row[(variant, column)]
            assert (r["mean"], r["lo"], r["hi"]) == pytest.approx((mean, lo, hi)) and r["seeds"] == 3
    diffs = [
        metrics[("diff", s)]["val/accuracy/level_N1R1"]
        - metrics[("transformer", s)]["val/accuracy/level_N1R1"]
        for s in (0, 1, 2)
    ]
    mean, lo, hi = _ci(diffs)
    r = row[("diff", "level N1R1")]
    assert (r["diff_vs_first"], r["diff_lo"], r["diff_hi"]) == pytest.approx((mean, lo, hi))
    assert math.isnan(row[("transformer", "all")]["diff_vs_first"])
    with_paper, _ = accuracy_table(ORDER, LABELS, metrics, {"diff": {"N1R1": 1.0, "N6R2": 0.85}})
    assert "paper (N1R1 / N6R2)" in with_paper and "1.00 / 0.85" in with_paper and "paper" not in text
    # every (row, column) against the first row is one family for Holm's step-down, written here
    tested = sorted((r["p_value"], k) for k, r in row.items() if not math.isnan(r["p_value"]))
    survive = set()
    for i, (p, key) in enumerate(tested):
        if p > 0.05 / (len(tested) - i):
            break
        survive.add(key)
    assert {k for k, r in row.items() if r["holm_survives"] == "true"} == survive
    assert f"{len(tested)} comparisons (each row against the first, each column)" in text


def test_a_failed_seed_is_left_out_of_the_pairs(metrics):
    del metrics[("diff", 2)]
    _, rows = accuracy_table(ORDER, LABELS, metrics)
    r = next(r for r in rows if r["variant"] == "diff" and r["column"] == "all")
    diffs = [
        metrics[("diff", s)]["val/accuracy"] - metrics[("transformer", s)]["val/accuracy"] for s in (0, 1)
    ]
    assert r["seeds"] == 2 and r["diff_vs_first"] == pytest.approx(np.mean(diffs))


def test_attention_table_per_depth_and_variants_without_maps(metrics):
    text, rows = attention_table(ORDER, LABELS, metrics)
    mean, lo, hi = _bounded_ci(
        [metrics[("diff", s)]["attn/noise_share/depth_50"] for s in (0, 1, 2)], upper=False
    )
    row = next(r for r in rows if r["variant"] == "diff" and r["share"] == "noise" and r["depth"] == "50%")
    assert (row["mean"], row["lo"], row["hi"]) == pytest.approx((mean, lo, hi))
    noise_row = next(line for line in text.splitlines() if line.startswith("| Diff") and "noise" in line)
    cells = [c.strip() for c in noise_row.strip("|").split("|")]
    assert cells[3] == f"{mean:.3f} [{lo:.3f}, {hi:.3f}]".replace("-", "\u2212")  # columns 0%, 50%, 100%
    assert "Not available for Transformer" in text
    empty = {k: {n: v for n, v in m.items() if not n.startswith("attn/")} for k, m in metrics.items()}
    assert "No attention shares" in attention_table(ORDER, LABELS, empty)[0]


def test_heatmap_grid_is_the_mean_over_seeds(metrics, tmp_path):
    grids = heatmap_grids(ORDER, metrics)
    h = grids["diff"]
    assert (
        h["levels"] == ["N1R1", "N6R2"]
        and h["depths"] == ["0", "50", "100"]
        and h["lengths"] == ["128", "256"]
    )
    expected = np.mean(
        [metrics[("diff", s)]["val/accuracy_cell/level_N6R2/depth_100/length_128"] for s in (0, 1, 2)]
    )
    assert h["grids"][1, 2, 0] == pytest.approx(expected)
    paths = plot_heatmaps(ORDER, LABELS, metrics, tmp_path)
    assert [p.name for p in paths] == ["heatmap_transformer.png", "heatmap_diff.png"]
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in paths)
