"""The import contract: the folders of `ablate/` are its layers, dependencies point down, and nothing circles.

Every `import` in the engine (module level or inside a function: a lazy import is still a dependency) is
read with `ast`; `from pkg import name` counts as importing the module `pkg.name` where that is a module.
Five rules:
- a sub-package imports its own modules or those of a sub-package below it, never one above (`LAYERS`);
- but a layer's typed recipe section sits beside its owner, in `ablate/<layer>/config.py`, and any layer
  may import it (the recipe resolves every section): such a config module imports only `ablate.core`;
- some layers never import some below them either (`NEVER`): the sweep hands its workers an after-trial
  callback and its verb writes the report, so the sweep library knows neither probes nor reports; probes
  are measurements, reports read them; training names no component (it builds what the registry holds);
- no import circle anywhere, between modules of one sub-package either;
- a component (`components/`) imports from the engine only `ablate.core.registry`, `.contract`, `.errors`,
  and `.json_cache` (the one measured-once cache, which the `triton` kernels' launch choices share with
  the engine's caches: standard library only, it drags nothing of the engine into the zoo).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# The folders of ablate/, top to bottom: the way a recipe's data flows, read upwards. (README: "Where
# things live" says what each holds.) A sub-package imports its own layer or lower ones.
LAYERS: list[str] = [
    "cli",  # argv -> a verb
    "verbs",  # one module per verb: its options and its orchestration
    "hf",  # a run as a transformers folder (export); the harness's model and downstream tasks
    "sweep",  # many trials: the queue and liveness, the worker loop, the launchers
    "probes",  # kind `probe` and running them on finished runs (`ablate eval`)
    "report",  # tables, checks, statistics, plots of finished runs; fit reports
    "fitting",  # scaling-law and loss-curve fits (numbers in, numbers out)
    "bench",  # `ablate bench`: throughput, memory, MFU of each variant's run's own step
    "train",  # one run: its steps, budgets, resume, the choices it trains on, its optimizer
    "store",  # MLflow (tracking, server) and the Optuna study's location
    "recipe",  # YAML -> typed runs: resolve, match, search, check
    "analysis",  # attention analyses of trained models on tasks
    "model",  # the decoder from registered components; its parameters and FLOPs (cost); interop
    "data",  # corpora, tokenizers, shards, batches; tasks
    "hardware",  # device seam, precision, allocator
    "core",  # errors, typed config, registry, contract, table text
]
COMPONENTS_MAY_IMPORT = {
    "ablate.core.registry",
    "ablate.core.contract",
    "ablate.core.errors",
    "ablate.core.json_cache",
}
# (layer, what it never imports although it lies below): a layer of LAYERS, or "components" (the zoo)
NEVER = {("sweep", "report"), ("sweep", "probes"), ("probes", "report"), ("train", "components")}


def module_name(path: Path, root: Path = ROOT) -> tuple[str, str]:
    """(module, its package) for a file under `root`."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    package = ".".join(parts[:-1])
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts), package


def layer_of(module: str) -> int:
    """'ablate.data.tokens' -> the index of 'data' in LAYERS ('ablate.cli' -> 'cli')."""
    top = module.split(".")[1] if module.count(".") else ""
    if top not in LAYERS:
        raise AssertionError(
            f"{module}: in no layer of tests/ablate/test_layers.py; add its folder to LAYERS"
        )
    return LAYERS.index(top)


