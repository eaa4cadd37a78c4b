"""`quantization` probe: low-bit attention logits (Figure 8), scored by validation loss.

Dynamic post-training absmax quantization of every pre-softmax logit tensor the attention exposes
(through `attend_with_maps`' `logit_transform`, so it works for every attention kind, plugins included):

    scale = (2^(b-1) - 1) / max|X|,   X_q = round(X · scale) / scale      (Figure 8; round half to even)

with max|X| over the causal entries of one group of logits (`granularity`):
- `tensor`: one sequence's whole logit tensor of a layer (every head, every query row);
- `head` (the default): one sequence's map of one head. Why: it is the scale a per-head kernel would use
  (each head's Q K^T is its own GEMM), an outlier still costs the whole head its resolution (the effect
  Figure 8 measures), and, like the others here, it never spans sequences, so a result does not depend on
  which sequences share a batch;
- `row`: one query row of one head (the finest; closest to what a row-wise softmax kernel can hold).
16 bits means no quantization (the paper's 16-bit baseline): the probe then computes the unquantized
loss through the same path, equal bit for bit to the model's math backend.

Score: mean next-token cross-entropy over the token budget, per bit width (`loss/bits_<b>`), and its increase
over the unquantized loss of the same run (`loss_increase/bits_<b>`, when 16 is among the bits). Task accuracy
(the paper's HellaSwag) needs a task recipe; the data pipeline has no task path yet, so only the loss is
scored (the report says so).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from ablate.core.contract import causal_mask
from ablate.core.errors import UserError
from ablate.core.registry import register
from ablate.probes.base import Probe
from ablate.probes.capture import route_attention

GRANULARITIES = {"tensor": (1, 2, 3), "head": (2, 3), "row": (3,)}  # dims of (B, H, N, N) one scale spans
NO_QUANTIZATION = 16


def absmax_quantize(logits: torch.Tensor, bits: int, granularity: str = "head") -> torch.Tensor:
    """Figure 8's quantizer on logits (B, H, N, N); entries above the diagonal pass through unchanged (the
    causal mask removes them) and do not enter the maximum. 16 bits: `logits` itself."""
    if bits == NO_QUANTIZATION:
        return logits
    causal = causal_mask(logits.shape[-1], logits.device)
    absmax = logits.abs().masked_fill(~causal, 0).amax(dim=GRANULARITIES[granularity], keepdim=True)
    levels = 2 ** (bits - 1) - 1
    # An all-zero group stays zero whatever the scale: 1 avoids 0 * inf.
    scale = torch.where(absmax > 0, levels / absmax, torch.ones_like(absmax))
    return torch.where(causal, torch.round(logits * scale) / scale, logits)


@register("probe", "quantization")
class LogitQuantization(Probe):
    """Validation loss with attention logits absmax-quantized to 16 (none)/8/6/4 bits (Figure 8)."""

    def __init__(self, *, bits: list = (16, 8, 6, 4), granularity: str = "head") -> None:
        if granularity not in GRANULARITIES:
            raise UserError(
                f"eval.probes.quantization.granularity: {granularity!r} is not one of "
                f"{', '.join(GRANULARITIES)}"
            )
        bits = list(bits)
        if not bits or not all(isinstance(b, int) and not isinstance(b, bool) and 2 <= b <= 16 for b in bits):
            raise UserError(
                f"eval.probes.quantization.bits: expected bit widths between 2 and 16 (16: none), "
                f"got {bits!r}"
            )
        self.bits, self.granularity = sorted(set(bits), reverse=True), granularity
        self._options = {"bits": self.bits, "granularity": granularity}

    def run(self, model: nn.Module, batches: Sequence[torch.Tensor]) -> dict[str, float]:
        results = {}
        for bits in self.bits:
            transform = (
                None
                if bits == NO_QUANTIZATION
                else partial(absmax_quantize, bits=bits, granularity=self.granularity)
            )
            with torch.inference_mode(), route_attention(model, logit_transform=transform):
                results[f"loss/bits_{bits}"] = mean_loss(model, batches)
        if (
            NO_QUANTIZATION in self.bits
        ):  # the damage itself, within the run: far less seed noise than the loss
            base = results[f"loss/bits_{NO_QUANTIZATION}"]
            results.update({f"loss_increase/bits_{b}": results[f"loss/bits_{b}"] - base for b in self.bits})
        return results


def mean_loss(model: nn.Module, batches: Sequence[torch.Tensor]) -> float:
    """Mean next-token cross-entropy over every target of `batches` (float64 sum / count)."""
    total = torch.zeros((), dtype=torch.float64)
    count = 0
    for batch in batches:
        logits = model(batch[:, :-1])
        per_token = F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten(), reduction="none")
        total += per_token.double().sum().cpu()
        count += per_token.numel()
    return float(total / count) if count else float("nan")
