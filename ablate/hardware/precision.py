"""Precision by the device's capability: bf16 autocast where the device runs bf16 natively, float32 elsewhere.

One rule for training, `ablate bench` and the sweep's calibration. bf16 on a CPU without native bf16
instructions (AVX2 only: no AMX-BF16, no AVX512-BF16) is emulated: measured about 75x slower than
float32 for square GEMMs on an AMD EPYC (Zen 3), so `auto` must not pick it there. CUDA devices say
whether they support bf16 themselves (compute capability 8.0 and up).

Flags can mislead: an Intel Xeon with AVX512-BF16 and no AMX has the flag, yet its bf16 products run
slower than float32 ones (`benchmarks/NOTES.md`). So on a CPU whose flags claim native bf16, `auto` times a
short square matmul in float32 and in bf16 (`measured_rates`, well under a second) and picks the faster;
the rates are cached per machine, CPU, thread count and torch version in the user's cache directory
(`$ABLATE_CACHE_DIR`, else `$XDG_CACHE_HOME/ablate`, else `~/.cache/ablate`), and the reason (a run's
`ablate.precision_reason` tag) names them. A CPU without the flags gets float32 without timing.

Training, `ablate bench` and the sweep's estimate decide `auto` on such a CPU by the run's whole training
step instead (`ablate.train.choices.precision`, above this layer: it needs the model); the matmul is the rule
only where no model is at hand.

`ABLATE_NATIVE_BF16=1` or `0` in the environment forces the answer (tests and CI exercise both on one
machine), without timing; the reason then says so.
"""

from __future__ import annotations

import contextlib
import os
import platform
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ablate.core import json_cache
from ablate.core.config import PRECISIONS
from ablate.core.errors import UserError

ENV = "ABLATE_NATIVE_BF16"
AUTO = PRECISIONS[0]  # "auto": resolved by `choose_precision`
NATIVE_CPU_FLAGS = ("amx_bf16", "avx512_bf16")  # /proc/cpuinfo flags of bf16 matrix/vector instructions
AUTOCAST_DTYPES = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


def device_type(device: str | torch.device) -> str:
    """'cpu', 'cuda', ... of a device or its name ('cuda:1' -> 'cuda')."""
    return device.type if isinstance(device, torch.device) else str(device).split(":", 1)[0]


def training_device(accelerator: str, *, cuda_available: bool | None = None) -> str:
    """The device type a Lightning Trainer with `accelerator` trains on: `auto` is CUDA when present."""
    if accelerator == "auto":
        available = torch.cuda.is_available() if cuda_available is None else cuda_available
        return "cuda" if available else "cpu"
    return "cuda" if accelerator == "gpu" else accelerator


def cpu_bf16_flags(cpuinfo: str) -> list[str]:
    """The native-bf16 flags among the `flags` lines of /proc/cpuinfo's text."""
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "flags":
            flags.update(value.split())
    return [flag for flag in NATIVE_CPU_FLAGS if flag in flags]


def _read_cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""  # not Linux: no flags to read, so no native bf16 is claimed


def native_bf16(
    device: str | torch.device,
    *,
    cpuinfo: str | None = None,
    environ: Mapping[str, str] | None = None,
    cuda: Any = None,
) -> tuple[bool, str]:
    """Whether `device` runs bf16 natively, and why we think so.

    `cpuinfo` (the text of /proc/cpuinfo), `environ` and `cuda` (the `torch.cuda` module) are read from the
    machine unless given: tests pass both kinds of CPU."""
    environ = os.environ if environ is None else environ
    forced = environ.get(ENV, "").strip()
    if forced in ("0", "1"):
        return forced == "1", f"{ENV}={forced} forces {'native' if forced == '1' else 'no native'} bf16"
    if forced:
        raise UserError(f"{ENV}: expected 1 or 0, got {forced!r}")
    kind = device_type(device)
    if kind == "cuda":
        cuda = torch.cuda if cuda is None else cuda
        if cuda.is_bf16_supported():
            return True, "CUDA device supports bf16"
        return False, "CUDA device without bf16 support (compute capability under 8.0)"
    if kind == "cpu":
        found = cpu_bf16_flags(_read_cpuinfo() if cpuinfo is None else cpuinfo)
        if found:
            return True, f"CPU has AMX/AVX512-BF16: {', '.join(found)}"
        return False, "CPU without AMX/AVX512-BF16"
    return False, f"device {kind}: native bf16 not known, float32 is the safe choice"


MATMUL_SIZE = 512  # the square matmul `measured_rates` times: large enough for the blocked kernels
MATMUL_REPEATS = 5


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The user's cache directory of ablate (module doc)."""
    environ = os.environ if environ is None else environ
    if environ.get("ABLATE_CACHE_DIR"):
        return Path(environ["ABLATE_CACHE_DIR"])
    return Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ablate"


