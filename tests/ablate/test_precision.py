"""The precision rule, with the device and its capability as inputs: both kinds of CPU (text of
/proc/cpuinfo), CUDA with and without bf16 (a stand-in of `torch.cuda`), and the environment's override;
then a real training run that prints and records what was chosen."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from mini_project import write_recipe

from ablate.core.config import PRECISIONS
from ablate.core.errors import UserError
from ablate.hardware.precision import (
    ENV,
    cache_dir,
    choose_precision,
    compute_dtype,
    cpu_bf16_flags,
    machine_key,
    measured_rates,
    native_bf16,
    training_device,
)
from ablate.recipe.loading import load_recipe
from ablate.store.stores import Stores
from ablate.train.config import TrainConfig
from ablate.train.run import train_run

# Two logical CPUs each, flags lines as Linux prints them (shortened in the middle, the bf16 flags kept).
ZEN3_AVX2 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13
flags\t\t: fpu vme de pse tsc msr sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 bmi2 sha_ni vaes clzero
bugs\t\t: sysret_ss_attrs

processor\t: 1
model name\t: AMD EPYC 7B13
flags\t\t: fpu vme de pse tsc msr sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 bmi2 sha_ni vaes clzero
"""
ZEN4_AVX512_BF16 = ZEN3_AVX2.replace("avx2 bmi2", "avx2 avx512f avx512bw avx512_bf16 bmi2")
SAPPHIRE_RAPIDS_AMX = ZEN3_AVX2.replace(
    "avx2 bmi2", "avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8 bmi2"
)
# A flag's name inside another word, or in another line, is not the flag.
LOOKALIKE = ZEN3_AVX2.replace("bugs\t\t: sysret_ss_attrs", "bugs\t\t: avx512_bf16").replace(
    "clzero", "xamx_bf16"
)

NO_ENV: dict[str, str] = {}


class StandInCuda:
    def __init__(self, bf16: bool):
        self.bf16 = bf16

    def is_bf16_supported(self) -> bool:
        return self.bf16


@pytest.mark.parametrize(
    "cpuinfo, flags",
    [
        (ZEN3_AVX2, []),
        (ZEN4_AVX512_BF16, ["avx512_bf16"]),
        (SAPPHIRE_RAPIDS_AMX, ["amx_bf16", "avx512_bf16"]),
        (LOOKALIKE, []),
        ("", []),
    ],
)
def test_cpu_flags_are_read_from_the_flags_lines(cpuinfo, flags):
    assert cpu_bf16_flags(cpuinfo) == flags


def test_native_bf16_on_each_kind_of_cpu():
    assert native_bf16("cpu", cpuinfo=ZEN3_AVX2, environ=NO_ENV) == (False, "CPU without AMX/AVX512-BF16")
    assert native_bf16(torch.device("cpu"), cpuinfo=ZEN4_AVX512_BF16, environ=NO_ENV) == (
        True,
        "CPU has AMX/AVX512-BF16: avx512_bf16",
    )
    assert native_bf16("cpu", cpuinfo=SAPPHIRE_RAPIDS_AMX, environ=NO_ENV) == (
        True,
        "CPU has AMX/AVX512-BF16: amx_bf16, avx512_bf16",
    )


def test_native_bf16_on_cuda_asks_the_device():
    assert native_bf16("cuda", environ=NO_ENV, cuda=StandInCuda(True)) == (True, "CUDA device supports bf16")
    native, why = native_bf16(torch.device("cuda", 1), environ=NO_ENV, cuda=StandInCuda(False))
    assert not native and "compute capability under 8.0" in why
    assert native_bf16("mps", environ=NO_ENV)[0] is False  # unknown devices: float32, the safe choice


def test_the_environment_forces_the_answer_whatever_the_device():
    for value, native in (("1", True), ("0", False)):
        for device, kw in (
            ("cpu", {"cpuinfo": ZEN3_AVX2}),
            ("cpu", {"cpuinfo": SAPPHIRE_RAPIDS_AMX}),
            ("cuda", {"cuda": StandInCuda(not native)}),
        ):
            answer, why = native_bf16(device, environ={ENV: value}, **kw)
            assert answer is native and why.startswith(f"{ENV}={value} forces"), why
    with pytest.raises(UserError, match=f"{ENV}: expected 1 or 0, got 'yes'"):
        native_bf16("cpu", environ={ENV: "yes"}, cpuinfo=ZEN3_AVX2)


@pytest.mark.parametrize(
    "requested, cpuinfo, chosen, fragments",
    [
        ("auto", SAPPHIRE_RAPIDS_AMX, "bf16-mixed", ["AMX/AVX512-BF16: amx_bf16, avx512_bf16"]),
        (
            "auto",
            ZEN3_AVX2,
            "32-true",
            ["CPU without AMX/AVX512-BF16: bf16 would be emulated, many times slower"],
        ),
        ("bf16-mixed", ZEN3_AVX2, "bf16-mixed", ["as requested; warning: CPU without", "emulated and slow"]),
        ("bf16-true", ZEN3_AVX2, "bf16-true", ["as requested; warning:"]),
        ("bf16-mixed", ZEN4_AVX512_BF16, "bf16-mixed", ["as requested"]),
        ("32-true", SAPPHIRE_RAPIDS_AMX, "32-true", ["as requested"]),
        ("16-mixed", ZEN3_AVX2, "16-mixed", ["as requested"]),
    ],
)
def test_choose_precision_on_cpu(requested, cpuinfo, chosen, fragments):
    bf16_faster = {"float32": 100.0, "bfloat16": 300.0}  # as measured on a CPU with AMX
    precision, why = choose_precision(requested, "cpu", cpuinfo=cpuinfo, environ=NO_ENV, rates=bf16_faster)
    assert precision == chosen
    for fragment in fragments:
        assert fragment in why, why
    assert ("warning" in why) == (requested.startswith("bf16") and cpuinfo is ZEN3_AVX2)


