"""`ablate export`: a finished run of a study (or one of its budget branches) as a `transformers` folder
(ablate.hf.export): `from_pretrained(DIR)` loads it, with `trust_remote_code=True` where it has no built-in class."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from ablate.core.errors import UserError
from ablate.verbs.options import Shared, load, shared


@shared("scale", "workspace", "tracking_uri", "storage")
def export(
    recipe: str,
    run: str,
    out: str,
    checkpoint: Literal["best", "last"] = "best",
    *,
    overrides: list | None = None,
    **options: Any,
) -> int:
    """Write a finished run as a transformers folder (safetensors, config, tokenizer.json).

    Args:
        recipe: recipe YAML file of the sweep
        run: the run: its name (transformer-s0) or its MLflow run id (a budget branch: its run id)
        out: folder to write (created; files of an earlier export in it are replaced)
        checkpoint: which checkpoint of the run: best (lowest validation loss) or last
    """
    try:
        from ablate.hf.export import export_run
    except ImportError as e:
        raise UserError(
            f"export: needs the export extra ({e.name} is missing): pip install 'ablate[export]'"
        ) from None
    opts = Shared(**options)
    loaded = load(recipe, overrides, opts.scale)
    exported = export_run(
        loaded, opts.stores, scale=loaded.scale, run=run, out=Path(out), checkpoint=checkpoint
    )
    how = (
        "trust_remote_code=True (" + str(exported.why_custom) + ")"
        if exported.remote_code
        else "no remote code"
    )
    print(f"[export] {run}: {exported.architecture} in {exported.folder} ({how})", flush=True)
    return 0
