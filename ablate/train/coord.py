"""The coordinate check (Tensor Programs V, Section 7 / Figure 5; the reference code's `coord_check`): train
a few AdamW steps at several widths and record, per layer, the RMS of its output and of that output's
change since initialisation, on one fixed batch. Under μP both stay the same size as the width grows; under
the standard parametrization the change grows with width (the lr that is right for a small model is too
large for a wide one). Written here rather than with the `mup` package because its check needs its own
layers; this one reads a `DecoderLM` through forward hooks, whatever components it holds.

Widths: each is a `d_model`; the head width grows with it (head_dim = base head_dim x d_model / base
d_model, so the head count stays), as the `cpu` sizes of recipes/scaling-size.yaml do; depth stays. The
optimiser is the run's (ablate.train.optimizer.adamw: its parameter groups) at a constant lr, no
warmup and no clipping: the first steps are what the check measures.

Layers recorded (ablate.model.hooks.layer_outputs): the embedding's output, every block's attention
output, FFN output and residual stream, and the logits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ablate.model.decoder import build_model
from ablate.model.hooks import layer_outputs, outputs_into
from ablate.train.optimizer import adamw


@dataclass(frozen=True)
class CoordRow:
    """One measurement: RMS of a layer's output (`kind` activation) or of its change since step 0 (change)."""

    variant: str
    parametrization: str
    width: int
    seed: int
    step: int
    layer: str
    kind: str
    rms: float


def width_config(base: Mapping[str, Any], width: int, parametrization: str) -> dict[str, Any]:
    """`base` (a model section) at `d_model` = width, head width scaled with it, under `parametrization`
    (mup with `base` as its base shape, depth rule none: the check varies width only)."""
    d, head = int(base["d_model"]), int(base["head_dim"])
    if (width * head) % d:
        raise ValueError(f"width {width}: head_dim {head} x {width} / {d} is not a whole number")
    spec: Any = "standard"
    if parametrization == "mup":
        spec = {
            "name": "mup",
            "base_d_model": d,
            "base_head_dim": head,
            "base_n_layers": int(base["n_layers"]),
        }
    return {**base, "d_model": width, "head_dim": width * head // d, "parametrization": spec}


@torch.no_grad()
def activations(model: nn.Module, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every recorded layer's output on `tokens` (float64 copies), the logits as `logits`."""
    out: dict[str, torch.Tensor] = {}
    with outputs_into(out, layer_outputs(model), lambda output: output.detach().double()):
        out["logits"] = model(tokens).detach().double()
    return out


def _rms(t: torch.Tensor) -> float:
    return float(t.square().mean().sqrt())


def run_width(
    config: Mapping[str, Any],
    batches: Sequence[torch.Tensor],
    probe: torch.Tensor,
    *,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float],
    eps: float,
    seed: int,
) -> list[tuple[int, str, str, float]]:
    """Train `config` one AdamW step per batch of `batches` ((batch, seq+1) tokens); after every step (and
    at step 0) the (step, layer, kind, rms) of each layer's output on `probe` and of its change."""
    torch.manual_seed(seed)
    model = build_model(config, seed=seed)
    optimizer = adamw(model, lr=lr, weight_decay=weight_decay, betas=betas, eps=eps)
    start = activations(model, probe)
    rows = [(0, layer, "activation", _rms(t)) for layer, t in start.items()]
    for step, batch in enumerate(batches, start=1):
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        now = activations(model, probe)
        for layer, t in now.items():
            rows.append((step, layer, "activation", _rms(t)))
            rows.append((step, layer, "change", _rms(t - start[layer])))
    return rows


def coord_check(
    variants: Mapping[str, Mapping[str, Any]],
    tokens: torch.Tensor,
    *,
    widths: Sequence[int],
    steps: int,
    seeds: Sequence[int],
    batch_size: int,
    seq_len: int,
    lr: float,
    weight_decay: float = 0.0,
    betas: tuple[float, float] = (0.9, 0.98),
    eps: float = 1e-8,
    parametrizations: Sequence[str] = ("standard", "mup"),
) -> list[CoordRow]:
    """Every (variant, parametrization, width, seed): `steps` AdamW steps on windows of `tokens` (1-D), the
    same windows for every width (drawn per seed), measured on one fixed probe batch. `variants` maps a
    name to its model section at the base width."""
    rows: list[CoordRow] = []
    for seed in seeds:
        gen = torch.Generator().manual_seed(seed)
        starts = torch.randint(0, len(tokens) - seq_len - 1, (steps + 1, batch_size), generator=gen)
        windows = [torch.stack([tokens[s : s + seq_len + 1] for s in row.tolist()]) for row in starts]
        probe, batches = windows[0][:, :-1], windows[1:]
        for variant, base in variants.items():
            for parametrization in parametrizations:
                for width in widths:
                    config = width_config(base, width, parametrization)
                    for step, layer, kind, rms in run_width(
                        config,
                        batches,
                        probe,
                        lr=lr,
                        weight_decay=weight_decay,
                        betas=betas,
                        eps=eps,
                        seed=seed,
                    ):
                        rows.append(CoordRow(variant, parametrization, width, seed, step, layer, kind, rms))
    return rows


def as_dicts(rows: Sequence[CoordRow]) -> list[dict[str, Any]]:
    return [dataclasses.asdict(r) for r in rows]
