"""Fetch, on a machine with a package index, the wheels the GPU image lacks, so the device check
(benchmarks/device/check.py) installs them there offline (`pip install --no-index --find-links`).

The GPU image has Python 3.12, torch + CUDA, lightning, triton, numpy, pyarrow, tokenizers and tiktoken;
it lacks the CLI's, the tracking store's and the sweeps' packages (CARRIED), and its lightning may be
older than the project's bound. Only torch's own pins and compiled packages are trusted to it (PRESENT). Their dependencies are resolved here for CPython 3.12 on manylinux x86_64 (`pip install
--dry-run --report`), those the image already has are dropped, and the rest is downloaded without
dependencies into `--out` (default benchmarks/device/wheels/, ignored by git: the working tree carries
it). Prints each wheel with its size and why it travels, and the total against the limit.

    python benchmarks/device/wheels.py [--out benchmarks/device/wheels] [--limit-mib 60]

Measured for mlflow 3.17.2 (CPython 3.12, manylinux x86_64), before lightning and the pure-Python
dependencies travelled: 41 wheels, 21.2 MiB (lightning's are about 2 MiB more; not measured again). Not
carried: the full `mlflow` (its wheel alone 12.0 MiB, the UI's JavaScript, and it requires scipy, 35.7 MiB,
matplotlib, 9.9 MiB, pandas and scikit-learn: over the 64 MiB a working tree may carry; `mlflow-skinny`
plus SQLAlchemy and Alembic keep the SQLite tracking store, which is all `ablate train` and `ablate sweep`
write; the UI runs where the store is copied back), scipy and matplotlib (only
reports and fits need them: the device check records results as CSV and leaves reports to a machine
that has them), zstandard (read only for .zst corpora; the check trains on the built-in stand-in).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PLATFORM = [
    "--only-binary=:all:",
    "--python-version",
    "3.12",
    "--implementation",
    "cp",
    "--platform",
    "manylinux2014_x86_64",
    "--platform",
    "manylinux_2_17_x86_64",
    "--platform",
    "manylinux_2_28_x86_64",
]
# What travels, and why (the top-level requirements; their dependencies are resolved).
CARRIED = {
    "jsonargparse": "the `ablate` command line and the recipes' types",
    "docstring-parser": "the command line's one-line helps (jsonargparse reads them)",
    "mlflow-skinny": "MLflow's tracking client: every run logs its metrics there",
    "sqlalchemy": "MLflow's SQLite tracking store (the full mlflow's dependency, not the skinny one's)",
    "alembic": "MLflow's SQLite tracking store: its schema migrations",
    "optuna": "`ablate sweep` and `ablate worker`: the study (part d)",
    "setuptools": "to install this working tree (its entry points register the components)",
    "lightning>=2.6": "used only where the image's is older than pyproject's bound (Trainer.fit's weights_only)",
}
# Left out, trusted to the GPU image: torch and what torch itself pins, and the compiled packages the
# image names. Small pure-Python dependencies travel even where the image may have them: their versions
# there are unknown (typing-extensions too old for pydantic), and pip installs one only where it must.
PRESENT = {
    "torch", "triton", "numpy", "pyarrow", "tokenizers", "tiktoken", "hf-xet", "pyyaml", "regex",
    "charset-normalizer", "markupsafe", "aiohttp", "frozenlist", "multidict", "propcache", "yarl",
    "sympy", "mpmath", "networkx", "jinja2", "filelock", "fsspec",
}  # fmt: skip
# torch's CUDA libraries (nvidia-cudnn-cu12 and the rest, near 2 GiB): the image has its own, matched to its
# torch and driver; a resolver that picks a torch for the platform pins these beside it.
PRESENT_PREFIXES = ("nvidia-", "cuda-")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def resolve(pip: list[str]) -> list[dict]:
    """The distributions `pip install CARRIED` would install on the GPU image's platform."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        subprocess.run(
            [*pip, "install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report),
             "--target", str(Path(tmp) / "target"), *PLATFORM, *CARRIED],
            check=True,
        )  # fmt: skip
        return json.loads(report.read_text())["install"]


def in_image(name: str) -> bool:
    """Whether the GPU image is trusted to have this distribution (PRESENT, PRESENT_PREFIXES)."""
    name = canonical(name)
    return name in PRESENT or name.startswith(PRESENT_PREFIXES)


def required_by(items: list[dict]) -> dict[str, list[str]]:
    """For each distribution, the resolved distributions that require it (from their metadata)."""
    names = {canonical(i["metadata"]["name"]) for i in items}
    users: dict[str, list[str]] = {}
    for item in items:
        for spec in item["metadata"].get("requires_dist", []):
            if "extra ==" in spec:
                continue
            dep = canonical(re.split(r"[\s;<>=!~\[(]", spec, maxsplit=1)[0])
            if dep in names:
                users.setdefault(dep, []).append(canonical(item["metadata"]["name"]))
    return users


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=HERE / "wheels")
    parser.add_argument("--limit-mib", type=float, default=60.0, help="what the wheels may take")
    args = parser.parse_args()
    pip = [sys.executable, "-m", "pip"]
    items = resolve(pip)
    users = required_by(items)
    carried = [i for i in items if not in_image(i["metadata"]["name"])]
    args.out.mkdir(parents=True, exist_ok=True)
    for old in args.out.glob("*.whl"):
        old.unlink()
    specs = [f"{i['metadata']['name']}=={i['metadata']['version']}" for i in carried]
    subprocess.run(
        [*pip, "download", "--no-deps", "--quiet", "--dest", str(args.out), *PLATFORM, *specs], check=True
    )
    total = 0
    reasons = {canonical(re.split(r"[<>=!~]", k)[0]): why for k, why in CARRIED.items()}
    print(f"{'wheel':<72} {'MiB':>6}  why")
    for wheel in sorted(args.out.glob("*.whl")):
        name = canonical(wheel.name.split("-")[0])
        size = wheel.stat().st_size
        total += size
        why = reasons.get(name) or "needed by " + ", ".join(sorted(set(users.get(name, ["?"]))))
        print(f"{wheel.name:<72} {size / 2**20:6.2f}  {why}")
    skipped = sorted({canonical(i["metadata"]["name"]) for i in items if in_image(i["metadata"]["name"])})
    print(f"left out, already in the GPU image: {', '.join(skipped)}")
    print(f"total: {len(specs)} wheels, {total / 2**20:.1f} MiB in {args.out} (limit {args.limit_mib:g} MiB)")
    if total > args.limit_mib * 2**20:
        sys.exit(f"--limit-mib: the wheels take {total / 2**20:.1f} MiB, over {args.limit_mib:g}")


if __name__ == "__main__":
    main()
