"""`ablate bench` at a toy size: the files it writes and what they hold (no timing assertions)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from cli_helpers import assert_one_line_error, run_cli

from ablate.bench import COLUMNS, flop_ceilings, run_bench
from ablate.recipe import load_recipe

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "table6.yaml"


def test_run_bench_writes_csv_markdown_and_plot(tmp_path, capsys):
    folder = run_bench(
        str(RECIPE),
        scale="tiny",
        variants=["transformer", "diff"],
        seq_lens=[64],
        rounds=1,
        out=str(tmp_path / "bench"),
        peak_sizes={torch.bfloat16: (256,), torch.float32: (256,)},
    )
    assert folder == tmp_path / "bench"
    with open(folder / "bench.csv", newline="") as f:
        reader = csv.DictReader(f)
        assert (
            tuple(reader.fieldnames)
            == COLUMNS
            == ("variant", "seq_len", "train_tok_s", "fwd_tok_s", "peak_mem_mb", "mfu")
        )
        rows = list(reader)
    assert [(r["variant"], r["seq_len"]) for r in rows] == [("transformer", "64"), ("diff", "64")]
    for row in rows:
        for key in COLUMNS[2:]:
            assert float(row[key]) > 0, (row, key)
        assert float(row["mfu"]) < 1
    text = (folder / "bench.md").read_text()
    assert "## diff / transformer" in text and "split V" in text and "one product" in text
    assert "| diff " in text and "| transformer " in text
    assert (folder / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "## diff / transformer" in capsys.readouterr().out  # the table is printed too


def test_flop_ceilings_order_the_kernel_forms():
    """Split V doubles the attention core, the wide-V form takes 1.5x, one product is Eq. 1's count:
    the ceilings fall in that order, and the causal ones lie closer to 1 (maps are a smaller share)."""
    runs = {
        r.variant: r
        for r in load_recipe(RECIPE).resolve("small", seeds=[0], variants=["transformer", "diff"])
    }
    ceilings = flop_ceilings(runs["transformer"].config["model"], runs["diff"].config["model"], 1024)
    form = {key.split(" ")[0]: value for key, value in ceilings.items()}  # one / blockwise / V / split
    one, blockwise, wide, split = form["one"], form["blockwise"], form["V"], form["split"]
    assert one[0] == pytest.approx(1.0)
    assert 1.0 > blockwise[0] > wide[0] > split[0] > 0.8
    assert wide[1] > wide[0] and split[1] > split[0]
    # Hand count at d_model 768, 12 layers, N 1024, vocab 8192: forward FLOPs per sequence and the maps' share.
    n, d, layers, vocab, ffn = 1024, 768, 12, 8192, 2048
    maps = layers * 4 * n * n * d
    total = layers * (8 * n * d * d + 6 * n * d * ffn) + maps + 2 * n * d * vocab
    assert split[0] == pytest.approx(total / (total + maps))
    assert wide[0] == pytest.approx(total / (total + maps / 2))
    assert blockwise[0] == pytest.approx(total / (total + maps / 3))


@pytest.mark.parametrize(
    "argv, fragments",
    [
        (["--rounds", "0"], ["--rounds", "positive"]),
        (["--seq-lens", "512", "-4"], ["--seq-lens", "-4"]),
        (["--tokens-per-step", "0"], ["--tokens-per-step"]),
        (["--variants", "transformer", "dif"], ["--variants", "'dif'", "did you mean 'diff'"]),
        (["--backend", "flsh_attn"], ["--backend", "flash_attn"]),
        (["--scale", "huge"], ["--scale", "huge"]),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, fragments):
    code, out, err = run_cli(capsys, "bench", RECIPE, "--out", tmp_path / "bench", *argv)
    assert_one_line_error(code, err, *fragments)
    assert not (tmp_path / "bench").exists()  # nothing measured, nothing written


def test_cli_bench_batches_by_tokens_per_step(tmp_path, capsys):
    """`ablate bench` end to end at a toy size: max(1, tokens // seq_len) sequences per step."""
    code, out, _ = run_cli(
        capsys, "bench", RECIPE, "--scale", "tiny", "--variants", "diff", "transformer", "--seq-lens", "32", "96",
        "--rounds", "1", "--tokens-per-step", "64", "--backend", "math", "--out", tmp_path / "b",
    )
    assert code == 0
    rows = list(csv.DictReader(open(tmp_path / "b" / "bench.csv", newline="")))
    assert [(r["variant"], r["seq_len"]) for r in rows] == [
        ("diff", "32"), ("transformer", "32"), ("diff", "96"), ("transformer", "96")
    ]
    text = (tmp_path / "b" / "bench.md").read_text()
    assert "| diff        | 32      |     2 |" in text and "| diff        | 96      |     1 |" in text, text
    assert "## transformer / diff" in out and "diff `math`, transformer `math`" in out
