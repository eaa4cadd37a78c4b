"""The machine: `device` (CPU and CUDA clocks and peak memory behind one seam), `precision` (bf16 where the
device runs it natively, else float32, with the reason), `allocator` (glibc malloc tuning for training).
"""
