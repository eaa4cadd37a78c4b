"""Print the tree's size counts: long modules, long functions, the command line's length, the import rules,
and a run's walk through train/.

    python benchmarks/house_counts.py [--module-lines 500] [--function-lines 80]

Prints, for `ablate/`, `components/` and `benchmarks/`: every module over `--module-lines` lines (with its length),
every function or method of `--function-lines` lines or more (nested ones too, counted from its `def` to
its last line), the length of `ablate/cli.py`, the import circles and the imports that break the layer
rules, as `tests/ablate/test_layers.py` finds them (its functions are imported here, not copied), and a
run's walk from its entry into `ablate/train/` to its result (`benchmarks/call_walk.py`: the functions
entered, the files and folders touched, the returns across files). Pairs of duplicated lines are the
`duplicates` command's to find (places sharing six or more lines); where it is on PATH, its count of pairs
over the tree is the last line, so the counts are in one place. A report of where the tree stands, not a
limit: it always exits 0.
"""

from __future__ import annotations

import argparse
import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("ablate", "components", "benchmarks")


def sources() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py"))


def line_count(path: Path) -> int:
    return len(path.read_text().splitlines())


def long_functions(path: Path, limit: int) -> list[tuple[int, str]]:
    """(length, qualified name) of every function in the file of `limit` lines or more."""
    found = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    length = child.end_lineno - child.lineno + 1
                    if length >= limit:
                        found.append((length, name))
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text(), str(path)), "")
    return found


def import_rules() -> tuple[list[list[str]], list[str]]:
    """(the import circles, the imports breaking a layer rule), from the layer test's own functions."""
    sys.path.insert(0, str(ROOT / "tests" / "ablate"))
    import test_layers

    circles = test_layers.circles(test_layers.graph())
    arrows = [p for p in test_layers.violations() if not p.startswith("import circle:")]
    return circles, arrows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--module-lines", type=int, default=500)
    parser.add_argument("--function-lines", type=int, default=80)
    args = parser.parse_args(argv)

    long_modules = [(line_count(p), p.relative_to(ROOT)) for p in sources()]
    long_modules = sorted((n, p) for n, p in long_modules if n > args.module_lines)
    print(f"modules over {args.module_lines} lines: {len(long_modules)}")
    for n, path in sorted(long_modules, reverse=True):
        print(f"  {n:5d}  {path}")

    functions = [
        (n, f"{p.relative_to(ROOT)}:{name}")
        for p in sources()
        for n, name in long_functions(p, args.function_lines)
    ]
    print(f"functions of {args.function_lines} lines or more: {len(functions)}")
    for n, where in sorted(functions, reverse=True):
        print(f"  {n:5d}  {where}")

    print(f"ablate/cli.py: {line_count(ROOT / 'ablate' / 'cli.py')} lines")

    circles, arrows = import_rules()
    print(f"import circles: {len(circles)}")
    for circle in circles:
        print(f"  {' -> '.join(circle)} -> {circle[0]}")
    print(f"imports against the layer rules: {len(arrows)}")
    for problem in arrows:
        print(f"  {problem}")

    print_walk()
    print_duplicates()


def print_duplicates(root: Path = ROOT) -> None:
    """The `duplicates` command's count of pairs over `root`, in one line, where the command is on PATH
    (its first line counts them: "N pairs of places (...)", "1 pair of ...", or "no duplicates ...")."""
    finder = shutil.which("duplicates")
    if finder is None:
        print("duplicate pairs: not counted (no `duplicates` command on PATH)")
        return
    try:
        out = subprocess.run(
            [finder, "--repo", str(root)], capture_output=True, text=True, timeout=300
        ).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        print(f"duplicate pairs: not counted (`duplicates` failed: {e})")
        return
    lines = out.splitlines()
    first = lines[0] if lines else "no output"
    count = re.match(r"(\d+) pairs? of places", first)
    counted = count.group(1) if count else "0" if first.startswith("no duplicates") else None
    if counted is None:
        print(f"duplicate pairs: not counted (`duplicates` said: {first})")
        return
    incomplete = next((line for line in lines if line.startswith("incomplete:")), "")
    print(f"duplicate pairs: {counted}" + (f" ({incomplete})" if incomplete else ""))


def print_walk() -> None:
    """The run's walk (benchmarks/call_walk.py), in three lines."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import call_walk

    run = call_walk.walk(ROOT)
    within = len(run.returns_within)
    print(
        f"a run's walk from {call_walk.ENTRY.replace(':', '.')}: {len(run.entered)} train/ functions entered"
    )
    print(f"  {len(run.files)} files in {len(run.folders)} folders: {', '.join(sorted(run.folders))}")
    print(
        f"  {len(run.returns)} returns across files: {within} between train/'s files, {len(run.returns) - within} out of it"
    )


if __name__ == "__main__":
    main()
