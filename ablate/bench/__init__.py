"""The benchmark behind `ablate bench`: training and forward throughput, peak memory and MFU of a recipe's
variants, in one run.

`measure` times the arms (each variant's run's own step, built by ablate.train.choices.timed_step: the step
`auto` times too) with the matmul peak beside them; `ceilings` the FLOP ceilings set beside the measured
ratios; `results` writes the files; `defaults` the options' defaults (importing nothing, for `--help`).
"""
