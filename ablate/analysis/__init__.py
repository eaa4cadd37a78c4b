"""Analyses of trained models on tasks: attention to the answer and to noise (Table 3).

`task_attention_metrics(model, task)` (task_attention.py) runs held-out samples through the model with the
attention maps recorded through the component contract (`ablate.core.contract.attend_with_maps`) and returns
MLflow metrics `attn/answer_share`, `attn/noise_share` and the same per tag value
(`attn/answer_share/depth_50`). The definition of the shares is in `attention_shares.py`.
"""

from ablate.analysis.attention_shares import analysable, recorded_maps, row_shares, sample_shares
from ablate.analysis.task_attention import task_attention_metrics

__all__ = ["analysable", "recorded_maps", "row_shares", "sample_shares", "task_attention_metrics"]