def machine_key() -> str:
    """This machine, its CPU, the threads torch uses and torch's version: what a matmul rate depends on."""
    from ablate.hardware.device import cpu_name

    return f"{platform.node()}|{cpu_name()}|threads={torch.get_num_threads()}|torch={torch.__version__}"


def _time_matmul(dtype: torch.dtype, n: int = MATMUL_SIZE, repeats: int = MATMUL_REPEATS) -> float:
    """GFLOP/s of an n x n matmul in `dtype` on the CPU: the fastest of `repeats`, after one warm-up."""
    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    torch.mm(a, b)
    fastest = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        torch.mm(a, b)
        fastest = min(fastest, time.perf_counter() - started)
    return 2 * n**3 / fastest / 1e9


RATES = ("float32", "bfloat16")  # the dtypes `measured_rates` times


def measured_rates(folder: Path | None = None) -> dict[str, float]:
    """{"float32": GFLOP/s, "bfloat16": GFLOP/s} of this CPU's matmul, measured once per `machine_key`
    and cached in `folder` (default `cache_dir()`), as `precision.json` (ablate.core.json_cache: a
    damaged cache, or an entry without both rates, is measured again)."""
    rates, _ = json_cache.measured_once(
        (folder or cache_dir()) / "precision.json",
        machine_key(),
        lambda: {"float32": _time_matmul(torch.float32), "bfloat16": _time_matmul(torch.bfloat16)},
        lambda entry: json_cache.numbers(entry, RATES),
    )
    return rates


def _by_measurement(why: str, rates: Mapping[str, float]) -> tuple[str, str]:
    """`auto` on a CPU whose flags claim native bf16: the faster of bf16 and float32 by measured rates."""
    f32, bf16 = rates["float32"], rates["bfloat16"]
    measured = (
        f"measured {MATMUL_SIZE}x{MATMUL_SIZE} matmul: bf16 {bf16:.0f}, float32 {f32:.0f} GFLOP/s "
        f"({torch.get_num_threads()} threads)"
    )
    if bf16 > f32:
        return "bf16-mixed", f"{why}; {measured}: bf16 is faster"
    return "32-true", f"{why}, but {measured}: float32 is faster here"


def choose_precision(
    requested: str,
    device: str | torch.device,
    *,
    key: str = "precision",
    rates: Mapping[str, float] | None = None,
    **capability: Any,
) -> tuple[str, str]:
    """(Lightning precision, reason) for `requested` on `device`: `auto` -> "bf16-mixed" where bf16 is
    native (on a CPU: and measured faster than float32, module doc), "32-true" elsewhere; explicit values
    are kept (a bf16 request where bf16 is emulated keeps the user's choice, and the reason warns).
    `capability`: `native_bf16`'s inputs; `rates`: the CPU's measured matmul rates (default: measured
    here, `measured_rates`)."""
    if requested not in PRECISIONS:
        raise UserError(f"{key}: {requested!r} is not one of {', '.join(PRECISIONS)}")
    native, why = native_bf16(device, **capability)
    if requested == AUTO:
        if not native:
            return "32-true", f"{why}: bf16 would be emulated, many times slower"
        environ = capability.get("environ")
        forced = (os.environ if environ is None else environ).get(ENV, "").strip() in ("0", "1")
        if device_type(device) == "cpu" and not forced:
            return _by_measurement(why, measured_rates() if rates is None else rates)
        return "bf16-mixed", why
    if requested.startswith("bf16") and not native:
        return requested, f"as requested; warning: {why}, bf16 runs emulated and slow"
    return requested, "as requested"


def autocast(device: str | torch.device, precision: str) -> contextlib.AbstractContextManager:
    """The autocast context of a resolved `precision` on `device` (its device type); a no-op for the
    `-true` precisions, whose parameters already hold the dtype."""
    dtype = AUTOCAST_DTYPES.get(precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type(device), dtype=dtype)


def parameter_dtype(precision: str) -> torch.dtype:
    """The dtype a resolved `precision` keeps parameters in: a `-true` precision's own; float32 otherwise
    (the `-mixed` precisions autocast the products and keep float32 parameters)."""
    return {"bf16-true": torch.bfloat16, "64-true": torch.float64}.get(precision, torch.float32)


def compute_dtype(precision: str) -> torch.dtype:
    """The dtype matrix products run in under a resolved `precision` (for the matching matmul peak)."""
    return AUTOCAST_DTYPES.get(precision) or parameter_dtype(precision)
