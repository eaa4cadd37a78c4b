"""One training run, by job: `loop` (`train_run`: the steps in order), `module` (the LightningModule and
its schedule), `trainer` (the Trainer's assembly), `resume`, `loaders`, `records` (MLflow, result.json),
`config` (the `train:` section); `launch` and `rank` (DDP processes), `progress`, `metrics` (loss slices),
`layer_stats`, `pruning` (Optuna), `branches` (token budgets), and `bench` (`ablate bench`: training and
forward throughput, memory and MFU per variant).
"""
