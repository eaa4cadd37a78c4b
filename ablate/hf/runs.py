"""A study's finished run found by name (`diff-s0`) or MLflow run id (a budget branch's too), and its
tokenizer as ablate encodes with it: what `ablate export`, `ablate eval --downstream` and the harness's
command line read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ablate.core.errors import UserError
from ablate.core.workspace import Workspace


def finished_run(recipe: Any, stores: Any, scale: str, run: str, verb: str) -> tuple[Any, str, Any]:
    """(RunSpec, MLflow run id, MLflow client) of the finished run `run` (a name or an MLflow run id; a budget
    branch by its run id) of `recipe`'s sweep at `scale`."""
    from ablate.probes.run import finished_runs
    from ablate.store.study import finished_sweep

    ctx, study, client = finished_sweep(recipe, scale, stores, verb)
    runs, left_out = finished_runs(ctx, study, client)
    # a branch shares its run's name: the name picks the run trained longest, a branch goes by its run id
    chosen = [(spec, run_id) for spec, run_id in runs if run in (spec.name, run_id)]
    chosen += [(spec, run_id) for spec, run_id in with_branches(runs, client) if run == run_id]
    if not chosen:
        known = ", ".join(spec.name for spec, _ in runs) or "none"
        raise UserError(
            f"--run: no finished run {run!r} in study {ctx.study_name!r}; finished runs: {known}"
            + (f" (left out: {'; '.join(left_out)})" if left_out else "")
        )
    return chosen[0][0], chosen[0][1], client


def with_branches(runs: list[tuple[Any, str]], client: Any) -> list[tuple[Any, str]]:
    """`runs` ((RunSpec, MLflow run id) of a study's finished trials) and, after each, its finished budget
    branches (ablate.train.branches: each smaller budget's run, found by its run key), smallest first."""
    from ablate.store.tracking import find_runs

    out = []
    for run, run_id in runs:
        experiment = client.get_run(run_id).info.experiment_id
        for branch in run.branches():
            found = [r for r in find_runs(client, experiment, branch.key) if r.info.status == "FINISHED"]
            if found:
                out.append((branch, found[0].info.run_id))
        out.append((run, run_id))
    return out


def ablate_tokenizer(data: Any, workspace: Workspace) -> Any:
    """The run's tokenizer as ablate's data pipeline built it (encode, decode, eos_id)."""
    from ablate.data.config import parse_data_config
    from ablate.data.corpus import open_text_corpus
    from ablate.data.shards import is_shard_folder
    from ablate.data.tokenizers import EOS_CANDIDATES, get_tokenizer, parse_tokenizer_spec

    cfg = parse_data_config(data)
    folder = Path(cfg.source).expanduser()
    if is_shard_folder(folder):
        if (folder / "tokenizer.json").is_file():
            from tokenizers import Tokenizer

            file = Tokenizer.from_file(str(folder / "tokenizer.json"))
            eos = next((c for c in EOS_CANDIDATES if file.token_to_id(c) is not None), None)
            return get_tokenizer({"name": "hf", "path": str(folder / "tokenizer.json"), "eos": eos})
        return get_tokenizer(cfg.tokenizer or "byte")
    spec = parse_tokenizer_spec(cfg.tokenizer or "byte")
    if spec["name"] != "bpe":
        return get_tokenizer(spec)
    corpus = open_text_corpus(cfg)
    return get_tokenizer(
        spec,
        workspace=workspace,
        fingerprint=corpus.fingerprint,
        train_documents=lambda: corpus.documents("train"),
    )
