"""`ablate prepare`: a recipe's corpus tokenized into shards with every core (resumable; ablate.data)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ablate.core.errors import UserError
from ablate.verbs.options import Shared, load, shared


@shared("scale", "workspace")
def prepare(
    recipe: str,
    out: str | None = None,
    workers: int | None = None,
    shard_tokens: int | None = None,
    *,
    overrides: list | None = None,
    **options: Any,
) -> int:
    """Tokenize a recipe's corpus into shards with every core (run again to resume an interrupted one);
    or, given a built-in corpus's name (pypi-sdists), download and build that corpus in its cache.

    Args:
        recipe: recipe YAML file, or a built-in download corpus's name (no --out)
        out: folder for the shards (and manifest.json); needed with a recipe
        workers: tokenizing processes (default: one per core)
        shard_tokens: tokens per shard, closed at the next document end (default 64M)
    """
    from ablate.data import prepare as prepare_shards
    from ablate.data.builtin_corpus import BUILTIN_CORPORA
    from ablate.data.corpus import build_builtin

    if recipe in BUILTIN_CORPORA:
        print(build_builtin(recipe))
        return 0
    if out is None:
        raise UserError(f"--out: missing; give the folder for the shards of {recipe}")
    opts = Shared(**options)
    loaded = load(recipe, overrides, opts.scale)
    paths = prepare_shards(loaded.runs[0].data, Path(out), opts.layout, shard_tokens, workers=workers)
    for path in paths:
        print(path)
    return 0
