"""The bench's defaults, in a module of their own that imports nothing: `ablate bench`'s flags show them
(ablate.verbs.bench) without importing torch, so `ablate --help` stays instant."""

STANDARD_SEQ_LENS = (512, 1024, 2048, 4096)  # with the scale's own training length, the default rows
TOKENS_PER_STEP = 4096  # 8 x 512 ... 1 x 4096: the default step
PRECISIONS = ("auto", "bf16-mixed", "16-mixed", "32-true")  # what `ablate bench` runs (autocast or none)
PEAK_BUDGET_S = 2.0  # seconds per matmul-peak measurement (one per dtype and round)
PEAK_MAX_SIZE = 4096  # largest square GEMM of the peak measurement
