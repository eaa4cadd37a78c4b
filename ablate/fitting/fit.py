"""`fit_points`: one fit per architecture plus equal-loss ratios against a reference architecture."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ablate.core.errors import UserError

from .core import ArchFit, fit_arch
from .forms import FORMS, Form
from .points import Point, as_points
from .ratios import Ratio, equal_loss_ratios

DEFAULT_REFERENCE = "transformer"


@dataclass
class FitReport:
    form: Form
    archs: dict[str, ArchFit]  # in order of first appearance in the points
    ratios: list[Ratio]
    reference: str | None
    n_boot: int
    seed: int
    level: float
    notes: list[str] = field(default_factory=list)  # report-wide; fit.md's Notes and fit.json's "notes"
    extra: dict = field(default_factory=dict)  # more top-level keys of fit.json (e.g. the runs it rests on)


def get_form(name: str | Form) -> Form:
    if isinstance(name, Form):
        return name
    if name not in FORMS:
        raise UserError(f"fit: --form '{name}' is not known; allowed: {', '.join(FORMS)}")
    return FORMS[name]


def fit_points(
    points: Iterable[Point | Mapping],
    form: str | Form,
    n_boot: int = 1000,
    seed: int = 0,
    *,
    level: float = 0.95,
    reference: str | None = None,
    ratios: bool | None = None,
    n_jobs: int = 1,
    paired: bool = False,
) -> FitReport:
    """Fit `form` per architecture, bootstrap over runs, and compute equal-loss ratios.

    `ratios=None` computes them whenever there are >= 2 archs; `ratios=True` (or a `reference`) with a
    single arch is a UserError. The reference is `reference`, else "transformer" if present, else the
    first arch in the points. `n_jobs > 1` refits the resamples in that many processes (same result).
    `paired=True`: each point's `run_id` is its seed, and every arch resamples the same seeds in each draw
    (a size x budget grid: ablate.fitting.core), so the ratios' intervals are paired over seeds.
    """
    form = get_form(form)
    pts = as_points(points)
    if not pts:
        raise UserError("fit: no points to fit")
    if n_boot < 0:
        raise UserError(f"fit: n_boot = {n_boot} must be >= 0")
    by_arch: dict[str, list[Point]] = {}
    for p in pts:
        by_arch.setdefault(p.arch, []).append(p)
    want_ratios = ratios if ratios is not None else (len(by_arch) >= 2 or reference is not None)
    if want_ratios and len(by_arch) < 2:
        only = next(iter(by_arch))
        raise UserError(
            f"fit: an equal-loss ratio needs two architectures, the points have only '{only}'; "
            "give each point an arch (e.g. transformer and diff)"
        )
    if reference is not None and reference not in by_arch:
        raise UserError(
            f"fit: reference arch '{reference}' is not in the points; archs: {', '.join(by_arch)}"
        )
    if want_ratios and reference is None:
        reference = DEFAULT_REFERENCE if DEFAULT_REFERENCE in by_arch else next(iter(by_arch))

    if paired:
        units = {a: sorted({p.run_id for p in ps}) for a, ps in by_arch.items()}
        first = next(iter(units.values()))
        if any(u != first for u in units.values()):
            raise UserError(
                "fit: a paired bootstrap needs the same seeds in every arch; seeds per arch: "
                + "; ".join(f"{a}: {', '.join(u)}" for a, u in units.items())
            )
    fits = {
        a: fit_arch(form, a, ps, n_boot=n_boot, seed=seed, level=level, n_jobs=n_jobs, paired=paired)
        for a, ps in by_arch.items()
    }
    out_ratios: list[Ratio] = []
    if want_ratios:
        for arch, f in fits.items():
            if arch == reference:
                continue
            for quantity in form.variables:
                out_ratios += equal_loss_ratios(fits[reference], f, quantity)
    return FitReport(
        form=form,
        archs=fits,
        ratios=out_ratios,
        reference=reference if want_ratios else None,
        n_boot=n_boot,
        seed=seed,
        level=level,
    )
