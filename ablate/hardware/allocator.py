"""The host memory allocator, set up for training: large tensors kept in glibc's heap between steps.

Measured (benchmarks/NOTES.md): a `small` Transformer step of 4 x 1024 tokens took 3.87-4.01 s with
glibc's defaults (415K minor page faults, 0.6 s of system time per step) and 3.49-3.52 s tuned (2-3
faults); the tiny Diff of the quickstart trained at 10.1-10.4K tok/s untuned and 11.0-11.1K tuned.
Training and `ablate bench` both call it; freed memory stays with the process (up to the trim
threshold), which the peak does not change.
"""

from __future__ import annotations


def tune_glibc_malloc() -> str:
    """Keep freed memory in glibc's heap instead of returning it to the OS (mmap threshold 1 GiB, trim
    threshold 2 GiB). With the defaults every step unmaps its large activations and faults them in again
    (measured: 0-100K minor faults and 0-0.6 s of system time per 1.3 s step, varying step to step),
    which is both slower and the main source of noise between rounds. Process-wide, idempotent; returns
    what was set."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
        ok = libc.mallopt(m_mmap_threshold, 1 << 30) and libc.mallopt(m_trim_threshold, (1 << 31) - 1)
    except (OSError, AttributeError):
        ok = 0
    return "glibc malloc: mmap threshold 1 GiB, trim threshold 2 GiB" if ok else "malloc not tuned (no glibc)"
