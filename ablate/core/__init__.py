"""The bottom layer: what every other folder may use.

`errors` (UserError, did-you-mean), `config` (YAML loading, merging, typed checks by jsonargparse, the
train/eval/tolerance sections), `registry` (kinds -> names -> classes, plugin discovery), `contract` (what
a component is told and may tell the engine), `tables` (Markdown tables, SI numbers, durations).
"""
