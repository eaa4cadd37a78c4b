"""Where a measurement runs: the device's clock and memory peak, behind one small interface.

`ablate bench` and the sweep's calibration time steps and read peak memory through a `DeviceOps`:
- CPU: the wall clock (`time.perf_counter`); peak memory from PyTorch's CPU allocator records (the
  profiler's memory events), not the process RSS, which glibc's caching of freed memory blurs.
- CUDA: kernels run asynchronously, so every clock read is preceded by `torch.cuda.synchronize()` (a
  region then covers the device's work, not the time to queue it); peak memory is
  `torch.cuda.max_memory_allocated()` after `reset_peak_memory_stats()`, above what was allocated before.
The `cuda` module and the clock are arguments, so tests drive the CUDA path with a stand-in.
"""

from __future__ import annotations

import contextlib
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch

from ablate.core.errors import UserError


class DeviceOps(Protocol):
    device: torch.device

    def now(self) -> float:
        """Seconds, after the device's queued work has finished."""
        ...

    def peak_bytes(self, work: Callable[[], Any]) -> int:
        """Peak growth of the device's allocated bytes while `work()` runs."""
        ...

    def describe(self) -> str:
        """The device's name, for reports."""
        ...


class CpuOps:
    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.device = torch.device("cpu")
        self.clock = clock

    def now(self) -> float:
        return self.clock()

    def peak_bytes(self, work: Callable[[], Any]) -> int:
        from torch.profiler import ProfilerActivity, profile

        with (
            _native_stderr_silenced(),
            profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof,
        ):
            work()
        events = sorted(
            (e.start_ns(), e.nbytes())
            for e in prof.profiler.kineto_results.events()
            if e.name() == "[memory]"
        )
        live = peak = 0
        for _, nbytes in events:
            live += nbytes
            peak = max(peak, live)
        return peak

    def describe(self) -> str:
        return f"{cpu_name()}, {torch.get_num_threads()} threads"


class CudaOps:
    def __init__(
        self, device: torch.device, cuda: Any = None, clock: Callable[[], float] = time.perf_counter
    ):
        self.device = device
        self.cuda = torch.cuda if cuda is None else cuda
        self.clock = clock

    def now(self) -> float:
        self.cuda.synchronize(self.device)
        return self.clock()

    def peak_bytes(self, work: Callable[[], Any]) -> int:
        self.cuda.synchronize(self.device)
        before = self.cuda.memory_allocated(self.device)
        self.cuda.reset_peak_memory_stats(self.device)
        work()
        self.cuda.synchronize(self.device)
        return max(0, self.cuda.max_memory_allocated(self.device) - before)

    def describe(self) -> str:
        return str(self.cuda.get_device_name(self.device))


def default_device(cuda: Any = None) -> str:
    """CUDA when present (what the recipes' `accelerator: auto` trains on), else the CPU."""
    cuda = torch.cuda if cuda is None else cuda
    return "cuda" if cuda.is_available() else "cpu"


def median_ms(ops: DeviceOps, step: Callable[[], Any], rounds: int) -> float:
    """Median wall time in ms of `step()` over `rounds` calls on `ops`'s device, after one warm-up call
    (kernels chosen, buffers allocated); the benchmark scripts' timer."""
    step()
    times = []
    for _ in range(rounds):
        start = ops.now()
        step()
        times.append(ops.now() - start)
    return 1000 * statistics.median(times)


def device_ops(device: str | None = None, *, cuda: Any = None, key: str = "--device") -> DeviceOps:
    """The `DeviceOps` of `device` ("cpu", "cuda", "cuda:1"; None: `default_device`)."""
    cuda = torch.cuda if cuda is None else cuda
    name = default_device(cuda) if device is None else str(device)
    kind = name.split(":", 1)[0]
    if name == "cpu":
        return CpuOps()
    if kind == "cuda":
        try:
            where = torch.device(name)
        except RuntimeError:
            raise UserError(f"{key}: {name!r} is not a device name; allowed: cpu, cuda, cuda:N") from None
        if not cuda.is_available():
            raise UserError(f"{key}: {name!r} asked for, but no CUDA device is available here; allowed: cpu")
        return CudaOps(where, cuda)
    raise UserError(f"{key}: {name!r} is not supported; allowed: cpu, cuda, cuda:N")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "CPU"


@contextlib.contextmanager
def _native_stderr_silenced():
    """File descriptor 2 to /dev/null meanwhile: the profiler's native code prints start/stop lines there
    (torch 2.13) that no setting turns off."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def gpu_memory_bytes(cuda: Any = None) -> int | None:
    """The memory of this machine's first CUDA device, or None where it has none."""
    cuda = torch.cuda if cuda is None else cuda
    return int(cuda.get_device_properties(0).total_memory) if cuda.is_available() else None
