"""One training run, by concept: `run` (`train_run`: a run's steps in order), `branches` (`train_budgets`,
the entry every run takes: every token budget from one run), `resume` and `resume_lock` (the run's folder,
the checkpoint it resumes from, one process at a time), `choices` (what the run trains on, decided once:
precision, attention backend and compiling, measured on the run's own `timed_step`), `optimizer` (the
parameter groups, AdamW and the lr schedule, built nowhere else), `module` (the LightningModule), `trainer`
(the Trainer's assembly), `loaders`, `records` (MLflow, result.json), `config` (the `train:` section);
`launch` and `rank` (DDP processes), `progress`, `metrics` (loss slices), `layer_stats`, `pruning`
(Optuna), `training_clock`; `coord` (the coordinate check). `ablate bench` lives beside, in ablate/bench/.
"""
