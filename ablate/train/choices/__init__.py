"""What a run trains on, decided once per process (`decided`: `decide` hands the run's placement and its
sections as they train to everything downstream), chosen by measuring what it chooses: `precision` (`auto`
on a CPU claiming native bf16: float32 or bf16 by the faster whole step), `attention` (on CUDA,
`attention_backend: auto` and `train.compile: auto`: every candidate backend, eager and compiled, timed as
the run's step, the fastest kept), both timing the run's own step (`timed_step`, which `ablate bench`
times too).
"""
