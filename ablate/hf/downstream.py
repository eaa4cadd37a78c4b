"""The paper's downstream tasks (Table 1: ARC-C, ARC-E, BoolQ, HellaSwag, OBQA, PIQA, WinoGrande) on every
finished run of a study, scored by LM Eval Harness's `simple_evaluate` with ablate's harness model
(ablate.hf.harness), logged to each run and tabled with paired differences (ablate.hf.downstream_table).

Offline always: before the harness loads a task, the hub and datasets libraries are switched offline, so a
task reads its data from a local task folder (`TaskManager(include_path=...)`) or the datasets cache, and a
task whose data is in neither is one line saying where to put it (docs/export-and-downstream.md). Nothing is
downloaded.

Per run and task: `acc` and `acc_norm` as the harness computes them, and `bpb`, the gold answer's bits per
byte (its negative log-likelihood over all documents in bits, divided by the UTF-8 bytes of the gold
continuations), from the harness's logged samples; `chance`, the mean of 1 / (number of choices). Logged as
MLflow metrics `downstream/<task>/<metric>` at the run's training tokens (so a budgeted study's branches
line up against tokens), with the tag `ablate.downstream` (a hash of the settings): a run already scored
with the same settings is read back, not scored again. With `logit_bits` (Figure 8) the tasks are scored
again with the attention logits quantized, as the `quantization` probe quantizes them.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ablate.core.errors import UserError

TABLE1 = ("arc_challenge", "arc_easy", "boolq", "hellaswag", "openbookqa", "piqa", "winogrande")
METRIC_PREFIX = "downstream/"
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")


@dataclass(frozen=True)
class DownstreamSettings:
    tasks: tuple[str, ...] = TABLE1
    num_fewshot: int = 0
    task_folder: str | None = None
    limit: int | None = None  # documents per task (None: all)
    checkpoint: str = "best"
    batch_size: int = 8
    logit_bits: tuple[int, ...] = ()  # Figure 8: also scored with attention logits quantized to these bits

    def key(self) -> str:
        described = {**asdict(self), "task_folder": _folder_digest(self.task_folder)}
        return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:16]


def _folder_digest(folder: str | None) -> str | None:
    """The task folder's files, hashed: a changed task is scored again."""
    if not folder:
        return None
    digest = hashlib.sha256()
    for path in sorted(Path(folder).rglob("*")):
        if path.is_file():
            digest.update(str(path.relative_to(folder)).encode() + path.read_bytes())
    return digest.hexdigest()[:16]


def go_offline() -> None:
    """The hub and datasets libraries offline in this process (their flags are read at import: set both)."""
    for name in OFFLINE_VARIABLES:
        os.environ[name] = "1"
    import datasets.config
    import huggingface_hub.constants

    datasets.config.HF_HUB_OFFLINE = True
    huggingface_hub.constants.HF_HUB_OFFLINE = True


def load_tasks(settings: DownstreamSettings) -> Any:
    """The harness's TaskManager holding every task of `settings`, each checked to have its data on this
    machine; an unknown task or one without data is a `UserError` naming it and where its data goes."""
    go_offline()
    from lm_eval.tasks import TaskManager, get_task_dict

    folder = settings.task_folder
    if folder and not Path(folder).is_dir():
        raise UserError(f"--task_folder: {folder} is not a folder of harness task YAML files")
    # The harness's own index (some 15,000 tasks) takes seconds to build: only when a task is not local.
    manager = TaskManager(include_path=folder, include_defaults=False) if folder else None
    if manager is None or not set(settings.tasks) <= set(manager.all_tasks):
        manager = TaskManager(include_path=folder) if folder else TaskManager()
    for name in settings.tasks:
        if name not in manager.all_tasks:
            from ablate.core.errors import closest

            raise UserError(
                f"--tasks: unknown task {name!r}{closest(name, manager.all_tasks)}; a task of LM Eval Harness "
                "or of the --task_folder"
            )
        try:
            get_task_dict([name], manager)
        except Exception as e:  # noqa: BLE001 - datasets' offline misses come as many exception types
            cache = os.environ.get("HF_DATASETS_CACHE") or "~/.cache/huggingface/datasets"
            raise UserError(
                f"--tasks: {name}: its data is not on this machine ({type(e).__name__}: "
                f"{str(e).splitlines()[0][:160] if str(e) else ''}); nothing is downloaded: fill the datasets "
                f"cache ({cache}) on a machine with network and copy it here, or give a --task_folder "
                "with local data (docs/export-and-downstream.md)"
            ) from None
    return manager


