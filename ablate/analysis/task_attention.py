"""Table 3 on a task's held-out samples: attention shares per tag value, as MLflow metrics."""

from __future__ import annotations

import functools
from collections import defaultdict

import torch
from torch import nn

from ablate.analysis.attention_shares import analysable, recorded_maps, sample_shares


def _answer_rows(effective: torch.Tensor, rows: list[torch.Tensor]) -> list[torch.Tensor]:
    """Per sample b, its answer-producing rows of the map, (H, R_b, N), on the CPU: all the shares need."""
    return [effective[b][:, r.to(effective.device), :].detach().cpu() for b, r in enumerate(rows)]


@torch.no_grad()
def task_attention_metrics(
    model: nn.Module, task, *, device: torch.device | str = "cpu", per_cell: int = 2, batch_size: int = 4
) -> dict[str, float]:
    """Answer and noise shares over `per_cell` held-out samples of every cell of `task`; {} when some
    attention module does not implement the analysis contract (nothing to read the maps through)."""
    from ablate.data.task_batches import collate

    if not analysable(model):
        return {}
    cells = task.cells()
    samples = [task.held_out_sample(i) for i in range(per_cell * len(cells))]
    was_training = model.training
    model.eval()
    groups: dict[str, list[tuple[float, float]]] = defaultdict(list)
    try:
        for start in range(0, len(samples), batch_size):
            chunk = samples[start : start + batch_size]
            width = max(len(s.tokens) for s in chunk)
            tokens = collate(task, chunk, width + 1)["tokens"][:, :width].to(device)
            rows = [torch.as_tensor(s.answer_positions - 1, dtype=torch.long) for s in chunk]

            with recorded_maps(model, select=functools.partial(_answer_rows, rows=rows)) as layers:
                model(tokens)
            for b, s in enumerate(chunk):
                if len(s.answer_positions) == 0:
                    continue
                shares = sample_shares([layer[b] for layer in layers], s.answer_spans, s.context)
                groups[""].append(shares)
                for key, value in s.tags.items():
                    groups[f"/{key}_{value}"].append(shares)
    finally:
        model.train(was_training)
    metrics = {}
    for suffix, values in groups.items():
        metrics[f"attn/answer_share{suffix}"] = sum(a for a, _ in values) / len(values)
        metrics[f"attn/noise_share{suffix}"] = sum(n for _, n in values) / len(values)
    return metrics
