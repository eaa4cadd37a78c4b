"""Safe defaults, checked on the source: no shell, safe YAML only, checkpoints loaded as weights only,
servers on the loopback address unless asked otherwise.

The checks read every module's syntax tree (not its text), so a comment or a string that mentions a call
does not count, and a call spelled over several lines does.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
import yaml

import ablate
from ablate.cli import parse_args
from ablate.core.config import _Loader

pytestmark = pytest.mark.scaleout

ROOT = Path(ablate.__file__).resolve().parent.parent
SOURCES = sorted(
    p for folder in ("ablate", "components", "benchmarks") for p in (ROOT / folder).rglob("*.py")
)
SAFE_LOADERS = {"SafeLoader", "CSafeLoader", "_Loader"}


def _calls(path: Path):
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Call):
            yield node


def _name(func: ast.expr) -> str:
    """'yaml.load' for yaml.load(...), 'load' for load(...), '.fit' for x.y.fit(...)."""
    if isinstance(func, ast.Attribute):
        return f"{func.value.id}.{func.attr}" if isinstance(func.value, ast.Name) else f".{func.attr}"
    return func.id if isinstance(func, ast.Name) else ""


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _is_true(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def _where(path: Path, call: ast.Call) -> str:
    return f"{path.relative_to(ROOT)}:{call.lineno}"


def test_the_sources_are_there():
    assert len(SOURCES) > 20 and any(p.as_posix().endswith("ablate/train/run.py") for p in SOURCES)


def shell_problems(paths: list[Path]) -> list[str]:
    bad = []
    for path in paths:
        for call in _calls(path):
            name = _name(call.func)
            if _keyword(call, "shell") is not None and not (
                isinstance(_keyword(call, "shell"), ast.Constant) and _keyword(call, "shell").value is False
            ):
                bad.append(f"{_where(path, call)} {name}(shell=...)")
            if name in ("os.system", "os.popen", "subprocess.getoutput", "subprocess.getstatusoutput"):
                bad.append(f"{_where(path, call)} {name}")
            if (
                name.startswith("subprocess.")
                and call.args
                and isinstance(call.args[0], ast.Constant | ast.JoinedStr)
            ):
                bad.append(f"{_where(path, call)} {name} with a command string, not an argument list")
            if name in ("eval", "exec"):
                bad.append(f"{_where(path, call)} {name}")
    return bad


def yaml_problems(paths: list[Path]) -> list[str]:
    bad = []
    for path in paths:
        for call in _calls(path):
            name = _name(call.func)
            if name in ("yaml.unsafe_load", "yaml.full_load", "yaml.unsafe_load_all", "yaml.full_load_all"):
                bad.append(f"{_where(path, call)} {name}")
            if name in ("yaml.load", "yaml.load_all"):
                loader = _keyword(call, "Loader") or (call.args[1] if len(call.args) > 1 else None)
                loader_name = (
                    loader.attr if isinstance(loader, ast.Attribute) else getattr(loader, "id", None)
                )
                if loader_name not in SAFE_LOADERS:
                    bad.append(f"{_where(path, call)} {name} with Loader={loader_name}")
    return bad


def checkpoint_problems(paths: list[Path]) -> tuple[list[str], int]:
    bad, seen = [], 0
    for path in paths:
        for call in _calls(path):
            name = _name(call.func)
            if name == "torch.load" or (
                name.endswith((".fit", ".validate", ".test", ".predict"))
                and _keyword(call, "ckpt_path") is not None
            ):
                seen += 1
                if not _is_true(_keyword(call, "weights_only")):
                    bad.append(f"{_where(path, call)} {name} without weights_only=True")
            if name in ("pickle.load", "pickle.loads", "torch.serialization.load"):
                bad.append(f"{_where(path, call)} {name}")
    return bad, seen


def test_no_shell():
    assert shell_problems(SOURCES) == []


def test_yaml_is_loaded_safely():
    # the loader behind ablate.core.config.load_yaml: libyaml's CSafeLoader (or SafeLoader): what makes
    # either safe is the constructor, SafeConstructor, never the Full or Unsafe one that builds objects
    assert issubclass(_Loader, yaml.constructor.SafeConstructor)
    assert not issubclass(_Loader, yaml.constructor.FullConstructor)
    assert yaml_problems(SOURCES) == []


def test_checkpoints_are_loaded_as_weights_only():
    bad, seen = checkpoint_problems(SOURCES)
    assert bad == []
    assert seen >= 2  # the resume path (Trainer.fit) and the step probe (torch.load) were both found


def test_the_checks_find_what_they_look_for(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    sample = tmp_path / "bad.py"
    sample.write_text(
        "import os, subprocess, torch, yaml\n"
        "subprocess.run(cmd,\n    shell=True)\n"
        "subprocess.check_output(f'ls {path}')\n"
        "os.system('ls')\n"
        "yaml.load(text)\n"
        "yaml.load(text, Loader=yaml.Loader)\n"
        "yaml.unsafe_load(text)\n"
        "torch.load(path)\n"
        "torch.load(path, weights_only=False)\n"
        "trainer.fit(module, ckpt_path=last)\n"
        "# torch.load(path) in a comment does not count\n"
    )
    assert len(shell_problems([sample])) == 3
    assert len(yaml_problems([sample])) == 3
    bad, seen = checkpoint_problems([sample])
    assert len(bad) == 3 and seen == 3


@pytest.mark.parametrize("verb", ["ui", "server"])
def test_servers_listen_on_loopback_by_default(verb):
    _, values, _, _ = parse_args([verb])
    assert values["host"] == "127.0.0.1"


def test_server_command_is_an_argument_list_with_the_host_given():
    from ablate.store.server import server_command, url_for

    cmd = server_command("sqlite:///x.db; rm -rf /", Path("work space/a b"), "127.0.0.1", 5000)
    assert (
        isinstance(cmd, list) and "sqlite:///x.db; rm -rf /" in cmd
    )  # one argument, never parsed by a shell
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1" and "--serve-artifacts" in cmd
    assert url_for("0.0.0.0", 5000) == "http://127.0.0.1:5000"
