"""Launch configurations of the `triton` backend's kernels (components/attention/triton/kernels.py), chosen
by measurement per kernel.

Each of the three tiled kernels (`forward`, `backward_kv`: dK/dV and the single pass's dQ atomics,
`backward_q`: the deterministic path's dQ) has a small candidate set of tiles and warps per head width,
dtype and V's width; on CUDA every candidate is timed once on the call's own inputs, per kernel, length
bucket (the next power of two, 512 to 16,384 tokens) and compute capability, and the fastest kept: in a
dict for the process and, when the chooser has a cache folder, in a JSON file there (`triton_configs.json`,
with the timings it chose by), read before timing anything: a training run gives it its workspace's
(`remember_in`, through ablate.model.kernels), so one card and shape are timed once per workspace; a
process started with `ABLATE_KERNEL_CACHE` set to a folder keeps them there (`ablate bench`, scripts).
Under Triton's interpreter (CPU tensors) one fixed configuration: the interpreter takes no launch options
and its times say nothing about a GPU.

Why our own and not `triton.autotune`: its key is a list of the kernel's arguments (no length bucket,
no capability), its cache lives in the process only, the single pass's float32 dQ buffer would have to
be zeroed around every trial by argument name, and a CPU test cannot drive it; here the timer is a seam
(`Chooser(timer=...)`), so tests choose with fake timings. The default timer is `triton.testing.do_bench`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import astuple, dataclass
from pathlib import Path

import torch

from ablate.core.json_cache import add, number, parsed, read

KERNELS = ("forward", "backward_kv", "backward_q")
FILE = "triton_configs.json"


@dataclass(frozen=True)
class Config:
    """Rows per query tile, rows per key tile, warps and pipeline stages of one launch."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


# CPU tensors: the interpreter, tiles of 64 rows (tests pass smaller ones to cross tiles at small sizes).
INTERPRETED = Config(64, 64, 4, 1)


@dataclass(frozen=True)
class Key:
    """What a configuration is chosen for."""

    kernel: str
    maps: int  # 2: differential attention, 1: softmax
    width: int  # Q and K's head width
    v_width: int
    dtype: torch.dtype
    seq_len: int
    capability: tuple[int, int]
    atomic: bool = False  # backward_kv as the single pass (its dQ added by atomics)

    def name(self) -> str:
        dtype = str(self.dtype).removeprefix("torch.")
        major, minor = self.capability
        kernel = f"{self.kernel}+dq" if self.atomic else self.kernel
        return (
            f"{kernel} maps{self.maps} d{self.width} e{self.v_width} {dtype} "
            f"n{bucket(self.seq_len)} sm{major}{minor}"
        )


def bucket(seq_len: int) -> int:
    """The length bucket a configuration is chosen for: the next power of two, 512 to 16,384."""
    return min(max(1 << max(0, math.ceil(math.log2(max(seq_len, 1)))), 512), 16384)


# (rows per query tile, rows per key tile, warps, stages) per kernel: 16-bit with V up to 128 wide, and
# float32 (no TF32: twice the registers and shared memory per tile) or V wider. Each is a launch that
# compiles for sm_90 with no spill in the forward and the single pass, no layout its warps duplicate, and
# wgmma for every product of 64 rows or more (tests/components/test_triton_compiled.py compiles them all;
# benchmarks/triton_sm90_tma.md has their registers, with pointer and TMA loads). Eight warps are two warp
# groups: a wgmma warp group covers 64 rows, so 8 warps on a 64-row product compute it twice; they go with
# 128-row products, or with 32-row tiles on mma.sync, which Triton splits by columns. The backward_kv
# kernel's products (but dQ) have the key block's rows (backward.py: S^T = K Q^T).
NARROW = {
    "forward": [(128, 64, 8, 2), (128, 32, 8, 2), (64, 32, 4, 2), (128, 64, 8, 3)],
    "backward_kv": [(16, 128, 8, 2), (16, 64, 4, 2), (16, 128, 8, 3), (16, 64, 4, 3)],
    "backward_q": [(128, 64, 8, 2), (64, 64, 4, 2), (64, 32, 4, 2), (128, 64, 8, 3)],
}
WIDE = {
    "forward": [(32, 64, 8, 2), (16, 64, 8, 2), (32, 64, 8, 3)],
    "backward_kv": [(64, 16, 8, 2), (64, 16, 8, 3)],
    "backward_q": [(32, 64, 8, 2), (16, 64, 8, 2), (32, 64, 8, 3)],
}


def candidates(kernel: str, dtype: torch.dtype, v_width: int) -> list[Config]:
    """The configurations timed for `kernel` (ties go to the earlier): `NARROW` in 16 bits with V up to 128
    wide, `WIDE` otherwise. In 16 bits the forward starts from 128 x 64 (on an H200, Diff's core at the
    `small` widths ran 1.38x faster at 2,048 tokens and 1.75x at 8,192 than with 64 x 64, the best of 10
    configurations timed for all three kernels at once: reports/gpu-h200/tune_triton.csv); the single pass
    holds dK1, dK2 and dV for its key block (the block's rows x 4d float32 for Diff), so its query tiles are
    short (16 rows) against 128 keys with 8 warps or 64 with 4 (a 128-row query tile against 64 keys spills
    on sm_90: benchmarks/NOTES.md, "a 128-row query tile in the single pass"); V wider than 128 takes the
    two-kernel backward (op.single_pass), whose dK/dV kernel walks 64-row query tiles against 16-row key
    blocks; the dQ kernel holds dQ1 and dQ2 only and takes query blocks of 64 or 128."""
    if kernel not in KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}; known: {', '.join(KERNELS)}")
    table = WIDE if dtype == torch.float32 or v_width > 128 else NARROW
    return [Config(*c) for c in table[kernel]]