def imports_of(path: Path, package: str, modules: set[str]) -> list[tuple[int, str]]:
    """(line, imported engine module) for every import in the file, relative imports resolved."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.append((node.lineno, module))
            found += [
                (node.lineno, f"{module}.{a.name}") for a in node.names if f"{module}.{a.name}" in modules
            ]
    return [(line, name) for line, name in found if name == "ablate" or name.startswith("ablate.")]


def graph(root: Path = ROOT) -> dict[str, dict[str, int]]:
    """{module: {imported engine module: line}} over ablate/ (`ablate.x.y.Name` trimmed to its module)."""
    files = {module_name(p, root): p for p in sorted((root / "ablate").rglob("*.py"))}
    modules = {m for m, _ in files}
    edges: dict[str, dict[str, int]] = {}
    for (module, package), path in files.items():
        edges[module] = {}
        for line, imported in imports_of(path, package, modules):
            while imported not in modules and "." in imported:
                imported = imported.rsplit(".", 1)[0]
            if imported != module:
                edges[module].setdefault(imported, line)
    return edges


def component_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import of the zoo (`components...`) in the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module]
        found += [(node.lineno, n) for n in names if n == "components" or n.startswith("components.")]
    return found


def circles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """The import circles (strongly connected components of more than one module), each as an import
    path from its first module (by name) back to it. A package's `__init__` importing its own modules is
    not a circle with them: `ablate.x` and `ablate.x.y` are separate nodes."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:  # Tarjan, recursive: the engine has ~100 modules
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(_path_around(min(component), set(component), edges))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def _path_around(start: str, component: set[str], edges: dict[str, dict[str, int]]) -> list[str]:
    """A shortest import path from `start` back to itself inside one circle (breadth first)."""
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for nxt in sorted(edges.get(node, {})):
            if nxt == start:
                return paths[node]
            if nxt in component and nxt not in paths:
                paths[nxt] = paths[node] + [nxt]
                queue.append(nxt)
    raise AssertionError(f"{start}: no path back inside its circle")


def is_config(module: str) -> bool:
    """`ablate.<layer>.config`: a layer's typed recipe section, which any layer may import."""
    parts = module.split(".")
    return len(parts) == 3 and parts[2] == "config"


def violations(root: Path = ROOT) -> list[str]:
    problems = []
    edges = graph(root)
    imported_from_below = {
        target
        for module, imported in edges.items()
        if module != "ablate"
        for target in imported
        if target != "ablate" and is_config(target) and layer_of(target) < layer_of(module)
    }
    for module, imported in sorted(edges.items()):
        if module == "ablate":
            continue
        own = layer_of(module)
        path = root / Path(*module.split(".")).with_suffix(".py")
        path = path if path.exists() else root / Path(*module.split(".")) / "__init__.py"
        for target, line in sorted(imported.items()):
            if target == "ablate":
                continue
            if layer_of(target) < own and not is_config(target):
                problems.append(
                    f"{path.relative_to(root)}:{line}: {module} ({LAYERS[own]}) imports {target} "
                    f"({LAYERS[layer_of(target)]}, above it)"
                )
            elif (LAYERS[own], LAYERS[layer_of(target)]) in NEVER:
                problems.append(
                    f"{path.relative_to(root)}:{line}: {module} ({LAYERS[own]}) imports {target}: "
                    f"{LAYERS[own]} never imports {LAYERS[layer_of(target)]}"
                )
        if module in imported_from_below:
            problems += [
                f"{path.relative_to(root)}:{line}: {module} imports {target}; a config module that a lower "
                "layer imports imports only ablate.core"
                for target, line in sorted(imported.items())
                if layer_of(target) != LAYERS.index("core")
            ]
        for line, target in component_imports(path):
            if (LAYERS[own], "components") in NEVER:
                problems.append(
                    f"{path.relative_to(root)}:{line}: {module} ({LAYERS[own]}) imports {target}: "
                    f"{LAYERS[own]} never imports components"
                )
    for circle in circles(edges):
        problems.append(f"import circle: {' -> '.join(circle)} -> {circle[0]}")
    for path in sorted((root / "components").rglob("*.py")):
        module, package = module_name(path, root)
        for line, imported in imports_of(path, package, set()):
            if imported not in COMPONENTS_MAY_IMPORT and not any(
                imported.startswith(allowed + ".") for allowed in COMPONENTS_MAY_IMPORT
            ):
                problems.append(
                    f"{path.relative_to(root)}:{line}: component {module} imports {imported}; "
                    f"components import only {', '.join(sorted(COMPONENTS_MAY_IMPORT))}"
                )
    return problems


