"""The device check: one prepared run that proves the GPU path on a machine available for minutes.

    python benchmarks/device/check.py --out DIR [--device cuda|cuda:N|cpu] [--dry] [--budget-s 500] [--parts ...]
    python benchmarks/device/check.py --plan [--budget-s 500] [--parts ...]   # the plan only, nothing run

`--plan`, run where the wheels are built, exits 2 in one line where `--wheels` holds none (nothing to
carry), and 1 where a part's seconds on the H200 exceed its box.

Before anything starts it checks, in one line each, that what the image lacks can be installed (the
wheels `benchmarks/device/wheels.py` fetched, pip) and records the versions the image has against what
the project needs (`versions.json`). It then installs what is missing or too old (`pip install --no-index
--find-links`, and this working tree, whose entry points register the components), measures how long
that took, and plans the parts in the time left (`PARTS`: each its share, the last the rest), each in a
child process held to its box, so a part that fails or overruns loses nothing the others wrote:

  a  every attention kind and backend on the device against float64 (benchmarks/device/backend_check.py)
  b  `ablate bench` at the `small` scale, sequences 1024, 2048, 4096: tokens/s, peak memory, MFU
  c  the `small` Transformer and Diff in bf16-mixed through `ablate train`, logged to MLflow
  t  the `triton` backend's fused kernel against float64, then timed against split V and the Transformer
     beside the cost model's prediction (benchmarks/device/diff_kernel.py)
  w  the whole `small` model, both arms, eager, on each backend path: `auto`, cuDNN, `triton` (paths.py)
  p  one training step per arm under torch.profiler: its top kernels and their share (profile_step.py)
  m  the memory plan beside the measured peak: the `small` arms trained a few steps under FSDP2's
     fully_shard on one device, torch.cuda.max_memory_allocated beside the plan's (memory_fsdp.py)
  x  w under torch.compile, with the time left (paths.py)
  e  (when named) Diff with `train.compile: true`: compile time apart from training time, tokens/s
  d  (when named) the `cpu-tokens` width's token budgets, sized to land in the box (`runs.d_sizing`),
     through `ablate sweep --no-train` and parallel `ablate worker`s

Each part's results are written as it ends (its CSV from MLflow by a short `collect` inside its box, the
stores copied, `parts.csv` and README.md rewritten), so a lease cut at any moment keeps every part that
ended. `--parts d --out DIR2` runs d alone with the whole budget. `--dry` shrinks every part to a size a
CPU runs in minutes (the test suite runs it with `--device cpu`).

Written as a script of stdlib at its top level, because it starts where jsonargparse, MLflow and
Optuna are not installed yet; each part imports the library in its own child process.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from importlib.metadata import PackageNotFoundError, entry_points, version
from pathlib import Path
from typing import NamedTuple

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
# distribution the check needs -> the requirement in pyproject.toml that bounds it (mlflow-skinny is
# what travels for mlflow); the first group is what the GPU image may lack (wheels.py carries them)
NEEDED = {"jsonargparse": "jsonargparse", "docstring-parser": "docstring-parser", "mlflow-skinny": "mlflow",
          "sqlalchemy": None, "alembic": None, "optuna": "optuna", "lightning": "lightning"}  # fmt: skip
IMAGE = {"torch": "torch", "numpy": "numpy", "pyyaml": "pyyaml", "tokenizers": "tokenizers",
         "pyarrow": "pyarrow", "tqdm": "tqdm"}  # fmt: skip
# The children's environment: no telemetry from MLflow (nothing outside can be reached anyway).
QUIET = {"MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true"}


class Part(NamedTuple):
    """One part of the check: what it does, `runner` ("module:function" in benchmarks/device, called with
    the part's `Context`), its share of the budget in seconds (None: the time left), whether a `collect`
    (MLflow -> CSV) follows it inside its box, what it is expected to get through in that share, and the
    seconds that work is expected to take on an H200 (measured there, or derived from what was: `PARTS`)."""

    what: str
    runner: str
    share_s: float | None
    collects: bool
    expected: str
    expected_s: float | None = None


# The parts, in their default order (`DEFAULT`; e and d run only when named). A new part is one entry (its
# runner a function of a Context); its share comes out of the time left to the last. Seconds measured on an
# H200 (reports/gpu-h200/parts.csv and rerun/parts.csv): a 22-25, b 31, c 95 for 150 + 130 steps (about 22 s
# a variant's start, 0.15 s a Transformer step, 0.22 s a Diff step; c now also measures `auto`'s attention,
# ablate.train.choices.attention: 4 eager candidates of 5 steps, Triton's first compile, about 12 s a
# variant; and the `triton` candidate's first steps choose its launch configurations: 5 candidates for the
# forward and for the single-pass backward per arm, 8 more Triton compiles than before, assumed about 10 s an
# arm, kept in the workspace for every later part: KERNEL_CHOICE_S), e 70 (Diff's cold compile 18.4 s, its
# training graph), t 43. w: three `ablate bench` runs of
# both arms at one length (b's 31 s were three lengths and three rounds): about 15 s each. x: the same under
# torch.compile, two cold compiles of 18.4 s each a path (part e's, the Transformer's assumed alike). m:
# assumed, not yet run on a card: a child's start (Python, torch, the recipe, CUDA and NCCL) about 6 s, its
# first row 4 s (cuBLAS's first products), each other row 2 s (a 100M model built, sharded and stepped 3
# times). Its 16 s came out of the other shares' margins (a 2, b 2, c 2, t 3, w 3, p 1) and 1 s of x's.
KERNEL_CHOICE_S = 10  # an arm's `triton` launch choices in part c, assumed (8 Triton compiles, 10 timings)
PARTS = {
    "a": Part("attention kernels against float64", "backend_check:main", 26, False,
              "88 checks of 2 kinds x 11 backends x 2 dtypes x 2 kv-head counts; 2 x 8 timings", 25),
    "b": Part("`ablate bench`, `small`, seq 1024-4096", "runs:bench", 33, False,
              "2 variants x 3 lengths x 3 rounds of 16,384 tokens", 31),
    "c": Part("`ablate train`, `small`, bf16-mixed", "runs:train", 126, True,
              "2 variants: `auto`'s attention measured (4 eager candidates, the `triton` kernel's launches "
              "chosen), then 60 steps of 32,768 tokens",
              2 * 22 + 60 * (0.15 + 0.22) + 15 + 2 * (12 + KERNEL_CHOICE_S)),
    "t": Part("the fused Triton differential attention (backend `triton`)", "diff_kernel:main", 45, False,
              "8 checks against float64; 4 arms x 4 lengths (1024-8192) x 5 rounds of 16,384 tokens", 43),
    "w": Part("the whole `small` model, eager, on each path", "paths:eager", 47, False,
              "2 arms x 3 backends (`auto`, `sdpa_cudnn`, `triton`) at 2,048 x 2 rounds of 16,384 tokens", 45),
    "p": Part("one profiled training step per arm (`torch.profiler`)", "profile_step:main", 21, False,
              "2 arms: 3 warm-up steps, 1 profiled; the top kernels and their share of the step", 20),
    "m": Part("the memory plan beside the measured peak, FSDP2 on one device", "memory_fsdp:main", 16, False,
              "3 rows (Transformer, Diff, Diff recomputed) x 3 AdamW steps of 16,384 tokens under fully_shard",
              6 + 4 + 2 * 2),
    "x": Part("the whole `small` model under `torch.compile`, on each path", "paths:compiled", None, False,
              "2 arms x 3 backends compiled (6 cold compiles) at 2,048 x 2 rounds of 16,384 tokens", 3 * (15 + 2 * 18.4)),
    "e": Part("`ablate train`, `small`, `train.compile: true`", "runs:compiled", 80, True,
              "Diff: 1 cold compile (train and eval graphs), 40 steps", 70),
    "d": Part("token budgets at the `cpu-tokens` width", "runs:budgets", None, True,
              "sized from its box: runs.d_sizing"),
}  # fmt: skip
DEFAULT = ["a", "b", "c", "t", "w", "p", "m", "x"]
DERIVED = {"c", "w", "p", "m", "x", "d"}  # their H200 seconds derived (above; d: runs.d_sizing), not measured
COLLECT_S = 15  # seconds of a part's box kept for its collect (Python, MLflow, one query per run)
INSTALL_GUESS_S = 30  # the plan's printout only: the real run measures the install first


class Context(NamedTuple):
    """What a part's runner gets."""

    out: Path
    recipe: Path
    workspace: Path
    device: str
    dry: bool
    workers: int
    box_s: float


def plan(budget_s: float, spent_s: float, parts: list[str]) -> dict[str, float]:
    """Each part's box in seconds, given `spent_s` already spent: its share, all shares scaled down
    together where they do not fit, and the time left after them to the part(s) without a share (split
    evenly). The boxes add up to at most `budget_s - spent_s` (none below 0)."""
    left = max(0.0, budget_s - spent_s)
    fixed = sum(PARTS[p].share_s for p in parts if PARTS[p].share_s is not None)
    scale = min(1.0, left / fixed) if fixed else 1.0
    rest = [p for p in parts if PARTS[p].share_s is None]
    spare = max(0.0, left - fixed * scale) / max(1, len(rest))
    return {p: PARTS[p].share_s * scale if PARTS[p].share_s is not None else spare for p in parts}


def print_plan(
    budget_s: float, parts: list[str], workers: int, install_s: float = INSTALL_GUESS_S
) -> list[str]:
    """The plan as a table: each part's box (from a start after `install_s` of install), its expected work
    and the seconds that work took (or is expected to take) on an H200; d's budgets as `runs.d_sizing`
    chooses them for its box. Returns the parts whose H200 seconds exceed their box."""
    sys.path.insert(0, str(HERE))
    from runs import d_sizing  # stdlib at import

    boxes = plan(budget_s, install_s, parts)
    print(f"budget {budget_s:.0f} s; install {install_s:.0f} s assumed (measured first in a real run)\n")
    print("| part | what | box s | H200 s | expected |")
    print("|---|---|---|---|---|")
    print(
        f"| install | missing and too old packages, this working tree | {install_s:.0f} | 15-20 | the wheels carried |"
    )
    over = []
    for p in parts:
        expected, seconds = PARTS[p].expected, PARTS[p].expected_s
        if p == "d":
            sizing = d_sizing(boxes[p] - COLLECT_S, workers)
            expected, seconds = sizing.describe(), sizing.expected_s + COLLECT_S
        if seconds is not None and seconds > boxes[p]:
            over.append(p)
        h200 = "" if seconds is None else ("~" if p in DERIVED else "") + f"{seconds:.0f}"
        print(f"| {p} | {PARTS[p].what} | {boxes[p]:.0f} | {h200} | {expected} |")
    print(f"| total | | {install_s + sum(boxes.values()):.0f} | | |")
    if over:
        print(f"\nover their box at the H200's seconds: {', '.join(over)}")
    return over


def wheels_missing(wheels: Path) -> str | None:
    """The one line that stops a `--plan` (run before a machine is taken) where the wheels folder the
    check installs from was not built, or None."""
    if list(wheels.glob("*.whl")):
        return None
    return (f"--wheels: {wheels} holds no wheels; build it where a package index is reachable with "
            "python benchmarks/device/wheels.py and carry the folder with the working tree")  # fmt: skip


def dist_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def requirements() -> dict[str, str]:
    """pyproject.toml's dependencies: canonical name -> specifier ("torch" -> ">=2.4,<3")."""
    import re
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    found = (re.match(r"\s*([A-Za-z0-9_.-]+)\s*(.*)", d) for d in deps)
    return {m.group(1).lower().replace("_", "-"): m.group(2).split(";")[0].strip() for m in found if m}


def satisfies(installed: str | None, spec: str) -> bool | None:
    """Whether `installed` meets `spec` (None: packaging, which decides, is not importable)."""
    if installed is None:
        return False
    try:
        from packaging.specifiers import SpecifierSet
    except ImportError:
        return None
    return SpecifierSet(spec).contains(installed, prereleases=True)


def versions() -> list[dict]:
    """What the image has of each distribution the check needs, against pyproject's bounds."""
    reqs = requirements()
    rows = [{"dist": "python", "installed": sys.version.split()[0], "required": "", "ok": True}]
    for dist, req in {**IMAGE, **NEEDED}.items():
        spec = reqs.get(req, "") if req else ""
        have = dist_version(dist)
        rows.append({"dist": dist, "installed": have, "required": spec,
                     "ok": satisfies(have, spec) if spec else have is not None})  # fmt: skip
    return rows


def precheck(args: argparse.Namespace, found: list[dict]) -> str | None:
    """The one line that stops the check before anything starts, or None: what the image lacks (or has too
    old) must be installable from `--wheels` with pip; the image's own packages must meet the bounds."""
    bad_image = [r for r in found if r["dist"] in IMAGE and r["ok"] is False]
    if bad_image:
        return "image: " + ", ".join(f"{r['dist']} {r['installed'] or 'missing'} (needs {r['required'] or 'any'})"
                                     for r in bad_image) + "; these are the image's own, not carried"  # fmt: skip
    todo = [r["dist"] for r in found if r["dist"] in NEEDED and r["ok"] is not True]
    if not todo:
        return None
    if not list(args.wheels.glob("*.whl")):
        return (f"--wheels: {args.wheels} holds no wheels and the image lacks (or has too old) {', '.join(todo)}; "
                "run python benchmarks/device/wheels.py where a package index is reachable and carry the folder")  # fmt: skip
    if importlib.util.find_spec("pip") is None and importlib.util.find_spec("ensurepip") is None:
        return f"pip: neither pip nor ensurepip in {sys.executable}; {', '.join(todo)} cannot be installed"
    return None


def install(out: Path, wheels: Path, found: list[dict]) -> tuple[bool, str]:
    """Install what is missing or outside its bounds from `wheels` (pip first from ensurepip where the image
    has none), then this working tree where its components are not registered; returns (all done, note)."""
    reqs = requirements()
    todo = [f"{d}{reqs.get(NEEDED[d], '') if NEEDED[d] else ''}" for d in NEEDED
            if any(r["dist"] == d and r["ok"] is not True for r in found)]  # fmt: skip
    steps = []
    with (out / "logs" / "install.log").open("a") as log:

        def run(*command: str) -> bool:
            return subprocess.run(command, stdout=log, stderr=subprocess.STDOUT).returncode == 0

        def pip(*args: str) -> bool:
            command = [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--no-index",
                "--find-links",
                str(wheels),
                *args,
            ]
            # a system Python (PEP 668) or a read-only one: the user's site-packages instead
            return run(*command) or run(*command, "--user", "--break-system-packages")

        if todo and importlib.util.find_spec("pip") is None:
            steps.append((run(sys.executable, "-m", "ensurepip", "--user"), "pip (ensurepip)"))
        if todo:
            steps.append((pip(*todo), ", ".join(todo)))
        if not entry_points(group="ablate.components"):
            tools = importlib.util.find_spec("setuptools") is not None or pip("setuptools")
            tree = tools and pip("--no-deps", "--no-build-isolation", "-e", str(ROOT))
            steps.append((tree, "this working tree (editable)"))
    importlib.invalidate_caches()
    note = "; ".join(("installed " if ok else "FAILED to install ") + what for ok, what in steps)
    return all(ok for ok, _ in steps), note or "nothing to install"


def run_part(part: str, argv: list[str], limit_s: float, out: Path) -> dict:
    """Run one part in its own process group; killed (the whole group) at `limit_s`."""
    start = time.monotonic()
    with (out / "logs" / f"part_{part}.log").open("a") as f:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=max(1.0, limit_s))
            status = "ok" if code == 0 else f"failed (exit {code})"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            status = f"stopped at its time box ({limit_s:.0f} s)"
    return {
        "part": part,
        "status": status,
        "seconds": round(time.monotonic() - start, 1),
        "limit_s": round(limit_s),
    }


