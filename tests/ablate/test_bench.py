"""`ablate bench` at a toy size: the files it writes and what they hold (no timing assertions), on the
CPU for both answers of the bf16 capability (forced), and on the CUDA path's logic through a stand-in
of `torch.cuda` and a clock that ticks one second per read."""

from __future__ import annotations

import csv
import math
import re
import warnings
from pathlib import Path

import pytest
import torch
from cli_helpers import assert_one_line_error, run_cli

from ablate.bench.ceilings import flop_ceilings
from ablate.bench.measure import matmul_peak
from ablate.bench.results import COLUMNS, PEAK_SUSPECT, model_flop_utilization
from ablate.core.errors import UserError
from ablate.hardware.device import CpuOps, CudaOps, device_ops
from ablate.hardware.precision import ENV, autocast
from ablate.model.cost import model_cost
from ablate.recipe.loading import load_recipe
from ablate.sweep.estimate import calibrate
from ablate.verbs.bench import run_bench

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "table6.yaml"
TINY_PEAK = {"peak_budget_s": 0.05, "peak_max_size": 256}  # seconds, not minutes, where bf16 is emulated


def _bench_two_rows(**options) -> Path:
    """`run_bench` of Table 6's transformer and diff rows at the tiny scale, the peak timed in seconds."""
    return run_bench(str(RECIPE), scale="tiny", variants=["transformer", "diff"], **TINY_PEAK, **options)


