"""No code from the current folder or the environment runs in a child process (ablate.core.processes):
pip's configuration is read with `-I` from a folder holding a `pip.py` and with that folder on
PYTHONPATH; an ablate child started with `-P` from a folder holding a `yaml.py` imports the real one; the
folder a `python -m` parent imports from is handed down; every Python child of the package is started
through `python_command`; a package index page that links the pinned file to a FIFO is one line, not a
hang. Real processes, files, FIFOs and a `file:` index under tmp_path."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ablate.core.errors import UserError
from ablate.core.processes import child_environment, python_command
from ablate.data import index_fetch

ROOT = Path(__file__).resolve().parents[2]


def _planted(folder: Path, module: str, marker: Path) -> None:
    """`folder/<module>.py` that writes `marker` if anything imports it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{module}.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")


def test_pips_configuration_is_read_without_the_current_folder_or_pythonpath(tmp_path, monkeypatch):
    marker = tmp_path / "ran"
    _planted(tmp_path / "here", "pip", marker)
    _planted(tmp_path / "env", "pip", marker)
    monkeypatch.chdir(tmp_path / "here")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "env"))
    monkeypatch.setenv("PYTHONSTARTUP", str(tmp_path / "env" / "pip.py"))
    config = tmp_path / "pip.conf"
    config.write_text("[global]\nindex-url = http://127.0.0.1:9/simple\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(config))
    for var in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX"):
        monkeypatch.delenv(var, raising=False)
    indexes = index_fetch.pip_indexes()
    assert indexes.index_urls == ("http://127.0.0.1:9/simple",)  # pip itself read its configuration
    assert not marker.exists()


def test_an_ablate_child_imports_no_module_of_its_current_folder(tmp_path):
    marker = tmp_path / "ran"
    _planted(tmp_path, "yaml", marker)  # ablate.cli imports yaml (through jsonargparse)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        python_command("-m", "ablate.cli", "--help"), cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not marker.exists()


def test_the_folder_a_python_m_parent_imports_from_is_handed_down(tmp_path):
    """A parent started as `python -m` (its first import folder its current one) hands that folder down,
    so its child imports the plugins it imports; a parent started otherwise hands nothing down."""
    (tmp_path / "parent.py").write_text(
        textwrap.dedent("""
        from ablate.core.processes import child_environment
        print(child_environment({}).get("PYTHONPATH", "-"))
        """)
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = [sys.executable, "-m", "parent"]
    handed = subprocess.run(run, cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    assert handed.stdout.strip() == str(tmp_path)
    safe = subprocess.run([sys.executable, "-P", "-m", "parent"], cwd=tmp_path, env=env, capture_output=True)
    assert safe.returncode != 0  # with -P the folder is not on the path: the module is not found at all
    assert child_environment({"PYTHONPATH": "/plugins"})["PYTHONPATH"].endswith("/plugins")


def test_every_python_child_of_the_package_is_started_through_python_command():
    """The interpreter is named in one module only: any other `sys.executable` in the package's code (a
    child started with the current folder first on its path) fails this."""
    found = []
    for path in sorted((ROOT / "ablate").rglob("*.py")) + sorted((ROOT / "components").rglob("*.py")):
        if path == ROOT / "ablate" / "core" / "processes.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            code = line.split("#", 1)[0]
            if re.search(r"\bsys\.executable\b", code) and "`sys.executable`" not in code:
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert found == []


class _Pin:
    name = "evilpkg"
    version = "1.0"
    file = "evilpkg-1.0.tar.gz"
    bytes = 10
    sha256 = hashlib.sha256(b"0123456789").hexdigest()


@pytest.mark.parametrize("how", ["find-links page", "index"])
def test_an_index_page_that_links_the_pinned_file_to_a_fifo_is_one_line(tmp_path, how):
    """Run in a child with a bound, so a regression fails here instead of hanging the suite."""
    files = tmp_path / "files"
    files.mkdir()
    os.mkfifo(files / _Pin.file)  # no writer: opening it to read would wait for ever
    page = tmp_path / "simple" / "evilpkg" / "index.html"
    page.parent.mkdir(parents=True)
    page.write_text(f'<a href="../../files/{_Pin.file}">{_Pin.file}</a>')
    indexes = (
        index_fetch.PipIndexes((), (page.as_uri(),))
        if how == "find-links page"
        else index_fetch.PipIndexes(((tmp_path / "simple").as_uri(),), ())
    )
    script = textwrap.dedent(f"""
        from pathlib import Path
        from ablate.core.errors import UserError
        from ablate.data import index_fetch
        from ablate.data.index_fetch import PipIndexes

        class Pin:
            name, version, file, bytes, sha256 = {_Pin.name!r}, {_Pin.version!r}, {_Pin.file!r}, 10, {_Pin.sha256!r}

        try:
            index_fetch.fetch_pinned(Pin, Path({str(tmp_path / "dest")!r}), {indexes!r})
        except UserError as e:
            print(e)
    """)
    (tmp_path / "dest").mkdir()
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "is not a regular file" in proc.stdout and _Pin.file in proc.stdout, proc.stdout
    assert sorted(os.listdir(tmp_path / "dest")) == []


def test_a_regular_file_is_read_and_a_folder_is_refused(tmp_path):
    archive = tmp_path / _Pin.file
    archive.write_bytes(b"0123456789")
    (tmp_path / "dest").mkdir()
    got = index_fetch.fetch_pinned(_Pin, tmp_path / "dest", index_fetch.PipIndexes((), (str(tmp_path),)))
    assert got.read_bytes() == b"0123456789"
    with pytest.raises(UserError, match="not a regular file"):
        index_fetch._regular_file(tmp_path, tmp_path.as_uri())
