"""Reading finished runs into reports: `table` (a sweep's table, CSV, loss curves, README), `checks`
(convergence, lr sensitivity, honesty notes), `stats` (paired intervals), `plots`, `probes` and `tasks`
(probe and task tables), `fit` and `fit_runs` (`ablate fit`: fit.json, fit.md, scaling plots).
"""
