"""The names ablate writes into its records, in one table: MLflow tags, the Optuna study's attribute that
remembers the sweep's parent run, the export's metadata key.

Every writer and every reader takes the name from here, so a name written in one place and searched for
in another cannot drift apart. The values are the on-disk contract: runs recorded by earlier versions
carry them, so a value changes only with a way to read the old one.

Its layer is `store` (the records): the modules that write or read these names (train, report, probes,
sweep, the verbs) all lie above it.
"""

from __future__ import annotations

PREFIX = "ablate."  # every tag of ablate's own

# A run's identity (ablate.store.tracking.run_tags): what it is and which code trained it.
RECIPE = PREFIX + "recipe"
VARIANT = PREFIX + "variant"
LABEL = PREFIX + "label"
SCALE = PREFIX + "scale"
SEED = PREFIX + "seed"
SIZE = PREFIX + "size"  # only for a recipe with sizes
RUN_KEY = PREFIX + "run_key"  # a hash of the resolved config: how a run is found again
CODE_VERSION = PREFIX + "code_version"

# The sweep: its parent run (role "sweep") and each trial's run.
STUDY = PREFIX + "study"
ROLE = PREFIX + "role"
SWEEP_ROLE = "sweep"  # the value of ROLE on a sweep's parent run
TRIAL = PREFIX + "trial"
PRUNED = PREFIX + "pruned"
FAILURE_REASON = PREFIX + "failure_reason"

# The model trained and how (ablate.train): its shape, its size and the machine.
HEADS = PREFIX + "heads"
HEAD_WIDTH = PREFIX + "head_width"
GROUP_NORM = PREFIX + "gn"
LAMBDA_INIT = PREFIX + "lambda_init"
PARAMS = PREFIX + "params"
NON_EMBEDDING_PARAMS = PREFIX + "non_embedding_params"
FWD_FLOPS_PER_TOKEN = PREFIX + "fwd_flops_per_token"
TOKENS = PREFIX + "tokens"
PRECISION = PREFIX + "precision"
PRECISION_REASON = PREFIX + "precision_reason"
ATTENTION_KERNEL = PREFIX + "attention_kernel"
ATTENTION_CHOICE = PREFIX + "attention_choice"  # `auto` on CUDA: the core measured fastest
ATTENTION_TIMINGS_MS = PREFIX + "attention_timings_ms"  # json: each candidate's milliseconds
COMPILED = PREFIX + "compiled"  # "true" | "false": the model trains under torch.compile, as decided
# json: the chooser key of each `triton` kernel and shape the run launched -> its launch configuration
# ("128x64 w8 s2": tiles of query and key rows, warps, stages; ablate.model.kernels), written when the
# run finishes; absent where no kernel launched through the chooser (another backend, or interpreted)
TRITON_LAUNCH = PREFIX + "triton_launch"
# How the run's model was spread over its ranks (ablate.train.sharding.description): "fsdp over N ranks
# (FSDP2 per block and root, PRECISION)", "ddp over N ranks (a replica each)", or "none" on one device
SHARDING = PREFIX + "sharding"
MACHINE = PREFIX + "machine"
TORCH = PREFIX + "torch"  # the torch version that trained the run

# The data it read (ablate.data.passes says what they mean).
TRAIN_SPLIT_TOKENS = PREFIX + "train_split_tokens"
PASSES = PREFIX + "passes"

# Token budgets (ablate.train.branches): a budget's run, a branch off a longer run, a continued run.
BUDGET_STEPS = PREFIX + "budget_steps"
BUDGET_TOKENS = PREFIX + "budget_tokens"
BRANCHED_FROM = PREFIX + "branched_from"
BRANCH_STEP = PREFIX + "branch_step"
CONTINUED_FROM = PREFIX + "continued_from"
CONTINUED_STEP = PREFIX + "continued_step"

# Fits (ablate.report.fit_runs): on each fitted run, and the form on the sweep's parent run.
FIT_CONVERGED = PREFIX + "fit.converged"
FIT_PREDICTED_GAIN = PREFIX + "fit.predicted_gain"
FIT_CURVE = PREFIX + "fit.curve"
FIT_FORM = PREFIX + "fit.form"

# The sweep's parent run, for the MLflow UI (ablate.store.difference_keys): the rows in order, the paired
# differences' reference row per size and the rows whose differences have one seed (each json).
VARIANTS_ORDER = PREFIX + "variants"
DIFFERENCES_REFERENCE = PREFIX + "differences.reference"
DIFFERENCES_NO_INTERVAL = PREFIX + "differences.no_interval"

# The run's transformers export (ablate.hf.export): the folder, and the class it loads as.
HF_EXPORT = PREFIX + "export"
HF_EXPORT_CLASS = PREFIX + "export.class"
# Downstream tasks (ablate.hf.downstream): `ablate.downstream` holds the key of the settings scored,
# `ablate.downstream.settings` the settings.
DOWNSTREAM = PREFIX + "downstream"
DOWNSTREAM_SETTINGS = PREFIX + "downstream.settings"

# Probes (ablate.probes.run): `ablate.probe.<probe>` holds the key of what was measured,
# `ablate.probe.<probe>.settings` the settings it ran with.
PROBE_PREFIX = PREFIX + "probe."
SETTINGS_SUFFIX = ".settings"


def probe_tag(probe: str) -> str:
    return PROBE_PREFIX + probe


def probe_settings_tag(probe: str) -> str:
    return PROBE_PREFIX + probe + SETTINGS_SUFFIX


def probe_of_settings_tag(tag: str) -> str | None:
    """The probe whose settings tag `tag` is, or None for any other tag."""
    if tag.startswith(PROBE_PREFIX) and tag.endswith(SETTINGS_SUFFIX):
        return tag[len(PROBE_PREFIX) : -len(SETTINGS_SUFFIX)]
    return None


# MLflow's own names that ablate writes.
MLFLOW_PARENT = "mlflow.parentRunId"  # a trial's run is a child of the sweep's parent run
EXPERIMENT_KIND = "mlflow.experimentKind"  # read by the MLflow UI to open an experiment's training view

# The Optuna study's user attribute holding its MLflow parent run's id.
PARENT_RUN_ATTR = "mlflow_parent_run_id"

# The key of the study's description in the schema metadata of an export's runs.parquet (ablate.store.export).
EXPORT_METADATA_KEY = (PREFIX + "study").encode()
