"""Where runs are kept: `stores` (the workspace, tracking URI and Optuna storage as one value), `tracking`
(MLflow runs, tags, artifacts), `server` (the MLflow UI and tracking server), `study` (a sweep's Optuna
study: its context, plans and their runs, progress).
"""
