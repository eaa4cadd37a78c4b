"""What a run trains on is decided once (ablate.train.choices.decided), and everything else reads that
decision: the run's tags name the precision, backend and compiling that trained, never the recipe's `auto`
or `compile: true`, on a stand-in CUDA card (the attention choice's timer seam, as in
test_attention_choice.py) and on the CPU; the sweep's time estimate calibrates in the precision the run
decides, by the same function (`placement`), reading the same measured step timings."""

from __future__ import annotations

import pytest
from mini_project import write_recipe

import ablate.train.choices.precision as step_precision
from ablate.core.workspace import Workspace
from ablate.hardware.precision import ENV
from ablate.recipe.loading import load_recipe
from ablate.store import names
from ablate.sweep.estimate import calibrate
from ablate.train import records
from ablate.train.choices.decided import Placement, decide

CARD = "NVIDIA H200|sm90|torch=2.11"


def _run(tmp_path, **changes):
    (run,) = load_recipe(write_recipe(tmp_path, **changes)).resolve(None, seeds=[0], variants=["diff"])
    return run


def test_the_tags_name_the_measured_backend_and_compiling_not_the_recipes(tmp_path, monkeypatch):
    """`attention_backend: auto` with `compile: true` on a stand-in card where eager cuDNN measured fastest:
    the run trains eager on cuDNN in bf16, and its tags say so, where tags read off the recipe would name
    `auto`'s rule (flash on CUDA), compiling and the recipe's float32."""
    run = _run(tmp_path, base__model__attention_backend="auto", base__train__compile=True)

    def timer(model, train, precision, device):
        return 0.010 if (model.attention_backend, train.compile) == ("sdpa_cudnn", False) else 0.050

    where = Placement("cuda", "bf16-mixed", "a stand-in card")
    decided = decide(run, Workspace(tmp_path / "ws"), where=where, timer=timer, device_key=CARD)
    monkeypatch.setattr(records, "machine_description", lambda device: f"a stand-in {device} card")
    tags = records.run_tags(run, decided)

    assert (decided.model.attention_backend, decided.train.compile) == ("sdpa_cudnn", False)
    assert tags[names.ATTENTION_KERNEL] == "sdpa_cudnn"
    assert tags[names.COMPILED] == "false" and run.train.compile is True
    assert tags[names.ATTENTION_CHOICE] == "sdpa_cudnn (fastest whole step, measured)"
    assert (tags[names.PRECISION], tags[names.PRECISION_REASON]) == ("bf16-mixed", "a stand-in card")
    # what tags read off the recipe would have said instead: each differs from what trained
    assert records.run_attention_kernel(run.model, run.train.seq_len, where) != "sdpa_cudnn"
    assert run.train.precision == "32-true"


@pytest.mark.parametrize("compile", ["auto", True])
def test_on_a_cpu_the_tags_say_how_the_run_trains_and_name_no_measured_choice(tmp_path, compile):
    """Off CUDA nothing is measured: `compile: auto` trains eager and `true` compiled, as the tags say; no
    attention choice or timings are tagged, and the kernel is the one `auto` resolves to on the CPU."""
    run = _run(tmp_path, base__model__attention_backend="auto", base__train__compile=compile)
    decided = decide(run, Workspace(tmp_path / "ws"), where=Placement("cpu", "32-true", "as requested"))
    tags = records.run_tags(run, decided)

    assert decided.choice is None and decided.model == run.model
    assert tags[names.COMPILED] == ("true" if compile is True else "false")
    assert names.ATTENTION_CHOICE not in tags and names.ATTENTION_TIMINGS_MS not in tags
    where = Placement("cpu", "32-true", "")
    assert tags[names.ATTENTION_KERNEL] == records.run_attention_kernel(run.model, run.train.seq_len, where)
    assert tags[names.ATTENTION_KERNEL] != "triton"


@pytest.mark.parametrize(("f32", "bf16", "chosen"), [(0.020, 0.010, "bf16-mixed"), (0.010, 0.020, "32-true")])
def test_the_estimate_calibrates_in_the_precision_the_run_decides(tmp_path, monkeypatch, f32, bf16, chosen):
    """`precision: auto` on a stand-in CPU claiming native bf16: the run's whole step, timed both ways once
    (injected timings, cached in the user's cache folder), decides; the sweep's estimate calibrates in the
    precision the run's `decide` places it in, for the same reason, read from the same cache."""
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setenv("ABLATE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(step_precision, "native_bf16", lambda device, **_: (True, "a stand-in CPU"))
    run = _run(tmp_path, base__train__precision="auto", base__train__accelerator="cpu")
    timed = []

    def timer(model, train, precision):
        timed.append(precision)
        return {"32-true": f32, "bf16-mixed": bf16}[precision]

    step_precision.step_timings(run.model, run.train, timer=timer)  # measured once, into the cache
    decided = decide(run, Workspace(tmp_path / "ws"))
    _, precision, why = calibrate(run, repeats=1)

    assert (precision, why) == (decided.where.precision, decided.where.reason)
    assert precision == chosen and timed == ["32-true", "bf16-mixed"]  # both read the cached timings
    assert f"32-true {f32 * 1e3:.1f} ms, bf16-mixed {bf16 * 1e3:.1f} ms" in why
