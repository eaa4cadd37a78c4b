"""λ_init strategies (kind `lambda_init`): the fixed part of differential attention's λ (Eq. 2)."""

import math

from ablate.core.registry import register


@register("lambda_init", "exp_depth")
class ExpDepth:
    """λ_init = 0.8 - 0.6 exp(-0.3 (l - 1)) for 1-based layer l (Eq. 2 text; layer 1 gets 0.2)."""

    def __call__(self, layer_idx: int) -> float:
        layer = layer_idx + 1  # the block passes a 0-based index
        return 0.8 - 0.6 * math.exp(-0.3 * (layer - 1))

    def describe(self) -> str:
        return "exp_depth"


@register("lambda_init", "constant")
class Constant:
    """The same λ_init in every layer (Table 6 ablation rows: 0.8 or 0.5).

    Args:
        value: λ_init of every layer
    """

    def __init__(self, value: float = 0.8):
        self.value = float(value)

    def __call__(self, layer_idx: int) -> float:
        return self.value

    def describe(self) -> str:
        return f"constant {self.value:g}"
