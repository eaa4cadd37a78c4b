"""glibc malloc tuning (ablate.hardware.allocator): once tuned, a process that allocates and frees the same large
tensors step after step stops mapping fresh pages (each one a minor fault on first touch). Run in
subprocesses: the setting is process-wide."""

import platform
import subprocess
import sys

import pytest

STEPS = """
import resource, sys, torch
if sys.argv[1] == "tuned":
    from ablate.hardware.allocator import tune_glibc_malloc
    print(tune_glibc_malloc(), file=sys.stderr)
faults = []
for _ in range(8):  # a training step's pattern: several large activations held together, then freed
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    held = [torch.ones(mib << 18) for mib in (40, 100, 60, 8, 150)]
    del held
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(faults[-1])
"""


def last_step_faults(mode: str) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-c", STEPS, mode], capture_output=True, text=True, check=True)
    return int(done.stdout.strip()), done.stderr


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt thresholds are glibc's")
def test_tuned_steps_stop_faulting_in_fresh_pages():
    tuned, said = last_step_faults("tuned")
    untuned, _ = last_step_faults("defaults")
    assert "glibc malloc: mmap threshold 1 GiB, trim threshold 2 GiB" in said
    assert untuned > 50_000  # 358 MiB of fresh pages every step: the check can fail
    assert tuned < untuned // 100, (tuned, untuned)