def test_auto_chooses_by_measurement_where_the_flags_mislead():
    """A CPU with AVX512-BF16 whose bf16 products are slower than float32 ones gets float32, and the reason
    names both rates; forced by the environment, nothing is measured (rates=None would measure)."""
    slower = {"float32": 180.0, "bfloat16": 95.0}
    precision, why = choose_precision("auto", "cpu", cpuinfo=ZEN4_AVX512_BF16, environ=NO_ENV, rates=slower)
    assert precision == "32-true"
    assert why.startswith("CPU has AMX/AVX512-BF16: avx512_bf16, but measured 512x512 matmul: bf16 95, ")
    assert "float32 180 GFLOP/s" in why and why.endswith("float32 is faster here")
    faster = {"float32": 95.0, "bfloat16": 180.0}
    assert choose_precision("auto", "cpu", cpuinfo=ZEN4_AVX512_BF16, environ=NO_ENV, rates=faster)[0] == (
        "bf16-mixed"
    )
    assert choose_precision("auto", "cpu", cpuinfo=ZEN3_AVX2, environ={ENV: "1"}) == (
        "bf16-mixed",
        f"{ENV}=1 forces native bf16",
    )


def test_the_matmul_rates_are_measured_once_per_machine_and_cached(tmp_path):
    rates = measured_rates(tmp_path)
    assert set(rates) == {"float32", "bfloat16"} and all(v > 0 for v in rates.values())
    cached = json.loads((tmp_path / "precision.json").read_text())
    assert cached == {machine_key(): rates}
    cached[machine_key()] = {"float32": 1.0, "bfloat16": 2.0}  # a second call reads the cache, not the CPU
    (tmp_path / "precision.json").write_text(json.dumps(cached))
    assert measured_rates(tmp_path) == {"float32": 1.0, "bfloat16": 2.0}
    assert str(torch.get_num_threads()) in machine_key() and torch.__version__ in machine_key()
    assert cache_dir({"XDG_CACHE_HOME": "/c"}) == Path("/c/ablate")
    assert cache_dir({"ABLATE_CACHE_DIR": "/d", "XDG_CACHE_HOME": "/c"}) == Path("/d")


def test_choose_precision_on_cuda_and_bad_input():
    assert choose_precision("auto", "cuda", environ=NO_ENV, cuda=StandInCuda(True))[0] == "bf16-mixed"
    assert choose_precision("auto", "cuda:0", environ=NO_ENV, cuda=StandInCuda(False))[0] == "32-true"
    with pytest.raises(UserError, match="train.precision: 'bf16' is not one of auto, bf16-mixed, 32-true"):
        choose_precision("bf16", "cpu", key="train.precision", environ=NO_ENV, cpuinfo=ZEN3_AVX2)


def test_training_device_and_compute_dtype():
    assert training_device("auto", cuda_available=True) == "cuda"
    assert training_device("auto", cuda_available=False) == "cpu"
    assert (training_device("gpu"), training_device("cuda"), training_device("cpu")) == (
        "cuda",
        "cuda",
        "cpu",
    )
    assert [compute_dtype(p) for p in PRECISIONS[1:]] == [
        torch.bfloat16,
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.float64,
    ]


def test_auto_is_the_default_and_the_recipes_base():
    fields = {"seq_len": 8, "batch_tokens": 8, "micro_batch_size": 1, "steps": 1, "lr": 1e-3}
    assert TrainConfig(**fields).precision == "auto"
    recipe = load_recipe(Path(__file__).resolve().parents[2] / "recipes" / "table6.yaml")
    precisions = {
        scale: recipe.resolve(scale, seeds=[0], variants=["diff"])[0].train.precision
        for scale in ("small", "tiny")
    }
    assert precisions == {"small": "auto", "tiny": "32-true"}  # tiny keeps its explicit float32


def test_training_prints_and_records_the_chosen_precision(tmp_path, monkeypatch, capsys):
    """A real run of the miniature recipe at `precision: auto` with the capability forced off: 32-true,
    printed once and tagged in MLflow with its reason."""
    monkeypatch.setenv(ENV, "0")
    recipe = write_recipe(
        tmp_path, base__train__precision="auto", base__train__steps=2, base__train__val_every=2
    )
    (run,) = load_recipe(recipe).resolve(None, seeds=[0], variants=["transformer"])
    assert run.train.precision == "auto"
    workspace = tmp_path / "ws"
    result = train_run(run, Stores(workspace), progress=False)
    why = f"{ENV}=0 forces no native bf16: bf16 would be emulated, many times slower"
    assert f"precision: 32-true ({why})\n" in capsys.readouterr().out
    client = Stores(workspace).client()
    tags = client.get_run(result.run_id).data.tags
    assert (tags["ablate.precision"], tags["ablate.precision_reason"]) == ("32-true", why)
