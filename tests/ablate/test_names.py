"""Tag names are one table (`ablate.store.names`): no other module writes an `ablate.*` tag as a bare string,
so a name written in one place and searched for in another cannot drift apart (a folder move once rewrote
a searched tag and left the written one). Strings that name a module (`ablate.sweep.local`) or the
entry-point group (`ablate.components`) are not tags; docstrings may name tags in prose."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from ablate.store import names

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ["ablate", "components", "benchmarks"]
TABLE = ROOT / "ablate" / "store" / "names.py"
DOTTED = re.compile(r"ablate\.([a-z_]+)")
# what `ablate.<x>` may be besides a tag: a sub-package or module of ablate, or the entry-point group
NOT_TAGS = {p.stem for p in (ROOT / "ablate").iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
NOT_TAGS |= {"components"}


def docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def bare_tags(text: str) -> list[str]:
    """The `ablate.*` tags written out in `text` (a string of the code)."""
    tags = [m.group(0) for m in DOTTED.finditer(text) if m.group(1) not in NOT_TAGS]
    if "tags.`ablate." in text:  # an MLflow filter on a tag, whatever the name
        tags.append(text)
    return tags


def test_no_tag_name_is_written_outside_the_table():
    found = []
    for folder in SOURCES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == TABLE:
                continue
            tree = ast.parse(path.read_text(), str(path))
            skip = docstrings(tree)
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
                    found += [f"{path.relative_to(ROOT)}:{node.lineno}: {t}" for t in bare_tags(node.value)]
    assert not found, "tag names written outside ablate/store/names.py:\n" + "\n".join(found)


def test_the_check_sees_a_searched_tag_that_is_not_the_written_one():
    assert bare_tags("tags.`ablate.store.study` = '") and bare_tags("ablate.pruned")
    assert not bare_tags("ablate.sweep.local") and not bare_tags("ablate.components")


def test_every_tag_has_one_name():
    table = {k: v for k, v in vars(names).items() if k.isupper() and isinstance(v, str)}
    tags = {k: v for k, v in table.items() if v.startswith(names.PREFIX) and v != names.PREFIX}
    assert len(set(tags.values())) == len(tags), "two constants of ablate.store.names hold one tag"
    assert names.probe_of_settings_tag(names.probe_settings_tag("outliers")) == "outliers"
    assert names.probe_of_settings_tag(names.probe_tag("outliers")) is None
