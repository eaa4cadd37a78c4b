"""`ablate <verb>`: the command line, derived by jsonargparse from the typed verb functions below.

Each verb is a function whose signature and docstring are its options (type, default, one-line help in
`ablate <verb> --help`), kept in `VERBS` (litgpt's dict of verbs). Heavy imports happen inside them, so
`ablate --help` is instant. What the verb's signature does not name is a dotted recipe override
(`--base.train.lr 3e-4`, `--variants.diff.model.attention.per_head_norm false`, `base.train.steps=7`),
checked against the recipe's types when the recipe is loaded; `ablate <verb> --help` lists the recipe's
`base.*` options with their types too. `--print_config` (or `--print-config`) prints the resolved recipe,
a file `ablate check` accepts as it is. A `UserError` anywhere becomes one line on stderr and exit code 2.

Flags are spelled with dashes as the README writes them (`--allow-unmatched`) or with underscores as
jsonargparse and LightningCLI users type them (`--allow_unmatched`); a bare boolean flag means true; a
list takes the values after it (`--seeds 0 1 2`). Flags are never abbreviated: a prefix such as `--h` or
`--scal` is read as a recipe override and refused by the recipe's keys.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
import sys
import types
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ablate.core.errors import UserError

if TYPE_CHECKING:
    from ablate.store.stores import Stores

DEFAULT_WORKSPACE = "ablate-runs"
PRINT_CONFIG = ("--print_config", "--print-config")


@dataclasses.dataclass(frozen=True)
class Shared:
    """The options several verbs take, declared once (type, default, help); a verb names the ones it
    takes with `@shared(...)` and reads them as `Shared(**options)`.

    Attributes:
        scale: scale preset of the recipe (paper, small, tiny, ...; default: the recipe's default_scale)
        seeds: seeds (default: the recipe's seeds)
        workspace: folder for the embedded stores, checkpoints and caches
        tracking_uri: MLflow tracking URI (default: SQLite in the workspace)
        storage: Optuna storage: postgresql://... for many machines (default: a journal file in the workspace)
        reports: folder for reports
        search: search spec of the sweep, e.g. sweeps/lr.yaml (default: the plain grid)
        grace_period: seconds without heartbeat after which a trial's worker counts as dead
    """

    scale: str | None = None
    seeds: list[int] | None = None
    workspace: str = DEFAULT_WORKSPACE
    tracking_uri: str | None = None
    storage: str | None = None
    reports: str = "reports"
    search: str | None = None
    grace_period: float = 60.0

    @property
    def workspace_path(self) -> Path:
        return Path(self.workspace)

    @property
    def stores(self) -> Stores:
        """Where the verb's records live: the workspace, `tracking_uri` (checked: one line when MLflow
        cannot use it) and `storage`."""
        from ablate.store.stores import Stores

        return Stores(self.workspace_path, tracking_uri_checked(self.tracking_uri), self.storage)


def shared(*names: str) -> Callable[[Callable[..., int]], Callable[..., int]]:
    """Mark a verb as taking these `Shared` options (as flags; the verb gets them in `**options`)."""
    unknown = set(names) - {f.name for f in dataclasses.fields(Shared)}
    assert not unknown, unknown  # a programming error, not a user's

    def mark(fn: Callable[..., int]) -> Callable[..., int]:
        fn.shared = names
        return fn

    return mark


# --- the verbs ------------------------------------------------------------------------------------------
def components(kind: str | None = None, imports: list[str] | None = None, options: str | None = None) -> int:
    """List registered components, or one component's recipe options.

    Args:
        kind: only this kind (attention, norm, lambda_init, ffn, position, task, probe)
        imports: plugin modules to import first
        options: show this component's options (type, default, help); also spelled `--help NAME`
    """
    from ablate.core import registry
    from ablate.core.config import describe
    from ablate.core.tables import markdown_table

    registry.load_plugins(imports or [])
    if options is not None:
        if kind is None:  # the kind whose registry holds that name
            kinds = [e.kind for e in registry.entries() if e.name == options]
            if len(kinds) != 1:
                raise UserError(
                    f"--kind: give the kind of {options!r} "
                    f"({'it is registered under ' + ', '.join(kinds) if kinds else 'no kind registers it'})"
                )
            kind = kinds[0]
        cls = registry.get(kind, options, key="--options")
        rows = [
            [
                o.name,
                describe(o.hint) if o.hint is not Any else "any",
                "(required)" if o.required else repr(o.default),
                o.help,
            ]
            for o in registry.options_of(cls)
        ]
        print(f"{kind} {options}: {registry.Entry(kind, options, cls).description}")
        print(markdown_table(["option", "type", "default", "help"], rows))
        return 0
    rows = [[e.kind, e.name, e.class_path, e.description] for e in registry.entries(kind)]
    print(markdown_table(["kind", "name", "class", "description"], rows))
    return 0


@shared("scale", "workspace")
def check(
    recipe: str, allow_unmatched: bool = False, *, overrides: list | None = None, **options: Any
) -> int:
    """Validate a recipe and compare the variants' params and FLOPs (exit 2 if unmatched); say how many
    training tokens its corpus holds and how many passes each run makes over them.

    Args:
        recipe: recipe YAML file, e.g. recipes/table6.yaml
        allow_unmatched: exit 0 even if variants are unmatched
    """
    from ablate.recipe.check import run_check
    from ablate.recipe.data_use import data_uses

    opts = Shared(**options)
    loaded = _load(recipe, overrides, opts.scale)
    scale = loaded.scale
    table = run_check(loaded, scale, allow_unmatched=allow_unmatched)
    print(
        f"recipe {loaded.name}, scale {scale}: params and forward FLOPs per token at seq_len "
        f"(matrix products, dense attention maps; training = 3x)"
    )
    print(table)
    for use in data_uses(loaded.runs_for(loaded.seeds[:1]), opts.workspace_path, strict=False):
        print(use.line() + ("" if not use.repeats or use.allowed else f"; {use.refusal()}"))
    tol = loaded.tolerance
    print(
        f"all variants within tolerance (params {tol.params:.0%}, FLOPs {tol.flops:.0%}) of the first row"
        if "UNMATCHED" not in table
        else "unmatched variants allowed by --allow-unmatched"
    )
    return 0


@shared("scale", "workspace", "tracking_uri")
def train(
    recipe: str,
    variant: str,
    seed: int | None = None,
    size: str | None = None,
    *,
    overrides: list | None = None,
    **options: Any,
) -> int:
    """Train one variant of a recipe (resumes from its last checkpoint if interrupted); with budgets, the
    longest run and a cooldown branch per smaller budget.

    Args:
        recipe: recipe YAML file, e.g. recipes/table6.yaml
        variant: variant key, e.g. diff
        seed: seed (default: the recipe's first)
        size: size, for recipes with a sizes axis (scaling grids)
    """
    from ablate.train.branches import train_budgets

    opts = Shared(**options)
    loaded = _load(recipe, overrides, opts.scale)
    seeds = [seed] if seed is not None else loaded.seeds[:1]
    runs = loaded.runs_for(seeds, variants=[variant])
    sizes = [r.size for r in runs]
    if len(runs) > 1 or size is not None:
        if size not in sizes:
            raise UserError(
                f"--size: {'choose one' if size is None else repr(size) + ' is not'} of this "
                f"recipe's sizes at this scale: {', '.join(map(str, sizes))}"
            )
        runs = [r for r in runs if r.size == size]
    (run,) = runs
    for result in train_budgets(run, opts.stores):
        print(result.summary())  # the run, then each smaller budget's branch (ablate.recipe.budgets)
    return 0


@shared("scale", "seeds", "workspace", "tracking_uri", "storage", "reports")
def sweep(
    recipe: str,
    workers: int = 1,
    search: str | None = None,
    yes: bool = False,
    allow_unmatched: bool = False,
    no_train: bool = False,
    grace_period: float = 60.0,
    final: bool = False,
    launcher: Literal["local", "slurm"] | None = None,
    wait: bool = False,
    *,
    overrides: list | None = None,
    **options: Any,
) -> int:
    """Train every variant x seed of a recipe as one Optuna study, then report.

    Args:
        recipe: recipe YAML file, e.g. recipes/table6.yaml
        workers: local worker processes (1: this one)
        search: search spec, e.g. sweeps/lr.yaml (default: the plain grid)
        yes: start without asking even if estimated over an hour
        allow_unmatched: train variants beyond the FLOPs tolerance
        no_train: only enqueue the trials and create the MLflow parent run; `ablate worker`s train them
        grace_period: seconds without heartbeat after which a trial's worker counts as dead
        final: the study is final: delete the stable-phase checkpoints kept to extend its budgets
        launcher: where the workers run: local (this machine) or slurm (a job array of --workers tasks;
            options in the recipe's launcher.slurm, e.g. --launcher.slurm.partition gpu); default: the recipe's
        wait: with --launcher slurm, wait for the jobs (printing progress), then report
    """
    from ablate.recipe.check import run_check
    from ablate.sweep.run import run_sweep

    opts = Shared(**options)
    ctx = _sweep_context(recipe, opts, search, grace_period, overrides)
    if workers < 1:
        raise UserError(f"--workers: expected a positive number, got {workers}")
    submit = _slurm_launch(ctx, launcher, workers, wait, overrides)
    checked = run_check(ctx.recipe, ctx.scale, allow_unmatched=allow_unmatched)
    print(
        checked.split("\n\n", 1)[-1]
    )  # the check's notes: how FLOPs were counted, solved knobs, differences
    folder = run_sweep(
        ctx,
        workers=workers,
        yes=yes,
        reports=Path(opts.reports),
        overrides_argv=_override_argv(overrides or []),
        train=not no_train,
        final=final,
        submit=submit,
    )
    if folder is not None:
        print(f"report: {folder}/table.md (and table.csv, loss_curves.png)")
        _print_ui_link(ctx, opts)
    return 0


def _print_ui_link(ctx: Any, opts: Shared) -> None:
    """How to open the sweep's runs in the MLflow UI: the command, and the link to its comparison view."""
    from ablate.store.stores import sweep_runs_url

    ui = "ablate ui" + (f" --workspace {opts.workspace}" if opts.workspace != DEFAULT_WORKSPACE else "")
    uri = ctx.stores.tracking_uri or ""
    served = uri if uri.startswith("http") else "http://127.0.0.1:5000"
    url = sweep_runs_url(ctx.stores, ctx.recipe.name, ctx.scale, served) or served
    print(f"MLflow UI: {ui}  -> {url}")


@shared("scale", "seeds", "workspace", "tracking_uri", "storage", "search", "grace_period")
def worker(
    recipe: str,
    launcher: Literal["local", "slurm"] | None = None,
    workers: int = 1,
    *,
    overrides: list | None = None,
    **options: Any,
) -> int:
    """Join an existing sweep's study and run its waiting trials.

    Args:
        recipe: recipe YAML file of the sweep
        launcher: local (this process) or slurm (submit --workers worker jobs); default: the recipe's
        workers: with --launcher slurm, worker jobs to submit
    """
    import socket

    from ablate.sweep.run import open_study, work, worker_placement

    opts = Shared(**options)
    ctx = _sweep_context(recipe, opts, opts.search, opts.grace_period, overrides)
    if workers < 1:
        raise UserError(f"--workers: expected a positive number, got {workers}")
    submit = _slurm_launch(ctx, launcher, workers, False, overrides)
    if submit is None and workers != 1:
        raise UserError(
            "--workers: a local `ablate worker` is one process; start more, use `ablate sweep --workers N`, "
            "or --launcher slurm to submit N worker jobs"
        )
    study, store = open_study(ctx, create=False)
    if submit is not None:
        submit(study)
        return 0
    placed = "".join(f", {k} {v}" for k, v in worker_placement().items())
    print(f"[worker] on {socket.gethostname()}{placed}", flush=True)
    trained = work(ctx, study, store)
    print(f"[worker] trained {trained} trials; no waiting trials left", flush=True)
    return 0


@shared("scale", "seeds", "workspace", "tracking_uri", "storage", "search", "grace_period")
def status(recipe: str, *, overrides: list | None = None, **options: Any) -> int:
    """How far a sweep is: trials finished / running (host, Slurm job) / waiting / failed, tokens, ETA.

    Args:
        recipe: recipe YAML file of the sweep
    """
    from ablate.store.study import load_finished_study
    from ablate.sweep.status import status_report

    opts = Shared(**options)
    ctx = _sweep_context(recipe, opts, opts.search, opts.grace_period, overrides)
    print(status_report(ctx, load_finished_study(ctx, "ablate status")))
    return 0


@shared("scale", "seeds", "workspace", "tracking_uri", "storage", "reports", "search", "grace_period")
def report(
    recipe: str | None = None,
    from_: str | None = None,
    *,
    overrides: list | None = None,
    **options: Any,
) -> int:
    """Write the report of a sweep (table, CSV, loss curves).

    Args:
        recipe: recipe YAML file of the sweep
        from_: a report folder to write again from its export (runs.parquet, metrics.parquet), with no store
    """
    from ablate.report.write import rebuild_report, write_report
    from ablate.store.study import open_study, report_folder

    if from_:
        if recipe or overrides:
            raise UserError("ablate report --from: the export names its recipe; give no recipe or overrides")
        rebuild_report(Path(from_))
        return 0
    if not recipe:
        raise UserError("ablate report: give a recipe (e.g. recipes/table6.yaml) or --from reports/NAME/")
    opts = Shared(**options)
    ctx = _sweep_context(recipe, opts, opts.search, opts.grace_period, overrides)
    study, _ = open_study(ctx, create=False)
    write_report(ctx, study, report_folder(ctx, Path(opts.reports)))
    _print_ui_link(ctx, opts)
    return 0


@shared("scale", "workspace", "tracking_uri", "storage")
def fit(
    recipe: str | None = None,
    csv: str | None = None,
    from_: str | None = None,
    form: Literal["size", "tokens", "joint", "grid"] | None = None,
    out: str | None = None,
    bootstrap: int = 1000,
    params_count: Literal["non_embedding", "total"] = "non_embedding",
    *,
    overrides: list | None = None,
    **options: Any,
) -> int:
    """Fit scaling laws to a sweep's finished runs (or to a CSV of points).

    Args:
        recipe: recipe of the sweep (or give --csv)
        csv: fit points from a CSV: columns params, tokens, loss[, arch, run_id]
        from_: a grid fit's folder to write again from its export (runs.parquet, metrics.parquet), with no
            store
        form: law to fit (default: size; grid, the joint and per-axis fits with paired-seed ratios, for
            sizes x token budgets)
        out: output folder (default reports/<recipe>[-<scale>])
        bootstrap: bootstrap resamples over runs
        params_count: which parameter count N is (non_embedding: Kaplan et al.)
    """
    if from_:
        from ablate.report.fit_runs import rebuild_fit

        if recipe or csv or overrides:
            raise UserError(
                "ablate fit --from: the export names its recipe; give no recipe, --csv or overrides"
            )
        written = rebuild_fit(Path(from_))
    elif csv:
        from ablate.report.fit import run_fit_csv

        if recipe:
            raise UserError("ablate fit: give a recipe or --csv FILE, not both")
        if bootstrap < 1:
            raise UserError(f"--bootstrap: expected a positive number, got {bootstrap}")
        written = run_fit_csv(csv, form or "size", out or "reports/fit", n_boot=bootstrap)
    else:
        from ablate.report.fit_runs import run_fit_recipe

        if not recipe:
            raise UserError("ablate fit: give a recipe (e.g. recipes/scaling-size.yaml) or --csv FILE")
        opts = Shared(**options)
        loaded = _load(recipe, overrides, opts.scale)
        written = run_fit_recipe(
            loaded,
            opts.stores,
            scale=loaded.scale,
            form=form,
            out=Path(out) if out else None,
            n_boot=bootstrap,
            params_count=params_count,
        )
    for path in written:
        print(path)
    return 0


def bench(
    recipe: str = "recipes/table6.yaml",
    scale: str = "small",
    variants: list[str] | None = None,
    seq_lens: list[int] | None = None,
    rounds: int = 3,
    tokens_per_step: int = 4096,
    batch_size: int | None = None,
    backend: str | None = None,
    compile: bool = False,
    out: str = "reports/bench",
    *,
    overrides: list | None = None,
    **more: Any,
) -> int:
    """Training/forward throughput, peak memory and MFU per variant and sequence length.

    Args:
        recipe: recipe YAML file
        scale: scale preset (small: d_model 768, 12 layers)
        variants: variants to time; ratios are against the first (default transformer diff)
        seq_lens: sequence lengths (default 512 1024 2048 4096 and the scale's training length)
        rounds: interleaved rounds; the median is reported
        tokens_per_step: tokens per step: max(1, this // seq_len) sequences
        batch_size: sequences per step, instead of --tokens-per-step
        backend: attention backend for every variant (default: the recipe's)
        compile: run each model under torch.compile
        out: output folder
    """
    from ablate.train.bench import run_bench

    run_bench(
        recipe,
        scale=scale,
        variants=variants or ["transformer", "diff"],
        seq_lens=seq_lens,
        rounds=rounds,
        out=out,
        batch_size=batch_size,
        tokens_per_step=tokens_per_step,
        overrides=overrides or [],
        backend=backend,
        compile=compile,
        **more,
    )
    return 0


# `run_bench` keyword arguments that are the library's, not the command line's. Every other keyword-only
# argument of run_bench with a default (e.g. `device`, `precision`) becomes a `bench` flag by itself.
BENCH_INTERNAL = ("overrides", "tune_malloc", "retries", "echo", "ops")


@shared("scale", "workspace")
def prepare(
    recipe: str,
    out: str,
    workers: int | None = None,
    shard_tokens: int | None = None,
    *,
    overrides: list | None = None,
    **options: Any,
) -> int:
    """Tokenize a recipe's corpus into shards with every core (run again to resume an interrupted one).

    Args:
        recipe: recipe YAML file
        out: folder for the shards (and manifest.json)
        workers: tokenizing processes (default: one per core)
        shard_tokens: tokens per shard, closed at the next document end (default 64M)
    """
    from ablate.data import prepare as prepare_shards

    opts = Shared(**options)
    loaded = _load(recipe, overrides, opts.scale)
    paths = prepare_shards(loaded.runs[0].data, Path(out), opts.workspace_path, shard_tokens, workers=workers)
    for path in paths:
        print(path)
    return 0


@shared("scale", "workspace", "tracking_uri", "storage", "reports")
def evaluate(
    recipe: str,
    probes: list[str] | None = None,
    checkpoint: Literal["best", "last"] | None = None,
    tokens: int | None = None,
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
    """
    from ablate.probes.run import run_eval

    opts = Shared(**options)
    loaded = _load(recipe, overrides, opts.scale)
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


@shared("workspace", "tracking_uri")
def ui(host: str = "127.0.0.1", port: int = 5000, **options: Any) -> int:
    """Start the MLflow UI over the workspace store.

    Args:
        host: interface to listen on (127.0.0.1: this machine only)
        port: port to listen on
    """
    from ablate.store.server import serve_ui

    opts = Shared(**options)
    return serve_ui(opts.stores, host=host, port=port)


@shared("workspace")
def server(
    backend_store_uri: str | None = None,
    artifacts: str | None = None,
    host: str = "127.0.0.1",
    port: int = 5000,
    workers: int = 1,
    allowed_hosts: str | None = None,
    **options: Any,
) -> int:
    """Start an MLflow tracking server (SQL store, served artifacts) for many workers.

    Args:
        backend_store_uri: SQL store, e.g. postgresql://user@dbhost/mlflow (default: SQLite in the workspace)
        artifacts: folder the server keeps artifacts in (default <workspace>/artifacts)
        host: interface to listen on (127.0.0.1: this machine only)
        port: port to listen on
        workers: server processes
        allowed_hosts: Host headers to accept besides localhost and private IPs, e.g. mlflow.example.org:5000
    """
    from ablate.store.server import serve

    return serve(
        workspace=Shared(**options).workspace_path,
        backend_store_uri=backend_store_uri,
        artifacts=Path(artifacts) if artifacts else None,
        host=host,
        port=port,
        workers=workers,
        allowed_hosts=allowed_hosts,
    )


VERBS: dict[str, Callable[..., int]] = {
    "components": components,
    "check": check,
    "train": train,
    "sweep": sweep,
    "worker": worker,
    "status": status,
    "report": report,
    "fit": fit,
    "bench": bench,
    "prepare": prepare,
    "eval": evaluate,
    "ui": ui,
    "server": server,
}
POSITIONAL = {"recipe"}  # every other parameter is a flag


# --- helpers of the verbs ----------------------------------------------------------------------------------
def _load(path: str, overrides: list | None, scale: str | None = None):
    from ablate.recipe.resolve import load_recipe

    return load_recipe(path, overrides or [], scale=scale)


# What MLflow can track to: its server, a database it supports, or a folder (file store).
TRACKING_SCHEMES = (
    "http",
    "https",
    "file",
    "sqlite",
    "postgresql",
    "mysql",
    "mssql",
    "databricks",
    "databricks-uc",
)


def tracking_uri_checked(uri: str | None) -> str | None:
    """`--tracking-uri`, refused in one line when MLflow cannot use it (ftp://..., a typo in the scheme)."""
    if uri is None:
        return None
    scheme = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://", uri)
    base = scheme.group(1).split("+")[0].lower() if scheme else None
    if scheme and base not in TRACKING_SCHEMES or not uri.strip():
        raise UserError(
            f"--tracking-uri: {uri!r} is not a tracking URI MLflow can use; give one of "
            f"{', '.join(s + '://' for s in TRACKING_SCHEMES)} or a folder"
        )
    return uri


def _sweep_context(
    recipe: str, opts: Shared, search: str | None, grace_period: float, overrides: list | None
):
    from ablate.recipe.search import SearchSpec, load_search_spec
    from ablate.store.study import SweepContext

    loaded = _load(recipe, overrides, opts.scale)
    return SweepContext(
        recipe=loaded,
        scale=loaded.scale,
        seeds=opts.seeds or loaded.seeds,
        stores=opts.stores,
        search=load_search_spec(search) if search else SearchSpec(),
        search_path=search,
        grace_period=grace_period,
    )


def _slurm_launch(ctx, launcher: str | None, workers: int, wait: bool, overrides: list | None):
    """`--launcher slurm`: Slurm and the stores checked now, before anything is enqueued; returns what
    submits the worker jobs (ablate.sweep.slurm), or None for local workers."""
    if (launcher or ctx.recipe.file.launcher.name) != "slurm":
        if wait:
            raise UserError("--wait: waits for Slurm jobs; use it with --launcher slurm")
        return None
    from ablate.cli import main as cli_main  # this module by name, not `__main__`: pickled by reference
    from ablate.sweep.slurm import launch

    return launch(
        ctx, workers, ctx.recipe.file.launcher.slurm, cli_main, _override_argv(overrides or []), wait
    )


def _override_argv(overrides: list) -> list[str]:
    return [f"--{key}={json.dumps(value)}" for key, value in overrides]


# --- the parser -------------------------------------------------------------------------------------------
# jsonargparse builds each verb's parser from its signature and docstring, validates the types, prints the
# help and the subcommands. What is written by hand below, and why jsonargparse cannot do it:
# - split_argv: a verb's unknown arguments are recipe overrides (`--base.train.lr 3e-4`, `--scal` refused as
#   a recipe key): jsonargparse has no parse_known_args, so the argv is split before it parses. The same
#   pass lets a boolean flag stand bare (`--yes`; jsonargparse wants `--yes true`) and a list take the
#   values after it (`--seeds 0 1 2`; jsonargparse wants `--seeds [0,1,2]` or `--seeds+` per value).
# - _one_line: jsonargparse's errors run over several lines of detail; a user error here is one line.
# - Flag and verb_flags: the flags of a verb are its signature, its `Shared` options and, for bench,
#   run_bench's keyword arguments (BENCH_INTERNAL: those that are the library's, not the command line's).
@dataclasses.dataclass(frozen=True)
class Flag:
    name: str  # the parameter
    hint: Any
    default: Any

    @property
    def is_bool(self) -> bool:
        return _strip_none(self.hint) is bool

    @property
    def is_list(self) -> bool:
        return typing.get_origin(_strip_none(self.hint)) is list


def _strip_none(hint: Any) -> Any:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1 else hint


def verb_flags(verb: str) -> dict[str, Flag]:
    """The verb's parameters (flags and positionals) with their type hints; bench adds run_bench's extras."""
    fn = VERBS[verb]
    hints = typing.get_type_hints(fn)
    flags = {
        n: Flag(n, hints[n], p.default)
        for n, p in inspect.signature(fn).parameters.items()
        if p.kind is p.POSITIONAL_OR_KEYWORD
    }
    shared_hints = typing.get_type_hints(Shared)
    for f in dataclasses.fields(Shared):
        if f.name in getattr(fn, "shared", ()):
            flags[f.name] = Flag(f.name, shared_hints[f.name], f.default)
    if verb == "bench":
        flags.update(_bench_extras())
    return flags


def _bench_extras() -> dict[str, Flag]:
    from ablate.train.bench import run_bench

    hints = typing.get_type_hints(run_bench)
    covered = set(inspect.signature(bench).parameters) | {"recipe_path", *BENCH_INTERNAL}
    return {
        n: Flag(n, hints.get(n, str), p.default)
        for n, p in inspect.signature(run_bench).parameters.items()
        if p.kind is p.KEYWORD_ONLY and n not in covered and p.default is not p.empty
    }


def _takes_overrides(verb: str) -> bool:
    return "overrides" in inspect.signature(VERBS[verb]).parameters


def build_parser(verb: str | None = None):
    """The jsonargparse parser: one subcommand per verb from its function (`verb` given: that verb's
    parser with everything, including run_bench's extra options and the recipe's base.* options in --help)."""
    from jsonargparse import ArgumentParser

    parser = ArgumentParser(
        prog="ablate",
        description="Declarative architecture ablations of decoder language "
        "models: ablate <verb> --help for each verb's options. There is no --config FILE: the recipe "
        "(the first argument of every verb that trains) is the config file, and --print_config writes "
        "one resolved, with the overrides applied.",
        exit_on_error=False,
    )
    from ablate import __version__

    parser.add_argument("--version", action="version", version=f"ablate {__version__}")
    subcommands = parser.add_subcommands(dest="verb", required=True)
    for name, fn in VERBS.items():
        usage = None
        if name == verb and _takes_overrides(name):  # the recipe options are many: --help lists them below
            usage = f"ablate {name} [options] [--base.SECTION.KEY VALUE ...] [--variants.VARIANT.SECTION.KEY VALUE ...]"
        sub = ArgumentParser(
            prog=f"ablate {name}", description=_first_line(fn), usage=usage, exit_on_error=False
        )
        if name == verb:
            _add_verb_arguments(sub, name)
            if _takes_overrides(name) and name != "bench":
                _add_recipe_help(sub)
        subcommands.add_subcommand(name, sub, help=_first_line(fn))
    return parser


def _add_verb_arguments(sub, verb: str) -> None:
    fn = VERBS[verb]
    docs = _param_docs(fn)
    group = sub.add_argument_group("options shared with other verbs (ablate.cli.Shared)")
    for flag in verb_flags(verb).values():
        help_text = docs.get(flag.name, "")
        where = group if flag.name in getattr(fn, "shared", ()) else sub
        if flag.name in POSITIONAL:
            kwargs: dict[str, Any] = (
                {"nargs": "?", "default": flag.default} if flag.default is not inspect._empty else {}
            )
            where.add_argument(flag.name, type=flag.hint, help=help_text, **kwargs)
            continue
        dashed, under = "--" + _spelled(flag.name).replace("_", "-"), "--" + _spelled(flag.name)
        names = [dashed] if dashed == under else [dashed, under]
        required = flag.default is inspect._empty
        where.add_argument(
            *names,
            dest=flag.name,
            type=flag.hint,
            help=help_text,
            required=required,
            **({} if required else {"default": flag.default}),
        )
    if _takes_overrides(verb):
        sub.add_argument(
            *PRINT_CONFIG,
            dest="print_config",
            type=bool,
            default=False,
            help="print the resolved recipe (a file `ablate check` accepts as it is) and exit",
        )


def _add_recipe_help(sub) -> None:
    """The recipe's base.* options, in --help only (their values go through the recipe, as overrides)."""
    from ablate.core.config import TrainConfig, field_docs
    from ablate.data.config import DataConfig
    from ablate.model.decoder import ModelConfig

    for section, cls in (("model", ModelConfig), ("train", TrainConfig), ("data", DataConfig)):
        group = sub.add_argument_group(
            f"recipe options: base.{section} (dotted overrides, applied to every run; "
            f"also --variants.KEY.{section}.OPTION)"
        )
        docs, hints = field_docs(cls), typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            default = (
                None
                if required
                else f.default
                if f.default is not dataclasses.MISSING
                else f.default_factory()
            )
            note = " (required in the recipe)" if required else ""
            note += (
                " (a component spec: name, {name: ..., <options>} or class_path/init_args)"
                if hints[f.name] is Any
                else ""
            )
            group.add_argument(
                f"--base.{section}.{f.name}",
                dest=f"recipe_help.{section}.{f.name}",
                type=hints[f.name],
                default=default,
                metavar="VALUE",
                help=docs.get(f.name, "") + note,
            )


def _spelled(name: str) -> str:
    """A parameter's flag: `from_` (a Python keyword with an underscore) is spelled `--from`."""
    return name[:-1] if name.endswith("_") else name


def _first_line(fn: Callable) -> str:
    """The docstring's first paragraph, as one line (a summary may wrap over several)."""
    return " ".join((inspect.getdoc(fn) or "").split("\n\n")[0].split())


def _param_docs(fn: Callable) -> dict[str, str]:
    """The verb's `Args:` helps, and those of the `Shared` options it takes."""
    import docstring_parser

    from ablate.core.config import field_docs

    own = {
        p.arg_name: " ".join((p.description or "").split())
        for p in docstring_parser.parse(inspect.getdoc(fn) or "").params
    }
    return {**{k: v for k, v in field_docs(Shared).items() if k in getattr(fn, "shared", ())}, **own}


DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*$")


def split_argv(verb: str, argv: list[str]) -> tuple[list[str], list[str], bool]:
    """The verb's arguments -> (arguments for jsonargparse, recipe override tokens, print_config).

    Flags the verb's signature names are the verb's (bare booleans become `true`, a list takes the values
    after it); `--print_config`/`--print-config` is ours; everything else that looks like a flag or a
    `key=value` is a recipe override, whole: `--h` is never `--help`, `--scal` never `--scale`."""
    flags = verb_flags(verb)
    by_spelling = {}
    for flag in flags.values():
        if flag.name not in POSITIONAL:
            spelled = _spelled(flag.name)
            by_spelling["--" + spelled] = by_spelling["--" + spelled.replace("_", "-")] = flag
    known: list[str] = []
    overrides: list[str] = []
    print_config = False
    i = 0
    while i < len(argv):
        token = argv[i]
        name, eq, value = token.partition("=")
        if token in ("-h", "--help"):
            if verb == "components" and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                known += ["--options", argv[i + 1]]  # `ablate components --kind attention --help diff`
                i += 2
                continue
            known.append(token)
        elif name in PRINT_CONFIG:
            print_config = True
        elif name in by_spelling:
            flag = by_spelling[name]
            if eq:
                known += [name, value]
            elif flag.is_bool:
                follows = i + 1 < len(argv) and argv[i + 1].lower() in ("true", "false")
                known += [name, argv[i + 1] if follows else "true"]
                i += follows
            elif flag.is_list:
                j = i + 1
                while j < len(argv) and not argv[j].startswith("--"):
                    j += 1
                if j == i + 1:
                    raise UserError(f"{name}: needs at least one value")
                known += [name, json.dumps([_scalar(v) for v in argv[i + 1 : j]])]
                i = j - 1
            else:
                if i + 1 >= len(argv):
                    raise UserError(f"{name}: needs a value (see ablate {verb} --help)")
                known += [name, argv[i + 1]]
                i += 1
        elif token.startswith("--"):
            overrides.append(token)
            if not eq and i + 1 < len(argv):
                overrides.append(argv[i + 1])
                i += 1
        elif eq and DOTTED.match(name) and "." in name:
            overrides.append(token)
        else:
            known.append(token)
        i += 1
    return known, overrides, print_config


def _scalar(text: str) -> Any:
    from ablate.core.config import load_yaml

    try:
        value = load_yaml(text)
    except Exception:
        return text
    return value if isinstance(value, int | float | str) and not isinstance(value, bool) else text


def parse_args(argv: Sequence[str]) -> tuple[str, dict[str, Any], list, bool]:
    """argv -> (verb, its keyword arguments, recipe overrides as (dotted key, value), print_config)."""
    from jsonargparse import ArgumentParser  # noqa: F401 (the parser's errors are jsonargparse's)

    argv = list(argv)
    verb = next((a for a in argv if not a.startswith("-")), None)
    if verb is None or verb not in VERBS:
        if verb is not None:
            from ablate.core.errors import closest

            raise UserError(f"ablate: unknown verb {verb!r}{closest(verb, VERBS)}; verbs: {', '.join(VERBS)}")
        build_parser().parse_args(argv or ["--help"])  # `ablate`, `ablate --help`: the verbs
        raise UserError("ablate: give a verb (see ablate --help)")
    at = argv.index(verb)
    known, override_tokens, print_config = split_argv(verb, argv[at + 1 :])
    if override_tokens and not _takes_overrides(verb):
        raise UserError(
            f"ablate {verb}: unexpected arguments {' '.join(override_tokens)} (see ablate {verb} --help)"
        )
    try:
        namespace = build_parser(verb).parse_args([*argv[:at], verb, *known])
    except Exception as e:  # jsonargparse's ArgumentError: several lines of detail -> one
        if type(e).__name__ not in ("ArgumentError", "NSKeyError", "ValueError", "TypeError"):
            raise
        raise UserError(_one_line(verb, str(e), known)) from None
    values = namespace[verb].as_dict() if hasattr(namespace[verb], "as_dict") else dict(namespace[verb])
    values = {k: v for k, v in values.items() if k in verb_flags(verb) or k == "options"}
    if not override_tokens:  # `ablate ui`, `ablate server`: no recipe, so no torch to import (or tear down)
        return verb, values, [], print_config
    from ablate.recipe.resolve import parse_overrides

    return verb, values, parse_overrides(override_tokens), print_config


def _one_line(verb: str, message: str, known: list[str]) -> str:
    """jsonargparse's error (several lines of detail) -> one line naming the flag, the type and the value."""
    from ablate.core.config import describe

    flags = verb_flags(verb)
    key = re.search(r'Parser key "([^"]+)"', message)
    if key and key.group(1) in flags:
        flag = flags[key.group(1)]
        spellings = {"--" + flag.name, "--" + flag.name.replace("_", "-")}
        given = next((known[i + 1] for i in range(len(known) - 1) if known[i] in spellings), None)
        return f"--{flag.name.replace('_', '-')}: expected {describe(flag.hint)}, got {given!r} (see ablate {verb} --help)"
    required = re.search(r"arguments are required: (.*)", message)
    if required:
        names = [n.strip().split(".")[-1] for n in required.group(1).split(",")]
        shown = [n.upper() if n in POSITIONAL else "--" + n.replace("_", "-") for n in names]
        return f"ablate {verb}: {', '.join(shown)} required (see ablate {verb} --help)"
    return f"ablate {verb}: {' '.join(message.split())} (see ablate {verb} --help)"


def print_resolved(recipe: str | None, scale: str | None, overrides: list) -> None:
    """`--print_config`: the recipe resolved at `scale` with the overrides applied, as a recipe file."""
    import yaml

    from ablate.recipe.resolve import resolved_recipe

    if not recipe:
        raise UserError("--print_config: prints a recipe; give one")
    loaded = _load(recipe, overrides, scale)
    print(
        f"# resolved by ablate from {loaded.path} at scale {loaded.scale}; "
        "`ablate check FILE` accepts this file as it is"
    )
    print(yaml.safe_dump(resolved_recipe(loaded, scale), sort_keys=False, allow_unicode=True), end="")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        verb, values, overrides, print_config = parse_args(argv)
        if print_config:
            print_resolved(values["recipe"], values.get("scale"), overrides)
            return 0
        if _takes_overrides(verb):
            values["overrides"] = overrides
        return VERBS[verb](**values) or 0
    except UserError as e:
        print(f"ablate: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ablate: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
