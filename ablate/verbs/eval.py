"""`ablate eval`: the recipe's probes (activation outliers, low-bit logits, ...) on a sweep's finished
checkpoints, logged to the same runs (ablate.probes.run), then the report written again with their tables.
With `--downstream`: the paper's downstream tasks through LM Eval Harness instead (ablate.hf.downstream),
logged to the same runs, and the downstream table (`downstream.csv`, `downstream.md`) in the report folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ablate.core.errors import UserError
from ablate.verbs.options import Shared, load, shared

if TYPE_CHECKING:
    from ablate.probes.run import EvalSummary
    from ablate.recipe.resolve import Recipe
    from ablate.store.stores import Stores


@shared("scale", "workspace", "tracking_uri", "storage", "reports")
def evaluate(
    recipe: str,
    probes: list[str] | None = None,
    checkpoint: Literal["best", "last"] | None = None,
    tokens: int | None = None,
    downstream: bool = False,
    tasks: list[str] | None = None,
    task_folder: str | None = None,
    num_fewshot: int = 0,
    limit: int | None = None,
    logit_bits: list[int] | None = None,
    *,
    overrides: list | None = None,
    **options: Any,
) -> int:
    """Run the recipe's probes on a sweep's finished checkpoints (attention outliers, low-bit logits, ...).

    Args:
        recipe: recipe YAML file of the sweep
        probes: probes to run (default: the recipe's eval.probes)
        checkpoint: which checkpoint of each run (default: the recipe's eval.checkpoint)
        tokens: held-out tokens each probe reads (default: the recipe's eval.tokens, the paper's 0.4M)
        downstream: score LM Eval Harness tasks instead of the probes (needs ablate[eval]; offline)
        tasks: downstream tasks (default: the paper's Table 1: arc_challenge, arc_easy, boolq, hellaswag,
            openbookqa, piqa, winogrande)
        task_folder: a folder of harness task YAML files with local data (TaskManager's include_path)
        num_fewshot: examples in each prompt (0: zero-shot; Table 8: 5)
        limit: documents per task (default: all)
        logit_bits: also score the tasks with attention logits quantized to these bits (Figure 8: 8 6 4)
    """
    opts = Shared(**options)
    loaded = load(recipe, overrides, opts.scale)
    if downstream or tasks:
        from ablate.hf.downstream import TABLE1, DownstreamSettings

        settings = DownstreamSettings(
            tasks=tuple(tasks or TABLE1),
            num_fewshot=_count("num_fewshot", num_fewshot, 0),
            task_folder=task_folder,
            limit=None if limit is None else _count("limit", limit, 1),
            checkpoint=checkpoint or "best",
            logit_bits=tuple(_count("logit_bits", b, 2) for b in logit_bits or ()),
        )
        run_downstream(loaded, opts.stores, settings, scale=loaded.scale, reports=Path(opts.reports))
        return 0
    scale = loaded.scale
    config = loaded.eval(
        scale
    )  # the recipe's eval section at this scale fills what the command line leaves out
    run_eval(
        loaded,
        opts.stores,
        scale=scale,
        probes=probes or config.probes,
        checkpoint=checkpoint or config.checkpoint,
        reports=Path(opts.reports),
        tokens=tokens,
    )
    return 0


def run_eval(
    recipe: Recipe,
    stores: Stores,
    *,
    scale: str | None = None,
    probes: list[Any] | None = None,
    checkpoint: str | None = None,
    reports: Path | None = None,
    tokens: int | None = None,
) -> EvalSummary:
    """Probe every finished run of `recipe`'s sweep at `scale` (see the module doc), then rewrite the report.
    A second call with the same settings probes nothing and leaves the report as it is."""
    from ablate.probes.run import EvalSummary, build_probes, eval_settings, finished_runs, probe_run
    from ablate.report.write import write_report
    from ablate.store.study import finished_sweep, report_folder

    scale = scale or recipe.default_scale
    settings = eval_settings(recipe, scale, probes=probes, checkpoint=checkpoint, tokens=tokens)
    built = build_probes(settings)
    ctx, study, client = finished_sweep(recipe, scale, stores, "eval")
    runs, left_out = finished_runs(ctx, study, client)
    ctx.seeds = sorted({run.seed for run, _ in runs}) or recipe.seeds
    summary = EvalSummary(left_out=left_out)
    if not runs:
        raise UserError(
            f"eval: no finished runs in study {ctx.study_name!r}"
            + (f" ({'; '.join(left_out)})" if left_out else "")
            + "; finish the sweep first"
        )
    for run, run_id in runs:
        try:
            done, skipped = probe_run(run, run_id, built, settings, workspace=stores.workspace, client=client)
        except FileNotFoundError as e:
            summary.left_out.append(f"{run.name}: {e}")
            print(f"[eval] {run.name}: left out: {e}", flush=True)
            continue
        summary.probed += [f"{run.name}: {n}" for n in done]
        summary.skipped += [f"{run.name}: {n}" for n in skipped]
        if done:
            print(
                f"[eval] {run.name}: probed {', '.join(done)}"
                + (f" (already had {', '.join(skipped)})" if skipped else ""),
                flush=True,
            )
    folder = report_folder(ctx, reports)
    if summary.probed or not (folder / "probes.md").exists():
        summary.report = write_report(ctx, study, folder)
        if (folder / "probes.md").exists():
            print(f"[eval] {folder / 'probes.md'}\n\n{(folder / 'probes.md').read_text()}", flush=True)
    else:
        summary.report = folder
        print(
            f"[eval {ctx.study_name}] every run already probed with these settings "
            f"({len(summary.skipped)} run x probe pairs); nothing to do",
            flush=True,
        )
    for line in summary.left_out:
        print(f"[eval] left out: {line}", flush=True)
    return summary


def _count(name: str, value: int, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise UserError(f"--{name}: expected a whole number >= {least}, got {value!r}")
    return value


def run_downstream(recipe: Recipe, stores: Stores, settings: Any, *, scale: str, reports: Path) -> Path:
    """Score every finished run of the study on the downstream tasks (each run once per settings), log them
    to the runs, and write the downstream table; returns its CSV."""
    import importlib.util

    if missing := [m for m in ("lm_eval", "transformers") if importlib.util.find_spec(m) is None]:
        raise UserError(
            f"eval: --downstream needs the eval extra ({', '.join(missing)} missing): pip install 'ablate[eval]'"
        )
    from ablate.hf import downstream as ds
    from ablate.hf.downstream_table import table_rows, write_table
    from ablate.hf.runs import ablate_tokenizer, with_branches
    from ablate.probes.run import finished_runs, load_model
    from ablate.store.study import finished_sweep, report_folder

    ctx, study, client = finished_sweep(recipe, scale, stores, "eval")
    runs, left_out = finished_runs(ctx, study, client)
    if not runs:
        raise UserError(f"eval: no finished runs in study {ctx.study_name!r}; finish the sweep first")
    runs = with_branches(runs, client)  # a budgeted study's smaller budgets too, each at its tokens
    manager = ds.load_tasks(settings)  # every task's data checked before any run is scored
    scored = []
    for run, run_id in runs:
        scores = ds.logged_scores(client, run_id, settings)
        if scores is None:
            try:
                model = load_model(run, stores.workspace, settings.checkpoint)
            except FileNotFoundError as e:
                left_out.append(f"{run.name}: {e}")
                continue
            tok = ablate_tokenizer(run.data, stores.workspace)
            scores = ds.score(model, tok, run.train.seq_len, manager, settings)
            ds.log_scores(client, run_id, run, scores, settings)
            print(f"[eval] {run.name}: scored {', '.join(settings.tasks)}", flush=True)
        scored.append((run, ds.run_tokens(run), scores))
    order = [v for v in recipe.variants if any(run.variant == v for run, _, _ in scored)]
    labels = {run.variant: run.label for run, _, _ in scored}
    csv_path, md_path = write_table(table_rows(scored, order, labels), report_folder(ctx, reports), settings)
    print(f"[eval] {csv_path}\n\n{md_path.read_text()}", flush=True)
    for line in left_out:
        print(f"[eval] left out: {line}", flush=True)
    return csv_path
