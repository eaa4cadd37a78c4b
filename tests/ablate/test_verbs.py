"""The verbs have one home: `ablate.cli` is argv only, each verb is a module of `ablate.verbs` holding its
options and its orchestration, small enough to read in one go, and no library module calls itself a verb."""

from __future__ import annotations

import ast
from pathlib import Path

from ablate.cli import VERBS

ROOT = Path(__file__).resolve().parents[2]
CLI_LINES = 150
VERB_MODULE_LINES = 250
VERB_FUNCTION_LINES = 80


def test_every_verb_lives_in_its_own_module_of_ablate_verbs():
    homes = {name: fn.__module__ for name, fn in VERBS.items()}
    assert all(home.startswith("ablate.verbs.") for home in homes.values()), homes
    tree = ast.parse((ROOT / "ablate" / "cli.py").read_text())
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert not defined & {fn.__name__ for fn in VERBS.values()}, "a verb's body is in cli.py"


def test_the_command_line_is_argv_only_and_small():
    text = (ROOT / "ablate" / "cli.py").read_text()
    assert len(text.splitlines()) <= CLI_LINES
    for name in VERBS:  # no special case for one verb: a verb says what it needs through attributes
        assert f'verb == "{name}"' not in text and f'verb != "{name}"' not in text, name


def test_verb_modules_and_their_functions_are_short():
    for path in sorted((ROOT / "ablate" / "verbs").glob("*.py")):
        text = path.read_text()
        assert len(text.splitlines()) <= VERB_MODULE_LINES, path.name
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef):
                length = node.end_lineno - node.lineno + 1
                assert length <= VERB_FUNCTION_LINES, f"{path.name}: {node.name} is {length} lines"


def test_no_library_module_opens_as_a_verb():
    """A module outside ablate/verbs/ whose docstring opens with "`ablate <verb>`" holds a verb's job."""
    found = []
    for path in sorted((ROOT / "ablate").rglob("*.py")):
        if "verbs" in path.relative_to(ROOT / "ablate").parts or path.name == "cli.py":
            continue
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        if doc.startswith("`ablate "):
            found.append(str(path.relative_to(ROOT)))
    assert not found, found


def test_the_workspace_layout_is_one_value_not_a_loose_path():
    """Every function given the workspace takes its layout (ablate.core.workspace.Workspace), and only that
    module names the folders in it: no `workspace: Path` parameter, no `"runs"`/`"cache"`/`"logs"`/
    `"slurm"`/`"mlflow.db"`/`"optuna.journal"` joined to a path elsewhere."""
    loose, joined = [], []
    layout_names = {"runs", "cache", "logs", "slurm", "mlflow.db", "optuna.journal", "artifacts"}
    for path in sorted((ROOT / "ablate").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for arg in [*node.args.args, *node.args.kwonlyargs]:
                    shown = ast.unparse(arg.annotation) if arg.annotation else ""
                    if arg.arg == "workspace" and "Workspace" not in shown:
                        loose.append(f"{path.name}:{node.name}({arg.arg}: {shown or 'unannotated'})")
            if path.name != "workspace.py" and isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
                if isinstance(node.right, ast.Constant) and node.right.value in layout_names:
                    joined.append(f"{path.name}:{node.lineno} / {node.right.value!r}")
    assert not loose, loose
    assert not joined, joined
