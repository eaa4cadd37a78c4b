"""The plan a sweep prints before it starts: trials, tokens, FLOPs, and time from a short calibration.

Calibration times forward + backward passes on the device the run trains on (CUDA when present), in the
precision it trains in (decided by the function that decides a run's: ablate.train.choices.decided.placement),
through the device's clock (`ablate.hardware.device`: synchronised on CUDA). When one
micro-batch of the real model is cheap (small scales) the real model is timed; otherwise a one-layer
model of the same width and vocabulary on one short sequence, whose FLOP rate stands in for the whole.
The estimate is training FLOPs / measured FLOP rate; validation and start-up add a little on top.

`gpu_hours` is the other side, for a plan whose runs this machine cannot time (the paper's sizes): the
same training FLOPs at an assumed model-FLOPs utilisation of an 80 GB H100-class card (`GPU_ASSUMPTION`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ablate.core.workspace import Workspace
from ablate.hardware.device import DeviceOps, device_ops
from ablate.hardware.precision import autocast, compute_dtype, device_type, training_device
from ablate.model.cost import model_cost
from ablate.model.decoder import build_model
from ablate.recipe.resolve import RunSpec
from ablate.train.choices.decided import placement

REAL_MODEL_LIMIT = 5e10  # training FLOPs of one calibration micro-batch above which the probe is used

# An H100 SXM's dense matrix peak by the dtype products run in (bf16 tensor cores; float32 without TF32,
# PyTorch's default for matmuls), and the share of it a well-tuned FSDP run of 1-13B models reaches.
GPU_PEAK_FLOPS = {torch.bfloat16: 989e12, torch.float16: 989e12, torch.float32: 67e12}
ASSUMED_MFU = 0.40
GPU_ASSUMPTION = (
    "GPU-hours: 3 x forward FLOPs (4 x with activation checkpointing) x tokens at "
    f"{ASSUMED_MFU:.0%} MFU of an H100 SXM's dense peak (989 TFLOP/s bf16, 67 float32)"
)


@dataclass
class Plan:
    trials: int
    tokens: int
    train_flops: float
    flops_per_s: float
    precision: str = ""  # what the calibration ran in, and why
    precision_reason: str = ""

    @property
    def seconds(self) -> float:
        return self.train_flops / self.flops_per_s * 1.1  # +10%: validation, checkpoints, start-up


def calibrate(run: RunSpec, repeats: int = 4, *, ops: DeviceOps | None = None) -> tuple[float, str, str]:
    """Measured training FLOP/s for `run`'s shapes on this machine: the fastest of `repeats` timed steps,
    so that a moment of contention from other processes does not inflate the estimate many times over.
    Returns (FLOP/s, precision, why that precision). `ops`: the device's clock (default: the device
    `train.accelerator` trains on)."""
    model_cfg, train = run.model, run.train
    seq_len, batch = train.seq_len, train.micro_batch_size
    flops = 3 * model_cost(model_cfg, seq_len).fwd_flops_per_token * seq_len * batch
    if flops > REAL_MODEL_LIMIT:
        model_cfg = replace(model_cfg, n_layers=1)
        seq_len, batch = min(seq_len, 256), 1
        flops = 3 * model_cost(model_cfg, seq_len).fwd_flops_per_token * seq_len * batch
    device = training_device(train.accelerator)
    # Accelerators other than CPU and CUDA (mps, tpu) have no clock here: the CPU's rate stands in.
    ops = ops or device_ops(device if device in ("cpu", "cuda") else "cpu", key="train.accelerator")
    # the precision the run trains in on the device timed, decided as the run decides it (one function,
    # ablate.train.choices.decided.placement: on a CPU claiming bf16 by its whole step, cached)
    where = placement(train, run.model, device=device_type(ops.device))
    precision, why = where.precision, where.reason
    model = build_model(model_cfg, seed=0).to(ops.device)
    if precision.endswith("-true"):  # parameters held in that dtype (Lightning's "true" precisions)
        model = model.to(compute_dtype(precision))
    tokens = torch.randint(0, model_cfg.vocab_size, (batch, seq_len)).to(ops.device)

    def step() -> None:
        with autocast(ops.device, precision):
            loss = model(tokens).float().logsumexp(-1).mean()
        loss.backward()

    step()  # warm-up
    fastest = float("inf")
    for _ in range(repeats):
        started = ops.now()
        step()
        fastest = min(fastest, ops.now() - started)
    return flops / fastest, precision, why


def own_steps(run: RunSpec, part: RunSpec) -> range:
    """The optimizer steps `part` trains itself, `part` being a trial's `run` or one of its smaller
    budgets' branches: the whole run; a branch only its cooldown, since it starts from the run's state at
    its cooldown start (ablate.train.branches)."""
    return range(0 if part is run else part.train.cooldown_start, part.train.steps)


def trained_tokens(run: RunSpec, workspace: Workspace | None = None) -> int:
    """Tokens a trial trains: the run, plus each smaller budget's cooldown (ablate.train.branches); with
    the `workspace`, less what is done there: finished budgets, and the stable phase a shorter run kept
    (an extended study trains only the new tokens and cooldowns)."""
    if workspace is None:
        return sum(len(own_steps(run, part)) for part in (run, *run.branches())) * run.train.batch_tokens
    from ablate.train.branches import stable_checkpoint
    from ablate.train.resume import run_dir

    def done(r: RunSpec) -> bool:
        return (run_dir(workspace, r) / "result.json").exists()

    kept = stable_checkpoint(workspace, run) if run.branches() else None
    start = kept[0] if kept and kept[0] <= run.train.cooldown_start else 0
    steps = 0 if done(run) else run.train.steps - start
    steps += sum(len(own_steps(run, b)) for b in run.branches() if not done(b))
    return steps * run.train.batch_tokens


def gpu_hours(run: RunSpec, precision: str, workspace: Workspace | None = None) -> float:
    """GPU-hours of `run` (its budgets' branches too: `trained_tokens`) in a resolved `precision` on
    H100-class cards at `ASSUMED_MFU`."""
    passes = 4 if run.train.activation_checkpointing else 3  # a recomputed block runs its forward twice
    flops = (
        passes * model_cost(run.model, run.train.seq_len).fwd_flops_per_token * trained_tokens(run, workspace)
    )
    return flops / (ASSUMED_MFU * GPU_PEAK_FLOPS[compute_dtype(precision)]) / 3600


def make_plan(runs: list[RunSpec], workspace: Workspace | None = None) -> Plan:
    trained = {r: trained_tokens(r, workspace) for r in runs}
    tokens = sum(trained.values())
    flops = sum(3 * model_cost(r.model, r.train.seq_len).fwd_flops_per_token * n for r, n in trained.items())
    largest = max(runs, key=lambda r: model_cost(r.model, r.train.seq_len).params)
    flops_per_s, precision, why = calibrate(largest)
    return Plan(
        trials=len(runs),
        tokens=tokens,
        train_flops=flops,
        flops_per_s=flops_per_s,
        precision=precision,
        precision_reason=why,
    )
