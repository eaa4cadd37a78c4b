"""Loss slices for Table 6: AR-Hit and Others (Zoology, Arora et al. 2023).

A target token is an AR hit when it completes a bigram that already occurred earlier in the same
sequence (associative recall: the model can copy it from context); every other target is "Others".
Zoology also set aside bigrams frequent in the training data; this module does not (docs/paper.md, Table 6).
The slices mean little under a byte tokenizer, where almost every bigram repeats: report each slice's
share of tokens beside its loss.

Validation accumulates `sliced_loss_sums` over batches (`merge_sums`), then `slice_summary` gives the
means and shares.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import torch

SUM_KEYS = ("total_sum", "total_count", "ar_hit_sum", "ar_hit_count", "others_sum", "others_count")


def ar_hit_mask(tokens: torch.Tensor) -> torch.Tensor:
    """tokens (B, N+1) -> bool (B, N): target t (tokens[:, t+1] given tokens[:, :t+1]) is an AR hit iff
    (tokens[t], tokens[t+1]) == (tokens[s], tokens[s+1]) for some s < t. Ids must be in [0, 2**31)."""
    if tokens.dim() != 2:
        raise ValueError(f"tokens must be (batch, seq_len + 1), got shape {tuple(tokens.shape)}")
    x = tokens.long()
    keys = (x[:, :-1] << 32) | x[:, 1:]  # one int64 per bigram
    # A stable sort keeps equal bigrams in position order: all but the first of each run are repeats.
    sorted_keys, order = torch.sort(keys, dim=-1, stable=True)
    repeat = torch.zeros_like(sorted_keys, dtype=torch.bool)
    repeat[:, 1:] = sorted_keys[:, 1:] == sorted_keys[:, :-1]
    return torch.zeros_like(repeat).scatter_(1, order, repeat)


def sliced_loss_sums(per_token_loss: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Sums and counts of the loss over all targets, AR hits and Others (0-d tensors, float64 sums), to be
    added over batches (and all-reduced across ranks) before `slice_summary`."""
    if per_token_loss.shape != mask.shape:
        raise ValueError(f"loss {tuple(per_token_loss.shape)} and mask {tuple(mask.shape)} differ in shape")
    loss = per_token_loss.detach().double()
    hit = mask.bool()
    zero = torch.zeros((), dtype=loss.dtype, device=loss.device)
    ar_hit_sum = torch.where(hit, loss, zero).sum()
    others_sum = torch.where(hit, zero, loss).sum()
    ar_hit_count = hit.sum()
    total_count = torch.tensor(hit.numel(), device=hit.device)
    return {
        "total_sum": loss.sum(),
        "total_count": total_count,
        "ar_hit_sum": ar_hit_sum,
        "ar_hit_count": ar_hit_count,
        "others_sum": others_sum,
        "others_count": total_count - ar_hit_count,
    }


def merge_sums(
    acc: Mapping[str, torch.Tensor] | None, sums: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """acc + sums, key by key (acc None starts the accumulation)."""
    if acc is None:
        return {k: sums[k].clone() for k in SUM_KEYS}
    return {k: acc[k] + sums[k] for k in SUM_KEYS}


def slice_summary(sums: Mapping[str, torch.Tensor | float]) -> dict[str, float]:
    """Mean loss of all targets and of each slice (nan for an empty slice) and each slice's token share."""
    s = {k: float(sums[k]) for k in SUM_KEYS}
    total = s["total_count"]

    def mean(name: str) -> float:
        return s[f"{name}_sum"] / s[f"{name}_count"] if s[f"{name}_count"] else math.nan

    return {
        "loss": mean("total"),
        "ar_hit_loss": mean("ar_hit"),
        "others_loss": mean("others"),
        "ar_hit_share": s["ar_hit_count"] / total if total else math.nan,
        "others_share": s["others_count"] / total if total else math.nan,
    }


def unigram_entropy(tokens: np.ndarray, vocab_size: int) -> float:
    """Entropy (nats per token) of the empirical unigram distribution: the loss of a model that knows
    only token frequencies; a baseline for validation loss."""
    counts = np.bincount(np.asarray(tokens), minlength=vocab_size).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


# --- tasks (ablate.data.tasks): exact-match accuracy and loss on answers ------------------------------
TASK_COLUMNS = ("samples", "exact", "answer_loss_sum", "answer_tokens")


def task_sums(
    per_token_loss: torch.Tensor, predictions: torch.Tensor, batch: Mapping[str, torch.Tensor], n_cells: int
) -> torch.Tensor:
    """float64 (n_cells, 4) sums of TASK_COLUMNS over one batch, to be added over batches (and ranks).

    A sample is an exact match when the argmax prediction at every answer target equals the answer
    (teacher-forced: the model reads the true earlier answer tokens, as in training; not free-running
    generation). `per_token_loss` and `predictions` are (B, seq_len), aligned with batch["answer_mask"].
    """
    targets, answers = batch["tokens"][:, 1:], batch["answer_mask"].bool()
    exact = ((predictions == targets) | ~answers).all(dim=-1)
    zero = torch.zeros((), dtype=torch.float64, device=per_token_loss.device)
    rows = torch.stack(
        [
            torch.ones_like(exact, dtype=torch.float64),
            exact.double(),
            torch.where(answers, per_token_loss.detach().double(), zero).sum(-1),
            answers.sum(-1).double(),
        ],
        dim=-1,
    )
    sums = torch.zeros((n_cells, len(TASK_COLUMNS)), dtype=torch.float64, device=rows.device)
    return sums.index_add_(0, batch["cell"].to(rows.device), rows)


def cell_name(cell: Mapping[str, object]) -> str:
    """{'level': 'N6R2', 'depth': 50} -> 'level_N6R2/depth_50' (MLflow-safe metric path)."""
    return "/".join(f"{k}_{v}" for k, v in cell.items())


def task_summary(sums: torch.Tensor, cells: list[Mapping[str, object]]) -> dict[str, float]:
    """Accuracy overall ('val/accuracy'), per tag value ('val/accuracy/depth_50'), per cell
    ('val/accuracy_cell/level_N6R2/depth_50/length_256'), per level-like tag's answer loss, and the loss
    on answer tokens ('val/answer_loss'). Empty groups are left out."""
    s = sums.detach().cpu().double()

    def acc(rows: torch.Tensor) -> float:
        return float(rows[:, 1].sum() / rows[:, 0].sum()) if rows[:, 0].sum() > 0 else math.nan

    tokens = float(s[:, 3].sum())
    out = {
        "val/accuracy": acc(s),
        "val/answer_loss": float(s[:, 2].sum()) / tokens if tokens else math.nan,
        "val/samples": float(s[:, 0].sum()),
    }
    groups: dict[str, list[int]] = {}
    for i, cell in enumerate(cells):
        for key, value in cell.items():
            groups.setdefault(f"{key}_{value}", []).append(i)
        if s[i, 0] > 0:
            out[f"val/accuracy_cell/{cell_name(cell)}"] = acc(s[i : i + 1])
    for name, rows in groups.items():
        if s[rows, 0].sum() > 0:
            out[f"val/accuracy/{name}"] = acc(s[rows])
    return out
