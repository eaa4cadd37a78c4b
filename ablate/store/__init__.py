"""Where runs are kept: `tracking` (MLflow runs, tags, artifacts), `server` (the MLflow UI and tracking
server), `study` (a sweep's Optuna study: its context, plans and their runs, storage, progress).
"""
