"""Where the model's own kernels keep what they measured: the `triton` backend's launch configurations
(components/attention/triton/configs.py), chosen on CUDA by timing a few candidates per kernel and shape.

Without a folder those choices last a process, so every run of a sweep timed them again (about five
candidates per kernel, each a Triton compile the first time); a run trains with its workspace's folder
(`Workspace.kernel_configs`), so one card and shape measure once per workspace. Training names no
component (tests/ablate/test_layers.py), so it asks the model layer, which assembles them.
"""

from __future__ import annotations

from pathlib import Path


def remember_in(folder: Path) -> None:
    """Keep this process's measured launch configurations in `folder` (read before timing anything)."""
    from components.attention.triton import configs

    configs.remember_in(folder)
