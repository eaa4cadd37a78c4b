"""Where the model's own kernels keep what they measured: the `triton` backend's launch configurations
(components/attention/triton/configs.py), chosen on CUDA by timing a few candidates per kernel and shape.

Without a folder those choices last a process, so every run of a sweep timed them again (about five
candidates per kernel, each a Triton compile the first time); a run trains with its workspace's folder
(`Workspace.kernel_configs`), so one card and shape measure once per workspace. Training names no
component (tests/ablate/test_layers.py), so it asks the model layer, which assembles them.

What the chooser gave each launch is noted from `record_launches` on (`launched`): a run's tags name the
launch configurations it trained with (ablate.train.records). Noted at the launch, not predicted from the
run's shape: the chooser's key (kernel, maps, widths, dtype, length bucket, card) is the kernel's own to
form, and only the kernels know which of their three they launch. Under Triton's interpreter (CPU
tensors) the kernels launch one fixed configuration without asking the chooser, so nothing is noted.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any


def remember_in(folder: Path) -> None:
    """Keep this process's measured launch configurations in `folder` (read before timing anything)."""
    from components.attention.triton import configs

    configs.remember_in(folder)


def record_launches() -> None:
    """Note what the chooser gives each launch from here on, forgetting what it gave before (a run's
    measured attention candidates launched before it trains)."""
    from components.attention.triton import configs

    chooser = configs.chooser()
    if not isinstance(chooser, _Noting):
        chooser = _Noting(chooser)
        configs.use(chooser)
    chooser.given.clear()


def launched() -> dict[str, str]:
    """What the chooser gave each launch since `record_launches`: the chooser's key name (kernel, maps,
    widths, dtype, length bucket, card) -> "<rows per query tile>x<rows per key tile> w<warps> s<stages>",
    the label the chooser's stored timings use; empty when nothing launched through it."""
    from components.attention.triton import configs

    chooser = configs.chooser()
    given = chooser.given if isinstance(chooser, _Noting) else {}
    return {
        name: f"{c.block_m}x{c.block_n} w{c.num_warps} s{c.num_stages}" for name, c in sorted(given.items())
    }


class _Noting:
    """The process's chooser, noting the configuration it gives each key. Everything else (its folder,
    timer, remembered choices) is the chooser's own, so `configs.remember_in` works through it."""

    def __init__(self, chooser: Any):
        self.chooser = chooser
        self.given: dict[str, Any] = {}

    def choose(self, key: Any, run: Callable[[Any], None]) -> Any:
        config = self.chooser.choose(key, run)
        self.given[key.name()] = config
        return config

    def __getattr__(self, name: str) -> Any:
        return getattr(self.chooser, name)
