"""Precision by the device's capability: bf16 autocast where the device runs bf16 natively, float32 elsewhere.

One rule for training, `ablate bench` and the sweep's calibration. bf16 on a CPU without native bf16
instructions (AVX2 only: no AMX-BF16, no AVX512-BF16) is emulated: measured about 75x slower than
float32 for square GEMMs on an AMD EPYC (Zen 3), so `auto` must not pick it there. CUDA devices say
whether they support bf16 themselves (compute capability 8.0 and up).

`ABLATE_NATIVE_BF16=1` or `0` in the environment forces the answer (tests and CI exercise both on one
machine); the reason then says so.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

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


def choose_precision(
    requested: str,
    device: str | torch.device,
    *,
    key: str = "precision",
    **capability: Any,
) -> tuple[str, str]:
    """(Lightning precision, reason) for `requested` on `device`: `auto` -> "bf16-mixed" where bf16 is
    native, "32-true" elsewhere; explicit values are kept (a bf16 request where bf16 is emulated keeps
    the user's choice, and the reason warns). `capability`: `native_bf16`'s inputs."""
    if requested not in PRECISIONS:
        raise UserError(f"{key}: {requested!r} is not one of {', '.join(PRECISIONS)}")
    native, why = native_bf16(device, **capability)
    if requested == AUTO:
        return (
            ("bf16-mixed", why)
            if native
            else ("32-true", f"{why}: bf16 would be emulated, many times slower")
        )
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


def compute_dtype(precision: str) -> torch.dtype:
    """The dtype matrix products run in under a resolved `precision` (for the matching matmul peak)."""
    true_dtypes = {"bf16-true": torch.bfloat16, "64-true": torch.float64}
    return AUTOCAST_DTYPES.get(precision) or true_dtypes.get(precision, torch.float32)
