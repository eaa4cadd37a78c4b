"""A trained run outside ablate: its model and tokenizer as a `transformers` folder (`ablate export`), and
the paper's downstream tasks (Table 1) scored by LM Eval Harness on every run of a study (`ablate eval
--downstream`). Needs the `export` extra (transformers, safetensors) and, for the harness, `eval`
(lm-eval); docs/export-and-downstream.md says how to use both offline."""