def score(model: Any, tokenizer: Any, max_length: int, manager: Any, settings: DownstreamSettings) -> dict:
    """task -> {acc, acc_norm, bpb, chance, documents} for one model (module docstring); with `logit_bits`,
    also acc_bits_<b> and acc_norm_bits_<b>: the same tasks with every attention logit absmax-quantized to b
    bits (Figure 8, ablate.probes.quantization at its default per-head granularity)."""
    scores = _evaluate(model, tokenizer, max_length, manager, settings)
    for bits in settings.logit_bits:
        from functools import partial

        import torch

        from ablate.probes.capture import route_attention
        from ablate.probes.quantization import absmax_quantize

        transform = partial(absmax_quantize, bits=bits, granularity="head")
        with torch.inference_mode(), route_attention(model, logit_transform=transform):
            quantized = _evaluate(model, tokenizer, max_length, manager, settings)
        for task, values in quantized.items():
            scores[task] |= {f"{m}_bits_{bits}": values[m] for m in ("acc", "acc_norm")}
    return scores


def _evaluate(
    model: Any, tokenizer: Any, max_length: int, manager: Any, settings: DownstreamSettings
) -> dict:
    import lm_eval

    from ablate.hf.harness import AblateLM

    lm = AblateLM(model, tokenizer, max_length=max_length, batch_size=settings.batch_size)
    out = lm_eval.simple_evaluate(
        model=lm,
        tasks=list(settings.tasks),
        task_manager=manager,
        num_fewshot=settings.num_fewshot,
        limit=settings.limit,
        log_samples=True,
        bootstrap_iters=0,
        random_seed=0,
        numpy_random_seed=0,
        torch_random_seed=0,
        fewshot_random_seed=0,
        verbosity="ERROR",
    )
    scores = {}
    for task in settings.tasks:
        results, samples = out["results"][task], out["samples"][task]
        scores[task] = {
            "acc": results.get("acc,none", math.nan),
            "acc_norm": results.get("acc_norm,none", math.nan),
            **_gold_bits(samples),
        }
    return scores


def _gold_bits(samples: list[dict]) -> dict[str, float]:
    """bpb of the gold continuations, chance level and the documents scored, from the logged samples."""
    bits = nbytes = chance = 0.0
    for sample in samples:
        gold = int(sample["target"]) if str(sample["target"]).isdigit() else 0
        arguments = sample["arguments"]
        logliks = sample["filtered_resps"]
        gold = gold if gold < len(arguments) else 0
        bits -= float(logliks[gold][0]) / math.log(2)
        nbytes += len(str(arguments[gold][1]).encode("utf-8"))
        chance += 1.0 / len(arguments)
    n = len(samples)
    return {
        "bpb": bits / nbytes if nbytes else math.nan,
        "chance": chance / n if n else math.nan,
        "documents": n,
    }


def run_tokens(run: Any) -> int:
    """The tokens a run trained on: the step its downstream metrics are logged at."""
    return int(run.train.steps) * int(run.train.batch_tokens)


def log_scores(client: Any, run_id: str, run: Any, scores: dict, settings: DownstreamSettings) -> None:
    """The run's scores as metrics at its tokens, then the tag (in the last request, as ablate.probes.run)."""
    from mlflow.entities import Metric, RunTag

    from ablate.store import names

    now, step = int(time.time() * 1000), run_tokens(run)
    metrics = [
        Metric(f"{METRIC_PREFIX}{task}/{name}", float(value), now, step)
        for task, values in scores.items()
        for name, value in values.items()
        if math.isfinite(float(value))
    ]
    settings_json = json.dumps(asdict(settings), sort_keys=True, default=str)[:5000]
    tags = [RunTag(names.DOWNSTREAM_SETTINGS, settings_json), RunTag(names.DOWNSTREAM, settings.key())]
    client.log_batch(run_id, metrics=metrics, tags=tags)


def logged_scores(client: Any, run_id: str, settings: DownstreamSettings) -> dict | None:
    """The scores a run already has for `settings` (read from its metrics), or None."""
    from ablate.store import names

    data = client.get_run(run_id).data
    if data.tags.get(names.DOWNSTREAM) != settings.key():
        return None
    scores: dict[str, dict[str, float]] = {}
    for key, value in data.metrics.items():
        if key.startswith(METRIC_PREFIX):
            task, name = key[len(METRIC_PREFIX) :].rsplit("/", 1)
            scores.setdefault(task, {})[name] = value
    return scores if set(settings.tasks) <= set(scores) else None