@pytest.mark.parametrize(
    "native, precision, dtype", [("1", "bf16-mixed", "bf16"), ("0", "32-true", "float32")]
)
def test_run_bench_writes_csv_markdown_and_plot(tmp_path, capsys, monkeypatch, native, precision, dtype):
    """`auto` follows the (forced) capability: the precision, its reason and the peak MFU is taken against
    are printed and written; progress lines come one per arm and round."""
    monkeypatch.setenv(ENV, native)
    folder = _bench_two_rows(
        seq_lens=[64],
        rounds=1,
        out=str(tmp_path / "bench"),
        tokens_per_step=256,  # 4 x 64: seconds where bf16 is emulated, too
        device="cpu",
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
        for key in COLUMNS[2:-1]:
            assert float(row[key]) > 0, (row, key)
        mfu = float(row["mfu"])
        assert math.isnan(mfu) or 0 < mfu <= 1  # the suspect-peak rule: never above 100%
    text = (folder / "bench.md").read_text()
    why = f"{ENV}={native} forces"
    assert f"precision {precision} ({why}" in text and f"MFU is against the {dtype} peak" in text, text
    assert bool(re.search(r"bf16 \d", text)) == (native == "1")  # the bf16 peak: measured only when bf16 ran
    out = capsys.readouterr().out
    assert out.startswith(f"precision: {precision} ({why}")
    assert "[bench] transformer seq_len 64 round 1/1: train " in out and "left" in out
    assert "[bench] diff seq_len 64 round 1/1: train " in out
    assert "## diff / transformer" in out  # the table is printed too
    assert "## diff / transformer" in text and "split V" in text and "one product" in text
    assert "| diff " in text and "| transformer " in text
    assert (folder / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_default_rows_hold_the_scales_training_length():
    from ablate.bench.measure import default_seq_lens
    from ablate.recipe.loading import load_recipe

    lens = {scale: default_seq_lens(load_recipe(RECIPE, scale=scale)) for scale in ("cpu", "tiny", "small")}
    assert lens == {
        "cpu": [256, 512, 1024, 2048, 4096],
        "tiny": [256, 512, 1024, 2048, 4096],
        "small": [512, 1024, 2048, 4096],
    }


def test_the_kernel_is_named_per_sequence_length_where_auto_chooses_by_length():
    """`auto` picks diff's CPU core by sequence length (`combined` up to 256): the markdown names each kernel
    with its lengths, and each ratios.csv row the kernel that ran at its length."""
    from ablate.bench.results import _kernels_by_length, ratios

    kernel_at = {("transformer", 256): "sdpa", ("transformer", 512): "sdpa"}
    kernel_at |= {("diff", 256): "combined", ("diff", 512): "sdpa_padded"}
    assert _kernels_by_length("transformer", kernel_at) == "sdpa"
    assert _kernels_by_length("diff", kernel_at) == "combined at 256; sdpa_padded at 512"
    rows = [
        {"variant": v, "seq_len": n, "train_tok_s": 2.0, "fwd_tok_s": 2.0, "peak_mem_mb": 2.0}
        for v in ("transformer", "diff")
        for n in (256, 512)
    ]
    kernels = [
        (r["seq_len"], r["kernel"], r["reference_kernel"])
        for r in ratios(rows, ["transformer", "diff"], kernel_at)
    ]
    assert kernels == [(256, "combined", "sdpa"), (512, "sdpa_padded", "sdpa")]


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
        (["--precision", "bf17-mixed"], ["--precision", "'bf17-mixed'", "32-true"]),
        (["--precision", "64-true"], ["--precision", "'64-true'", "auto"]),
        (["--device", "tpu"], ["--device", "'tpu'", "cuda:N"]),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, fragments):
    code, out, err = run_cli(capsys, "bench", RECIPE, "--out", tmp_path / "bench", *argv)
    assert_one_line_error(code, err, *fragments)
    assert not (tmp_path / "bench").exists()  # nothing measured, nothing written


def test_cli_bench_batches_by_tokens_per_step(tmp_path, capsys):
    """`ablate bench` end to end at a toy size: max(1, tokens // seq_len) sequences per step."""
    code, out, _ = run_cli(
        capsys,
        "bench",
        RECIPE,
        "--scale",
        "tiny",
        "--variants",
        "diff",
        "transformer",
        "--seq-lens",
        "32",
        "96",
        "--rounds",
        "1",
        "--tokens-per-step",
        "64",
        "--backend",
        "math",
        "--out",
        tmp_path / "b",
        "--device",
        "cpu",
        "--precision",
        "32-true",
    )
    assert code == 0
    assert out.startswith("precision: 32-true (as requested)\n"), out
    rows = list(csv.DictReader(open(tmp_path / "b" / "bench.csv", newline="")))
    assert [(r["variant"], r["seq_len"]) for r in rows] == [
        ("diff", "32"),
        ("transformer", "32"),
        ("diff", "96"),
        ("transformer", "96"),
    ]
    text = (tmp_path / "b" / "bench.md").read_text()
    assert "| diff        | 32      |     2 |" in text and "| diff        | 96      |     1 |" in text, text
    assert "## transformer / diff" in out and "diff `math`, transformer `math`" in out


# --- the device seam ----------------------------------------------------------------------------------


class StandInCuda:
    """What `CudaOps` calls on `torch.cuda`, recording the calls in order; `clock` ticks one second per
    read, so every timed region lasts a known number of seconds."""

    def __init__(self, available: bool = True, allocated: int = 2**20, peak_growth: int = 3 * 2**20):
        self.available, self.allocated, self.peak_growth = available, allocated, peak_growth
        self.calls: list[str] = []
        self.time = 0.0

    def clock(self) -> float:
        self.calls.append("clock")
        self.time += 1.0
        return self.time

    def is_available(self) -> bool:
        return self.available

    def synchronize(self, device=None) -> None:
        self.calls.append("synchronize")

    def memory_allocated(self, device=None) -> int:
        self.calls.append("memory_allocated")
        return self.allocated

    def reset_peak_memory_stats(self, device=None) -> None:
        self.calls.append("reset_peak_memory_stats")

    def max_memory_allocated(self, device=None) -> int:
        self.calls.append("max_memory_allocated")
        return self.allocated + self.peak_growth

    def get_device_name(self, device=None) -> str:
        return "Stand-in GPU"


def _every_clock_read_synchronized(calls: list[str]) -> bool:
    reads = [i for i, call in enumerate(calls) if call == "clock"]
    return bool(reads) and all(calls[i - 1] == "synchronize" for i in reads)


def test_device_selection_takes_the_device_as_input():
    assert isinstance(device_ops("cpu"), CpuOps)
    assert isinstance(device_ops(None, cuda=StandInCuda(available=False)), CpuOps)  # default: no CUDA here
    for name, default in (("cuda", None), ("cuda:1", None), (None, "cuda")):
        ops = device_ops(name, cuda=StandInCuda(available=True))
        assert isinstance(ops, CudaOps) and ops.device == torch.device(name or default)
    with pytest.raises(UserError, match="--device: 'cuda' asked for, but no CUDA device"):
        device_ops("cuda", cuda=StandInCuda(available=False))
    for bad in ("tpu", "cpu:3", "cuda:x"):
        with pytest.raises(UserError, match=f"--device: '{bad}'"):
            device_ops(bad, cuda=StandInCuda())


def test_cuda_path_synchronizes_around_every_timed_region_and_reads_the_cuda_peak(tmp_path, capsys):
    """`run_bench` through `CudaOps` (tensors on the CPU, `torch.cuda` a stand-in): each clock read is
    preceded by a synchronize, so a step's region covers the device's queued work; peak memory is
    max_memory_allocated after reset_peak_memory_stats, above what was allocated before. The clock ticks
    1 s per read, so a training step (3 reads) takes 2 s, a forward 1 s, one peak product 1 s: the
    tokens/s are known exactly, and the peak (2 x 128^3 FLOP/s) is below the model's own rate, so MFU is
    reported as suspect."""
    cuda = StandInCuda()
    ops = CudaOps(torch.device("cpu"), cuda=cuda, clock=cuda.clock)
    folder = _bench_two_rows(
        seq_lens=[32],
        rounds=2,
        out=str(tmp_path / "b"),
        tokens_per_step=64,
        precision="32-true",
        retries=0,
        ops=ops,
    )
    assert _every_clock_read_synchronized(cuda.calls)
    assert (
        cuda.calls.count("reset_peak_memory_stats") == cuda.calls.count("max_memory_allocated") == 2
    )  # per arm
    rows = list(csv.DictReader(open(folder / "bench.csv", newline="")))
    (run,) = load_recipe(RECIPE).resolve("tiny", seeds=[0], variants=["transformer"])
    achieved = 3 * model_cost(run.config["model"], 32).fwd_flops_per_token * 64 / 2.0
    assert achieved > 2 * 128**3  # the premise: the stand-in clock's peak is below the model's own rate
    for row in rows:
        assert float(row["train_tok_s"]) == pytest.approx(64 / 2.0)  # 2 x 32 tokens per step, 2 s
        assert float(row["fwd_tok_s"]) == pytest.approx(64 / 1.0)
        assert float(row["peak_mem_mb"]) == pytest.approx(3.0)
        assert math.isnan(float(row["mfu"]))
    text = (folder / "bench.md").read_text()
    assert text.count(PEAK_SUSPECT) >= 3 and "Stand-in GPU" in text  # two rows and the legend
    assert "float32 0.000 TFLOP/s" in text  # 2 x 128^3 FLOP in one 1-s tick


def test_cpu_ops_peak_bytes_counts_the_allocator_growth():
    """The CPU allocator's records: a 4 MiB tensor made and freed inside the work is the peak growth."""

    def work():
        x = torch.empty(2**20, dtype=torch.float32)
        x.fill_(1.0)
        del x

    peak = CpuOps().peak_bytes(work)
    assert 4 * 2**20 <= peak < 5 * 2**20


def test_autocast_follows_the_device_and_the_precision():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # constructing CUDA autocast without CUDA warns; it is not entered
        cuda_bf16 = autocast(torch.device("cuda", 0), "bf16-mixed")
        assert (cuda_bf16.device, cuda_bf16.fast_dtype) == ("cuda", torch.bfloat16)
    cpu_fp16 = autocast("cpu", "16-mixed")
    assert (cpu_fp16.device, cpu_fp16.fast_dtype) == ("cpu", torch.float16)
    with autocast("cpu", "32-true"):  # no autocast at all
        assert not torch.is_autocast_enabled("cpu")
        assert torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype == torch.float32


def test_mfu_is_suspect_when_the_peak_is_below_the_models_rate():
    assert model_flop_utilization(1e9, 4e9) == 0.25
    assert model_flop_utilization(4e9, 4e9) == 1.0
    assert math.isnan(model_flop_utilization(4.1e9, 4e9))


def test_matmul_peak_stops_at_its_budget_and_its_size_limit(monkeypatch):
    """Sizes double from 128 while allowed: with a clock of 1 s per read and a 0.5 s budget, one size
    (128) and one product; with a real clock and a size limit of 64, one size (64)."""
    cuda = StandInCuda()
    ops = CudaOps(torch.device("cpu"), cuda=cuda, clock=cuda.clock)
    assert matmul_peak(torch.float32, ops, budget_s=0.5) == 2 * 128**3
    assert cuda.calls.count("clock") == 3  # the deadline, then one product's start and end
    sizes = []
    real = CpuOps()
    original = torch.randn

    def recording_randn(*shape, **kw):
        sizes.append(shape[0])
        return original(*shape, **kw)

    monkeypatch.setattr(torch, "randn", recording_randn)
    assert matmul_peak(torch.float32, real, budget_s=0.05, max_size=64) > 0
    assert set(sizes) == {64}


def test_calibration_times_on_the_device_clock_in_the_chosen_precision(monkeypatch):
    """The sweep's estimate: training FLOPs of one calibration step / the fastest step on the device's
    (synchronised) clock; the precision follows the same rule as training and `ablate bench`."""
    monkeypatch.setenv(ENV, "0")
    overrides = [("scales.tiny.train.precision", "auto"), ("scales.tiny.train.micro_batch_size", 1)]
    (run,) = load_recipe(RECIPE, overrides).resolve("tiny", seeds=[0], variants=["diff"])
    cuda = StandInCuda()
    rate, precision, why = calibrate(
        run, repeats=2, ops=CudaOps(torch.device("cpu"), cuda=cuda, clock=cuda.clock)
    )
    train = run.train
    step_flops = 3 * model_cost(run.config["model"], train.seq_len).fwd_flops_per_token * train.seq_len
    assert rate == pytest.approx(step_flops * train.micro_batch_size / 1.0)  # each step: 1 s on the stand-in
    assert (precision, why) == (
        "32-true",
        f"{ENV}=0 forces no native bf16: bf16 would be emulated, many times slower",
    )
    assert _every_clock_read_synchronized(cuda.calls)


def test_a_long_step_still_says_it_is_running():
    """A step longer than the interval prints lines while it runs; a short one prints none. The body waits
    for the third line, not for a span of time: a busy machine may run the beating thread late (pytest's
    timeout guards a hang)."""
    import time

    from ablate.bench.measure import StillRunning

    lines: list[str] = []
    with StillRunning(lines.append, "warm-up 1/2: diff seq_len 1024", every=0.05):
        while len(lines) < 3:
            time.sleep(0.01)
    assert len(lines) >= 3 and lines[0].startswith("[bench] warm-up 1/2: diff seq_len 1024: still running, ")
    quiet: list[str] = []
    with StillRunning(quiet.append, "round", every=600.0):
        pass
    assert quiet == []
