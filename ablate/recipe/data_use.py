"""What a recipe's runs read of their corpus: the training split's tokens and each run's passes over it.

`ablate check` and the plan `ablate sweep` prints state it (one line per data source), and the plan asks
before training past one pass unless the recipe says `data.repeat: allow` (`--yes` does not answer it: a
study that repeats its corpus is a different experiment, not a longer one; `ablate.data.passes`). Finding
the split's size tokenizes the corpus once into the workspace's cache, which the first run would do anyway.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from ablate.core.errors import UserError
from ablate.core.tables import si
from ablate.core.workspace import Workspace
from ablate.data import passes as data_passes
from ablate.recipe.schema import RunSpec


@dataclass(frozen=True)
class DataUse:
    """One data source of a recipe (runs sharing a `data:` section) and what its runs read of it."""

    source: str
    tokenizer: str
    split_tokens: int | None  # None: a task, which generates fresh samples (no passes), or not counted
    val_tokens: int | None
    run_tokens: tuple[int, ...]  # every run's (and every smaller budget's) training tokens, sorted
    allowed: bool  # data.repeat: allow
    not_counted: str = ""  # why the corpus could not be read here (ablate check goes on without it)
    sampling: str = "permutation"  # data.sampling: how the runs draw their windows (the share read twice)
    note: str = ""  # what a run must download and build first (a built-in corpus not built here yet)

    @property
    def passes(self) -> list[float]:
        return [data_passes.passes(t, self.split_tokens or 0) for t in self.run_tokens]

    @property
    def max_passes(self) -> float:
        return max(self.passes, default=0.0)

    @property
    def repeats(self) -> bool:
        return self.split_tokens is not None and data_passes.repeats(self.max_passes)

    def line(self) -> str:
        return self._line() + (f"; {self.note}" if self.note else "")

    def _line(self) -> str:
        if self.not_counted:
            return f"data: {self.source}: passes not counted ({self.not_counted})"
        if self.split_tokens is None:
            return f"data: {self.source} (a task): fresh samples every step, no passes over a split"
        budgets = ", ".join(
            f"{si(t)} ({data_passes.format_passes(p)}, "
            f"{data_passes.format_share(data_passes.read_twice(p, self.sampling))})"
            for t, p in zip(self.run_tokens, self.passes)
        )
        usage = data_passes.usage_line(self.split_tokens, self.passes, [self.sampling] * len(self.passes))
        return (
            f"data: {self.source} under {self.tokenizer}: {usage}; {si(self.val_tokens or 0)} validation "
            f"tokens; tokens per run (passes, share read twice): {budgets}"
        )

    def refusal(self) -> str:
        """The one line that refuses training past one pass without `data.repeat: allow`."""
        longest = self.run_tokens[-1]
        return (
            f"data.repeat: runs of up to {si(longest)} tokens make {data_passes.format_passes(self.max_passes)} "
            f"passes over the {si(self.split_tokens or 0)} training tokens of {self.source}, reading text "
            "again; set data.repeat: allow to train past one pass, or use a "
            "larger data.source or smaller budgets"
        )


def data_uses(runs: list[RunSpec], workspace: Workspace, *, strict: bool = True) -> list[DataUse]:
    """One `DataUse` per distinct `data:` section of `runs` (tokenizing each corpus into the cache).
    `strict=False` (ablate check): a corpus that cannot be read here is a `not_counted` line, not an error."""
    from ablate.data import load_tokens
    from ablate.data.task_batches import task_spec

    groups: dict[str, list[RunSpec]] = {}
    for run in runs:
        key = repr(sorted((k, repr(v)) for k, v in run.config["data"].items() if k != "repeat"))
        groups.setdefault(key, []).append(run)
    uses = []
    for members in groups.values():
        first = members[0]
        tokens = sorted(
            {r.at_budget(s).train.tokens for r in members for s in (r.budgets or (r.train.steps,))}
        )
        if task_spec(first.data) is not None:
            uses.append(DataUse(str(first.data.task), "", None, None, tuple(tokens), True))
            continue
        if not strict and (pending := _pending(first, tuple(tokens), members)) is not None:
            uses.append(pending)  # ablate check: counted from the manifest, nothing downloaded or built
            continue
        try:
            data = load_tokens(first.data, workspace)
        except UserError as e:
            if strict:
                raise
            uses.append(DataUse(first.data.source or "stdlib", "", None, None, tuple(tokens), True, str(e)))
            continue
        uses.append(
            DataUse(
                source=first.data.source or "stdlib",
                tokenizer=data.tokenizer,
                split_tokens=int(len(data.train)),
                val_tokens=int(len(data.val)),
                run_tokens=tuple(tokens),
                allowed=all(r.data.repeat == "allow" for r in members),
                sampling=first.data.sampling,
            )
        )
    return uses


def confirm_passes(uses: list[DataUse]) -> None:
    """Ask before training past one pass (a terminal), or refuse in one line (no terminal), unless every
    such source says `data.repeat: allow`. `--yes` does not answer this question."""
    for use in uses:
        if not use.repeats or use.allowed:
            continue
        if not sys.stdin or not sys.stdin.isatty():
            raise UserError(use.refusal())
        answer = input(
            f"Runs make up to {data_passes.format_passes(use.max_passes)} passes over {use.source}'s training "
            "split (text read again). Train past one pass? [y/N] "
        )
        if answer.strip().lower() not in ("y", "yes"):
            raise UserError("data.repeat: not confirmed; nothing was started (data.repeat: allow skips this)")


def _pending(first: RunSpec, tokens: tuple[int, ...], members: list[RunSpec]) -> DataUse | None:
    """The DataUse of a built-in corpus not built here yet, from the counts its earlier builds measured
    (ablate.data.builtin_corpus.pending_build), saying what a run downloads first; None once it is built."""
    from ablate.data.builtin_corpus import pending_build
    from ablate.data.tokenizers import parse_tokenizer_spec, tokenizer_label

    pending = pending_build(first.data.source or "")
    if pending is None:
        return None
    label = tokenizer_label(parse_tokenizer_spec(first.data.tokenizer or "byte"))
    counts = pending.tokens.get(label)
    source, allowed = first.data.source, all(r.data.repeat == "allow" for r in members)
    if counts is None or counts.get("val_fraction") != first.data.val_fraction:
        why = f"no measured count under {label} at val_fraction {first.data.val_fraction:g}"
        return DataUse(source, label, None, None, tokens, allowed, why, note=pending.line())
    return DataUse(
        source, label, counts["train"], counts["val"], tokens, allowed, sampling=first.data.sampling,
        note=pending.line() + " (token counts from earlier builds of the same manifest)",
    )  # fmt: skip