def warps(rows: int) -> int:
    """Warps for a launch whose products have `rows` rows (tiles a caller passes): two warp groups only
    for 128 rows and more."""
    return 8 if rows >= 128 else 4


def do_bench(run: Callable[[], None]) -> float:
    """Milliseconds per call of `run` on CUDA (Triton's own benchmark: warm-up, L2 flushed, median)."""
    import triton.testing

    return float(triton.testing.do_bench(run, warmup=5, rep=20))


class Chooser:
    """Chooses, remembers and (with `folder`) stores the fastest configuration per `Key`.

    `timer(run) -> ms` times one candidate (`do_bench` on CUDA; tests inject fake timings)."""

    def __init__(
        self, timer: Callable[[Callable[[], None]], float] = do_bench, folder: str | Path | None = None
    ):
        self.timer = timer
        self.folder = Path(folder) if folder is not None else None
        self.chosen: dict[str, Config] = {}
        self.timings: dict[str, dict[str, float]] = {}
        self._read = False

    def choose(self, key: Key, run: Callable[[Config], None]) -> Config:
        """The configuration for `key`: remembered, stored in the folder, or the fastest of `candidates`
        timed by launching `run(config)` (a candidate the GPU cannot launch, e.g. out of shared memory,
        is left out)."""
        name = key.name()
        if not self._read:
            self._load()
        if self.chosen.get(name) in candidates(key.kernel, key.dtype, key.v_width):
            return self.chosen[name]  # a stored configuration that is no candidate is measured again
        times: dict[Config, float] = {}
        failures = []
        for config in candidates(key.kernel, key.dtype, key.v_width):
            try:
                times[config] = self.timer(lambda config=config: run(config))
            except Exception as e:  # noqa: BLE001 - a candidate that does not fit this GPU
                if not _out_of_resources(e):
                    raise
                failures.append(e)
        if not times:
            raise failures[0]
        best = min(times, key=times.__getitem__)
        self.chosen[name] = best
        self.timings[name] = {_label(c): t for c, t in times.items()}
        self._store()
        return best

    def _load(self) -> None:
        self._read = True
        for name, (config, ms) in _stored(self.folder).items():
            self.chosen.setdefault(name, config)
            self.timings.setdefault(name, ms)

    def _store(self) -> None:
        """Every choice of this process into the folder's file, beside another process's there
        (ablate.core.json_cache: written whole, an unwritable folder left as it is)."""
        if self.folder is None:
            return
        add(
            self.folder / FILE,
            {
                name: {"config": list(astuple(c)), "ms": self.timings.get(name, {})}
                for name, c in self.chosen.items()
            },
            _entry,
        )


def _stored(folder: Path | None) -> dict[str, tuple[Config, dict]]:
    """The folder's file: each readable entry's configuration and timings (ablate.core.json_cache: a
    damaged file or entry reads as absent, measured again and rewritten)."""
    entries = read(folder / FILE) if folder is not None else {}
    stored = {}
    for name, entry in entries.items():
        if (read_back := parsed(entry, _entry)) is not None:
            stored[name] = read_back
    return stored


def _entry(entry: dict) -> tuple[Config, dict[str, float | None]]:
    """A stored entry, `{"config": [four positive integers], "ms": {label: ms}}`, read; a ValueError or
    TypeError where it is anything else."""
    config = entry["config"]
    if not isinstance(config, list) or len(config) != 4:
        raise ValueError(f"config {config!r}: expected four integers")
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in config):
        raise ValueError(f"config {config!r}: expected four positive integers")
    ms = entry.get("ms", {})
    if not isinstance(ms, dict):
        raise ValueError(f"ms {ms!r}: expected an object")
    return Config(*config), {str(k): number(v) for k, v in ms.items()}


def _label(config: Config) -> str:
    return f"{config.block_m}x{config.block_n} w{config.num_warps} s{config.num_stages}"


def _out_of_resources(error: Exception) -> bool:
    from triton.runtime.errors import OutOfResources

    return isinstance(error, OutOfResources)


# A process started with ABLATE_KERNEL_CACHE (a folder) keeps its choices there from its first kernel on:
# the device check gives every part's process one folder, so a card and shape are timed once in all.
ENV = "ABLATE_KERNEL_CACHE"
_chooser = Chooser(folder=os.environ.get(ENV) or None)


def chooser() -> Chooser:
    """The process's chooser (its choices last as long as the process; no folder unless `remember_in` or
    `use` set one)."""
    return _chooser


def remember_in(folder: str | Path) -> None:
    """Keep the process's choices in `folder` too (a training run: its workspace's cache), with the same
    timer; a choice already made in this process is stored there when the next one is."""
    current = chooser()
    if current.folder == Path(folder):
        return
    new = Chooser(timer=current.timer, folder=folder)
    new.chosen.update(current.chosen)
    new.timings.update(current.timings)
    use(new)


def use(new: Chooser) -> Chooser:
    """Make `new` the process's chooser (a cache folder, another timer); returns the previous one."""
    global _chooser
    previous, _chooser = _chooser, new
    return previous
