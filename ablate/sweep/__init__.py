"""Many runs as one Optuna study: `queue` (enqueue, claim, heartbeats, retries), `worker` (the worker loop),
the launchers side by side (`local`, `slurm`; their table: `launchers`), `extend` (a budgeted study grown),
`estimate` (the plan's time from a short calibration), `status` and `preemption`. The sweep verb
(ablate.verbs.sweep) adds the plan, the probes after each trial and the report.
"""
