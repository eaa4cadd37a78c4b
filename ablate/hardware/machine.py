"""What trained a run, in words: the `ablate.machine` tag every run records, so a report names the machine
its numbers came from even when it is written again elsewhere (`ablate fit --from`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from ablate.hardware.device import cpu_name
from ablate.hardware.precision import cpu_bf16_flags


def machine_description(device: str = "cpu", *, cuda: Any = None) -> str:
    """The GPUs' count and name; or the CPU cores this process may use, the CPU's model name and its
    native-bf16 flags (none: float32 is the fast path)."""
    if device == "cuda":
        cuda = torch.cuda if cuda is None else cuda
        return f"{cuda.device_count()} x {cuda.get_device_name(0)}"
    try:
        flags = cpu_bf16_flags(Path("/proc/cpuinfo").read_text())
    except OSError:
        flags = []
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{cores} cores of an {cpu_name()}, native bf16 flags: {', '.join(flags) or 'none'}"
