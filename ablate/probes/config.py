"""The recipe's `eval:` section (`EvalConfig`): which probes run on a finished run, and on what.

Every layer may import this module (the recipe resolves it): it imports only `ablate.core`
(tests/ablate/test_layers.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from jsonargparse.typing import PositiveInt

from ablate.core.registry import Spec


@dataclass(frozen=True)
class EvalConfig:
    """The recipe's `eval:` section: the probes run on a finished run's checkpoint (scales may overlay it).

    Attributes:
        probes: probe components (kind probe): a name, {name: ..., <options>} or {class_path, init_args}
        tokens: held-out tokens each probe reads (the paper's 0.4M)
        checkpoint: which checkpoint of a run to evaluate
        after_trial: evaluate every trial of a sweep as soon as it finishes
    """

    probes: list[Spec] = dataclasses.field(default_factory=lambda: ["outliers", "quantization"])
    tokens: PositiveInt = 409600
    checkpoint: Literal["best", "last"] = "best"
    after_trial: bool = False
