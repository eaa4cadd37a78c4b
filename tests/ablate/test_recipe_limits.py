"""A recipe someone else wrote cannot take the machine down: hostile files are one line, exit 2, fast.

The hostile cases tried (each in `HOSTILE`):
- an alias bomb (nine levels of nine aliases, 9^9 values from ~1 KB) in a free-form field (`paper_reference`,
  `variants.*.paper`) and in a typed one (`seeds`);
- a recursive alias (`&a [*a]`);
- nesting deeper than MAX_DEPTH (ours) and far deeper than libyaml's own limit;
- many keys (30K, over MAX_FILE_BYTES) and a huge scalar (a 5 MB string): refused by size, unparsed;
- a binary file named .yaml.

All run in one child process after the heavy imports (torch), which reports each case's exit code, wall
time and how far the process's peak resident memory rose (`resource.ru_maxrss`).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ablate.core.config import MAX_DEPTH, MAX_FILE_BYTES, load_yaml

VALID = textwrap.dedent(
    """\
    name: hostile
    base:
      model: {vocab_size: 260, d_model: 32, n_layers: 1, head_dim: 8}
      train: {seq_len: 16, batch_tokens: 64, micro_batch_size: 4, steps: 1, lr: 1.0e-3}
      data: {source: stdlib}
    variants:
      transformer: {label: Transformer}
    """
)


def bomb(anchor: str = "l") -> str:
    """Nine levels of nine aliases, as a flow value ending in `*{anchor}8`, with its anchors before it."""
    lines = [f"  a0: &{anchor}0 [x, x, x, x, x, x, x, x, x]"]
    for level in range(1, 9):
        refs = ", ".join([f"*{anchor}{level - 1}"] * 9)
        lines.append(f"  a{level}: &{anchor}{level} [{refs}]")
    return "\n".join(lines)


HOSTILE: dict[str, tuple[str | bytes, str]] = {
    "alias bomb in a free-form field": (VALID + "paper_reference:\n" + bomb(), "too large: more than"),
    "alias bomb in a variant's paper": (
        VALID.replace(
            "transformer: {label: Transformer}", "transformer: {label: Transformer, paper: {bomb: *l8}}"
        ).replace("name: hostile", "name: hostile\nanchors:\n" + bomb()),
        "too large: more than",
    ),
    "alias bomb in a typed field": (VALID + "scratch:\n" + bomb() + "\nseeds: *l8\n", "too large: more than"),
    "recursive alias": (VALID + "paper_reference: &r [*r]\n", "refers to itself"),
    "nested past our depth": (
        VALID + "paper_reference: " + "[" * (MAX_DEPTH + 40) + "]" * (MAX_DEPTH + 40),
        "nested more than",
    ),
    "nested past libyaml's depth": (VALID + "paper_reference: " + "[" * 20000 + "]" * 20000, "invalid YAML"),
    "many keys": (
        VALID + "paper_reference:\n" + "".join(f"  k{i}: {i}\n" for i in range(30000)),
        "bytes; a recipe file is at most",
    ),
    "a huge scalar": (VALID + "description: " + "x" * (5 << 20) + "\n", "bytes; a recipe file is at most"),
    "a binary file named .yaml": (bytes(random.Random(0).randrange(256) for _ in range(4096)), "not UTF-8"),
}

CHILD = r"""
import json, resource, sys, time
import ablate.recipe.loading, ablate.recipe.check, ablate.model.cost  # the heavy imports, before measuring
from ablate.cli import main
results = {}
for name, path in json.loads(sys.argv[1]).items():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.process_time()  # CPU seconds: what a hostile file costs, not how busy the machine is
    code = main(["check", path])
    seconds = time.process_time() - start
    rise = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    results[name] = {"code": code, "cpu_seconds": seconds, "peak_rise_mb": rise}
    print("@@" + name, file=sys.stderr, flush=True)
print(json.dumps(results))
"""


def test_hostile_recipes_are_one_line_exit_2_under_a_cpu_second_and_200_mb(tmp_path):
    paths = {}
    for i, (name, (content, _)) in enumerate(HOSTILE.items()):
        path = tmp_path / f"hostile{i}.yaml"
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        paths[name] = str(path)
    assert (
        Path(paths["a huge scalar"]).stat().st_size > MAX_FILE_BYTES < Path(paths["many keys"]).stat().st_size
    )
    done = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(paths)], capture_output=True, text=True, timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    errors: dict[str, list[str]] = {}
    lines: list[str] = []
    for line in done.stderr.splitlines():  # each case's stderr, then its `@@name` marker
        if line.startswith("@@"):
            errors[line[2:]], lines = lines, []
        else:
            lines.append(line)
    for name, (_, fragment) in HOSTILE.items():
        result, err = results[name], errors[name]
        assert result["code"] == 2, (name, err)
        assert len(err) == 1 and err[0].startswith("ablate: error: recipe: "), (name, err)
        assert fragment in err[0] and paths[name] in err[0], (name, err)
        assert result["cpu_seconds"] < 1.0, (name, result)
        assert result["peak_rise_mb"] < 200, (name, result)


def test_an_ordinary_recipe_still_loads_with_its_aliases():
    text = "base: &b {lr: 1.0e-3, steps: 10}\nother: *b\nfloats: [1e-3, .5, 2.]\n"
    assert load_yaml(text) == {
        "base": {"lr": 0.001, "steps": 10},
        "other": {"lr": 0.001, "steps": 10},
        "floats": [0.001, 0.5, 2.0],
    }


@pytest.mark.parametrize("recipe", sorted((Path(__file__).parents[2] / "recipes").glob("*.yaml")))
def test_every_shipped_recipe_is_far_inside_the_bounds(recipe):
    assert recipe.stat().st_size < MAX_FILE_BYTES / 10  # a tenth: table6.yaml, the largest, is 17 KB
    assert load_yaml(recipe.read_text())
