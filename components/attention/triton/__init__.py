"""The `triton` backend, every piece of it (Triton is optional: nothing here imports it at import time).

- `op`: the kernels as torch custom ops, forward and backward, and the checks a call passes first;
- `kernels`: the math, and the kernels wrapped for the GPU or Triton's interpreter;
- `forward`, `backward`: the kernels and their tile loops, plain functions;
- `configs`: each kernel's launch configuration, chosen on the GPU by timing a few candidates;
- `compiled`: a launch compiled for Hopper (`sm_90`) on any machine and read back from the compiled code.
"""