def record(out: Path, row: dict) -> None:
    """Append one row to parts.csv (kept across runs into the same folder)."""
    sys.path.insert(0, str(HERE))
    from csv_rows import append_rows  # stdlib at import

    append_rows(out / "parts.csv", [row], ["part", "status", "seconds", "limit_s", "note"])


def keep_stores(out: Path, workspace: Path) -> None:
    """Copy MLflow's and Optuna's stores into `out/stores` (after every part: a lease cut keeps them), and
    the `triton` kernels' launch configurations chosen so far, with the timings they were chosen by."""
    stores = out / "stores"
    stores.mkdir(exist_ok=True)
    for store in [
        *workspace.glob("*.db"),
        *workspace.glob("*.journal"),
        *kernel_cache(workspace).glob("*.json"),
    ]:
        shutil.copy2(store, stores / store.name)


def kernel_cache(workspace: Path) -> Path:
    """The one folder every part's process keeps the kernels' launch choices in (ABLATE_KERNEL_CACHE, the
    workspace's own, where `ablate train` keeps them), so a card and shape are timed once in the check.
    `Workspace.kernel_configs` names it too; this parent runs before the install, so it imports no ablate
    (tests/e2e/test_device_check.py holds the two to one folder)."""
    return workspace / "cache" / "kernels"


