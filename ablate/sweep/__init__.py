"""Many runs as one Optuna study: `run` (enqueue, claim, heartbeats, retries, workers, `run_sweep`) and
`estimate` (the plan's time from a short calibration).
"""
