"""A run's walk through the engine, read with `ast`: from the entry every run takes into `ablate/train/`
(`ablate.train.branches.train_budgets`, for `ablate train` and a sweep's workers alike) to its result.

The walk starts at the entry and follows every call `ast` can resolve to a function of `ablate/`: a name
defined or imported in the caller's module (lazy imports inside a function included), `module.function`
through an imported module, `self.method` within the caller's class, and a class called (its `__init__`).
It descends into `train/`'s own functions only: a call out of `train/` is counted where it lands (its file
and folder) but not followed, since what another folder does below is that folder's walk. Calls `ast`
cannot resolve (attributes of objects, the registry's builders, Lightning's hooks) are not counted.

Counts: the `train/` functions entered; the files and folders the walk touches (its own and where its calls
out land); the returns, each distinct (caller, callee) pair whose callee lies in another file (a call that
leaves its file and comes back to it), split into those between `train/`'s own files and those out of it.
Used by `benchmarks/house_counts.py`; the counting is held by tests/ablate/test_house_counts.py.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ENTRY = "ablate.train.branches:train_budgets"
INSIDE = "ablate.train"


def modules(root: Path) -> dict[str, Path]:
    """{dotted module: file} for every module under `root`/ablate."""
    found = {}
    for path in sorted((root / "ablate").rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


class Index:
    """Every module's functions and methods ("module:name", "module:Class.name"), classes and imports."""

    def __init__(self, root: Path):
        self.files = modules(root)
        self.functions: dict[str, ast.AST] = {}
        self.classes: set[str] = set()
        self.imports: dict[str, dict[str, str]] = {}
        for module, path in self.files.items():
            tree = ast.parse(path.read_text(), str(path))
            package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
            self.imports[module] = self._imports(tree, package)
            for node in tree.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    self.functions[f"{module}:{node.name}"] = node
                elif isinstance(node, ast.ClassDef):
                    self.classes.add(f"{module}:{node.name}")
                    for item in node.body:
                        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                            self.functions[f"{module}:{node.name}.{item.name}"] = item

    def _imports(self, tree: ast.AST, package: str) -> dict[str, str]:
        """{local name: "module" (a module) or "module:name" (a name in it)} for every import in the file."""
        names = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    names[alias.asname or alias.name.split(".")[0]] = (
                        alias.name if alias.asname else alias.name.split(".")[0]
                    )
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    names[alias.asname or alias.name] = full if full in self.files else f"{base}:{alias.name}"
        return names

    def target(self, name: str | None, depth: int = 0) -> str | None:
        """The function "module:qualname" that `name` ("module:name") is, through re-exports; a class: its
        `__init__` where it defines one."""
        if not name or ":" not in name or depth > 5:
            return None
        module, qual = name.split(":", 1)
        if name in self.classes:
            return f"{name}.__init__" if f"{name}.__init__" in self.functions else None
        if name in self.functions:
            return name
        return self.target(self.imports.get(module, {}).get(qual), depth + 1)

    def callee(self, module: str, cls: str | None, call: ast.Call) -> str | None:
        func, local = call.func, self.imports[module]
        if isinstance(func, ast.Name):
            own = f"{module}:{func.id}"
            return self.target(own if own in self.functions or own in self.classes else local.get(func.id))
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            owner = func.value.id
            if owner == "self" and cls:
                return self.target(f"{module}:{cls}.{func.attr}")
            imported = local.get(owner)
            if imported and ":" not in imported and imported in self.files:
                return self.target(f"{imported}:{func.attr}")
        return None


@dataclass(frozen=True)
class Walk:
    entered: frozenset[str]  # train/ functions the walk went into
    calls: frozenset[tuple[str, str]]  # (caller, callee) pairs, callees out of train/ included

    @staticmethod
    def _module(function: str) -> str:
        return function.split(":", 1)[0]

    @property
    def files(self) -> set[str]:
        return {self._module(f) for f in self.entered} | {self._module(b) for _, b in self.calls}

    @property
    def folders(self) -> set[str]:
        return {m.split(".")[1] for m in self.files if m.count(".")}

    @property
    def returns(self) -> set[tuple[str, str]]:
        return {(a, b) for a, b in self.calls if self._module(a) != self._module(b)}

    @property
    def returns_within(self) -> set[tuple[str, str]]:
        return {(a, b) for a, b in self.returns if _inside(self._module(b))}


def _inside(module: str) -> bool:
    return module == INSIDE or module.startswith(INSIDE + ".")


def walk(root: Path, entry: str = ENTRY) -> Walk:
    """The run's walk from `entry` ("module:function") through `train/` (module docstring)."""
    index = Index(root)
    entered: set[str] = set()
    calls: set[tuple[str, str]] = set()
    todo = [entry]
    while todo:
        function = todo.pop()
        if function in entered:
            continue
        entered.add(function)
        module, qual = function.split(":", 1)
        cls = qual.split(".")[0] if "." in qual else None
        for node in ast.walk(index.functions[function]):
            if isinstance(node, ast.Call) and (callee := index.callee(module, cls, node)):
                calls.add((function, callee))
                if _inside(callee.split(":", 1)[0]):
                    todo.append(callee)
    return Walk(frozenset(entered), frozenset(calls))
