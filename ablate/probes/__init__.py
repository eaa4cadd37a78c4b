"""Probes (registry kind `probe`): measurements of a trained model on held-out tokens, run by `ablate eval`.

A probe is a class registered with `@register("probe", name)` that implements `ablate.probes.base.Probe`:
`settings()` (what defines its results: hashed, so a run already probed with the same settings is skipped)
and `run(model, batches) -> {metric: value}`. It reads attention only through the component contract
(`attend_with_maps`, ablate.core.contract) and hidden states through forward hooks (`capture`), so it works
for every attention kind, plugins included. Built in: `outliers` (Table 5), `quantization` (Figure 8).
`run` runs them on a sweep's finished checkpoints (`ablate eval`); importing this package does not load it.
"""

from ablate.probes.base import Probe, settings_key
from ablate.probes.capture import block_outputs, causal_entries, route_attention
from ablate.probes.outliers import ActivationOutliers
from ablate.probes.quantization import LogitQuantization, absmax_quantize

__all__ = [
    "ActivationOutliers",
    "LogitQuantization",
    "Probe",
    "absmax_quantize",
    "block_outputs",
    "causal_entries",
    "route_attention",
    "settings_key",
]