def visible(device: str) -> str:
    """`cuda:N` made the only card the parts see (CUDA_VISIBLE_DEVICES, inherited by every child, part d's
    workers and Lightning's `devices: 1` included), so each part runs on `cuda`; other devices unchanged."""
    kind, _, index = device.partition(":")
    if kind != "cuda" or not index:
        return device
    seen = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    os.environ["CUDA_VISIBLE_DEVICES"] = seen[int(index)] if seen else index
    return "cuda"


def _parser() -> argparse.ArgumentParser:
    """The check's options (the hidden ones are a child process's: one part, its time box)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="folder for every result")
    parser.add_argument("--plan", action="store_true", help="print the plan of the run and stop")
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    parser.add_argument("--dry", action="store_true", help="tiny sizes (a CPU runs it in about a minute)")
    parser.add_argument("--budget-s", type=float, default=500.0, help="seconds for everything")
    parser.add_argument("--wheels", type=Path, default=HERE / "wheels")
    parser.add_argument(
        "--workspace", type=Path, default=None, help="stores and checkpoints (default: a temporary folder)"
    )
    parser.add_argument("--workers", type=int, default=3, help="part d's parallel workers")
    parser.add_argument(
        "--parts",
        nargs="+",
        default=DEFAULT,
        choices=list(PARTS),
        help="which, in order (e, d: only when named)",
    )
    parser.add_argument("--part", help=argparse.SUPPRESS)  # a child: run this one part
    parser.add_argument("--box-s", type=float, default=0.0, help=argparse.SUPPRESS)  # a child's box
    parser.add_argument("--of", help=argparse.SUPPRESS)  # a collect child: the part collected
    return parser


def main() -> None:
    parser = _parser()
    args = parser.parse_args()
    if args.plan:
        over = print_plan(args.budget_s, args.parts, args.workers)
        missing = wheels_missing(args.wheels)
        if missing:
            print(missing, file=sys.stderr)
        raise SystemExit(2 if missing else 1 if over else 0)
    if args.out is None:
        parser.error("--out is required (or --plan)")
    out = args.out.resolve()
    workspace = (args.workspace or Path(tempfile.mkdtemp(prefix="ablate-device-"))).resolve()
    if args.part:
        return child(args.part, out, workspace, args)
    started = time.monotonic()
    os.environ.update(QUIET | {"ABLATE_KERNEL_CACHE": str(kernel_cache(workspace))})
    device = visible(args.device)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    from csv_rows import replace_text  # benchmarks/device/csv_rows.py: stdlib only
    from summary import write_readme  # benchmarks/device/summary.py: stdlib only

    found = versions()
    replace_text(out / "versions.json", json.dumps({"before_install": found}, indent=1))
    stop = precheck(args, found)
    if stop:
        print(stop, file=sys.stderr)
        raise SystemExit(2)
    ok, note = install(out, args.wheels, found)
    after = versions()
    replace_text(
        out / "versions.json", json.dumps({"before_install": found, "after_install": after}, indent=1)
    )
    short = [
        f"{r['dist']} {r['installed'] or 'missing'} (needs {r['required']})"
        for r in after
        if r["ok"] is False
    ]
    seconds = round(time.monotonic() - started, 1)
    row = {"part": "install", "status": "ok" if ok and not short else "failed (logs/install.log)",
           "seconds": seconds, "limit_s": "", "note": note + ("; still outside bounds: " + ", ".join(short) if short else "")}  # fmt: skip
    record(out, row)
    write_readme(out, args, sys.argv)
    if short:
        print("install: " + row["note"], file=sys.stderr)
        raise SystemExit(2)
    base = [sys.executable, str(Path(__file__).resolve()), "--out", str(out), "--device", device,
            "--workspace", str(workspace), "--workers", str(args.workers)] + (["--dry"] if args.dry else [])  # fmt: skip
    for i, part in enumerate(args.parts):
        spent = time.monotonic() - started
        box = plan(args.budget_s, spent, args.parts[i:])[part]
        if args.dry:  # only the whole budget as a hang guard: a loaded CPU may take any part's share
            box = max(1.0, args.budget_s - spent)
        collect = COLLECT_S if PARTS[part].collects and not args.dry else 0
        if box - collect < 1:
            record(
                out, {"part": part, "status": "skipped (no time left)", "seconds": 0, "limit_s": round(box)}
            )
            continue
        box_s = str(round(box - collect, 1))
        row = run_part(part, [*base, "--part", part, "--box-s", box_s], box - collect, out)
        if PARTS[part].collects:
            guard = max(1.0, args.budget_s - (time.monotonic() - started))  # a dry run's hang guard
            limit = guard if args.dry else collect
            done = run_part("collect", [*base, "--part", "collect", "--of", part], limit, out)
            if done["status"] != "ok":
                row["note"] = f"collect {done['status']}"
            row["seconds"] = round(row["seconds"] + done["seconds"], 1)
        keep_stores(out, workspace)
        record(out, row)
        write_readme(out, args, sys.argv)
    print((out / "parts.csv").read_text())
    print(f"results: {out}/README.md")


def child(part: str, out: Path, workspace: Path, args: argparse.Namespace) -> None:
    sys.path.insert(0, str(HERE))
    import runs

    recipe = out / "recipe.yaml"
    if not recipe.exists():
        corpus = runs.write_corpus(workspace / "corpus") if args.dry else None
        runs.write_recipe(recipe, dry=args.dry, device=args.device, corpus=corpus)
    if part == "collect":
        return runs.collect(out, workspace, args.of)
    ctx = Context(out, recipe, workspace, args.device, args.dry, args.workers, args.box_s)
    module, function = PARTS[part].runner.split(":")
    getattr(importlib.import_module(module), function)(ctx)


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    main()
