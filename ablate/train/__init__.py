"""One training run: `loop` (the LightningModule, `train_run`), `launch` and `rank` (DDP processes),
`progress`, `metrics` (loss slices), `layer_stats`, `pruning` (Optuna), and `bench` (`ablate bench`:
training and forward throughput, memory and MFU per variant).
"""