def test_dependencies_point_down_and_never_circle():
    problems = violations()
    assert not problems, "\n".join(problems)


def test_every_engine_folder_is_a_layer():
    for path in (ROOT / "ablate").rglob("*.py"):
        module, _ = module_name(path)
        if module != "ablate":
            layer_of(module)


def test_the_readme_map_names_every_folder_in_the_layers_order():
    """README's "Where things live" lists the folders of ablate/ top to bottom as LAYERS does, and no other."""
    section = (ROOT / "README.md").read_text().split("## Where things live", 1)[1].split("```", 2)[1]
    named = [
        line.split("/")[1].split()[0].removesuffix(".py")
        for line in section.splitlines()
        if line.startswith("ablate/")
    ]
    folders = {p.name for p in (ROOT / "ablate").iterdir() if (p / "__init__.py").exists()}
    assert named == LAYERS and set(named) == folders | {"cli"}, named


def test_no_module_is_left_at_the_top_but_the_command_line():
    """The house is in folders: beside the package's `__init__`, only `cli.py` sits in `ablate/`."""
    assert sorted(p.name for p in (ROOT / "ablate").glob("*.py")) == ["__init__.py", "cli.py"]


@pytest.mark.parametrize(
    ("where", "line", "fragment"),
    [
        (  # upward, across layers (interop: a module no sweep code imports, so no circle either)
            "ablate/model/interop.py",
            "from ablate.sweep.worker import work\n",
            "ablate.model.interop (model) imports ablate.sweep.worker (sweep, above it)",
        ),
        (  # downward, but never: the sweep's workers know nothing of reports
            "ablate/sweep/worker.py",
            "from ablate.report.run_records import collect\n",
            "ablate.sweep.worker (sweep) imports ablate.report.run_records: sweep never imports report",
        ),
        (
            "ablate/probes/run.py",
            "from ablate.report.write import write_report\n",
            "ablate.probes.run (probes) imports ablate.report.write: probes never imports report",
        ),
        (
            "ablate/train/module.py",
            "from components.attention.backends import check_backend\n",
            "ablate.train.module (train) imports components.attention.backends: train never imports components",
        ),
        (  # a config module that the recipe imports, importing more than ablate.core
            "ablate/train/config.py",
            "from ablate.train.launch import world_size\n",
            "ablate.train.config imports ablate.train.launch; a config module that a lower layer imports",
        ),
        (  # a circle inside one layer: registry imports config, config errors; errors now imports registry
            "ablate/core/errors.py",
            "    from ablate.core import registry\n",
            "import circle: ablate.core.config -> ablate.core.errors -> ablate.core.registry -> ablate.core.config",
        ),
        (  # a circle inside one layer, written as a lazy relative import
            "ablate/store/stores.py",
            "    from . import study\n",
            "import circle: ablate.store.stores -> ablate.store.study -> ablate.store.stores",
        ),
        (
            "components/norm.py",
            "from ablate.model.decoder import ModelConfig\n",
            "component components.norm imports ablate.model.decoder",
        ),
    ],
)
def test_a_planted_bad_import_is_found(tmp_path, where, line, fragment):
    """The contract can fail: a copy of the tree with one bad import planted is refused, once."""
    for folder in ("ablate", "components"):
        for path in (ROOT / folder).rglob("*.py"):
            target = tmp_path / path.relative_to(ROOT)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(path.read_text())
    planted = tmp_path / where
    planted.write_text(
        planted.read_text() + "\n\ndef _planted():\n" + (line if line.startswith(" ") else "    " + line)
    )
    problems = violations(tmp_path)
    assert len(problems) == 1 and fragment in problems[0], problems
