"""The built-in corpus fetches its archives as bytes (`ablate.data.index_fetch`) and never runs them.

Each test serves a source distribution whose build backend (in-tree, no build dependencies, so any pip
preparing it would run it) writes a marker file on import. The archive is served by a real HTTP server as a
PEP 503 simple index, or from a find-links folder, and reached through pip's own configuration
(`PIP_INDEX_URL`, `PIP_FIND_LINKS`, no config file). Checked: a file whose sha256 differs from its pin is
refused in one line, deleted, and its marker absent; the file with the pinned hash builds the corpus, again
without the marker; a file no index serves is one line naming where it looked.
"""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import tarfile
import threading
from pathlib import Path

import pytest

from ablate.core.errors import UserError
from ablate.data import builtin_corpus as bc
from ablate.data.corpus import build_builtin
from ablate.data.index_fetch import indexes_from_config, pip_indexes

NAME = "pypi-sdists"
INCLUDE = {"suffixes": [".py", ".rst"], "skip": [".egg-info/"], "max_file_bytes": 100_000}


def _sdist(path: Path, marker: Path, text: str) -> None:
    """An sdist whose build backend writes `marker` the moment anything imports it."""
    files = {
        "evilpkg-1.0/pyproject.toml": (
            '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n'
        ),
        "evilpkg-1.0/backend.py": f"open({str(marker)!r}, 'w').write('ran')\n",
        "evilpkg-1.0/setup.py": f"open({str(marker)!r}, 'w').write('ran')\n",
        "evilpkg-1.0/evilpkg/__init__.py": f'"""{text}"""\n',
        "evilpkg-1.0/docs/index.rst": f"Evil\n====\n\n{text}\n",
    }
    with tarfile.open(path, "w:gz") as t:
        for name, body in files.items():
            data = body.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))


@pytest.fixture
def served(tmp_path: Path, monkeypatch):
    """(a simple index on http://127.0.0.1 serving evilpkg-1.0.tar.gz, its folder, the marker path)."""
    root = tmp_path / "index"
    (root / "simple" / "evilpkg").mkdir(parents=True)
    (root / "files").mkdir()
    marker = tmp_path / "backend-ran"
    _sdist(root / "files" / "evilpkg-1.0.tar.gz", marker, "The words of a tiny document. " * 20)
    (root / "simple" / "evilpkg" / "index.html").write_text(
        '<html><body><a href="../../files/evilpkg-1.0.tar.gz">evilpkg-1.0.tar.gz</a></body></html>'
    )

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **k):
            super().__init__(*a, directory=str(root), **k)

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    for var in ("PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX", "PIP_CONSTRAINT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")  # pip reads no config file: only these variables
    monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{server.server_address[1]}/simple")
    yield root, marker
    server.shutdown()
    server.server_close()


def _manifest(tmp_path: Path, archive: Path, sha256: str | None = None) -> Path:
    package = {
        "name": "evilpkg",
        "version": "1.0",
        "file": archive.name,
        "bytes": archive.stat().st_size,
        "sha256": sha256 or hashlib.sha256(archive.read_bytes()).hexdigest(),
        "license": "MIT",
    }
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({"name": NAME, "format": 1, "include": INCLUDE, "packages": [package]}))
    return path


def test_an_archive_whose_hash_differs_from_its_pin_is_refused_unopened_and_its_code_never_runs(
    served, tmp_path
):
    root, marker = served
    manifest = _manifest(tmp_path, root / "files" / "evilpkg-1.0.tar.gz", sha256="ab" * 32)
    cache = tmp_path / "cache"
    with pytest.raises(UserError) as e:
        build_builtin(NAME, manifest_path=manifest, root=cache, say=lambda line: None)
    assert not marker.exists()  # the build backend never ran
    msg = str(e.value)
    assert "\n" not in msg and "evilpkg-1.0.tar.gz" in msg and "ab" * 32 in msg
    assert hashlib.sha256((root / "files" / "evilpkg-1.0.tar.gz").read_bytes()).hexdigest() in msg
    folder = bc.corpus_folder(NAME, json.loads(manifest.read_text()), cache)
    assert not folder.exists()
    leftovers = [p for p in cache.rglob("*") if p.is_file() and p.name != "lock"]
    assert leftovers == []  # the refused bytes are deleted, not kept beside the good downloads


def test_the_pinned_archive_builds_the_corpus_without_running_its_code(served, tmp_path):
    root, marker = served
    manifest = _manifest(tmp_path, root / "files" / "evilpkg-1.0.tar.gz")
    folder = build_builtin(NAME, manifest_path=manifest, root=tmp_path / "cache", say=lambda line: None)
    assert not marker.exists()
    record = json.loads((folder / "manifest.json").read_text())
    paths = [json.loads(line)["path"] for line in (folder / "documents" / "evilpkg-1.0.jsonl").open()]
    # setup.py holds backend.py's bytes: kept once
    assert paths == [
        "evilpkg-1.0/backend.py",
        "evilpkg-1.0/docs/index.rst",
        "evilpkg-1.0/evilpkg/__init__.py",
    ]
    assert (
        record["documents"] == 3
        and record["download_bytes"] == (root / "files" / "evilpkg-1.0.tar.gz").stat().st_size
    )


def test_a_find_links_folder_is_read_the_same_way(served, tmp_path, monkeypatch):
    root, marker = served
    links = tmp_path / "links"
    links.mkdir()
    _sdist(links / "evilpkg-1.0.tar.gz", marker, "Another file under the same name.")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv("PIP_INDEX_URL", (tmp_path / "nowhere").as_uri())  # no index: only the folder
    manifest = _manifest(tmp_path, root / "files" / "evilpkg-1.0.tar.gz")  # pins the index's file
    with pytest.raises(UserError) as e:
        build_builtin(NAME, manifest_path=manifest, root=tmp_path / "cache", say=lambda line: None)
    assert "\n" not in str(e.value) and str(links / "evilpkg-1.0.tar.gz") in str(e.value)
    assert not marker.exists()


def test_a_file_no_index_serves_is_one_line_naming_where_it_looked(served, tmp_path, monkeypatch):
    root, marker = served
    archive = tmp_path / "other-2.0.tar.gz"
    _sdist(archive, marker, "x")
    manifest = _manifest(tmp_path, archive)
    with pytest.raises(UserError) as e:
        build_builtin(NAME, manifest_path=manifest, root=tmp_path / "cache", say=lambda line: None)
    msg = str(e.value)
    assert "\n" not in msg and "other-2.0.tar.gz" in msg and "/simple" in msg and not marker.exists()


def test_pips_configuration_decides_the_indexes(served, monkeypatch):
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "https://a.example/simple https://user:secret@b.example/simple")
    monkeypatch.setenv("PIP_CERT", "/etc/custom.pem")
    got = pip_indexes()
    assert got.index_urls[0].startswith("http://127.0.0.1:") and got.index_urls[1:] == (
        "https://a.example/simple",
        "https://user:secret@b.example/simple",
    )
    assert got.cert == "/etc/custom.pem" and got.find_links == ()
    # a config file's values: the download section over the global one; PyPI when nothing is set
    config = {
        "global.index-url": "https://g.example/simple",
        "download.index-url": "https://d.example/simple",
    }
    assert indexes_from_config(config, {}).index_urls == ("https://d.example/simple",)
    assert indexes_from_config({}, {}).index_urls == ("https://pypi.org/simple",)


def test_a_pip_constraint_on_the_project_does_not_stand_in_the_way_of_a_pinned_file(
    served, tmp_path, monkeypatch
):
    """pip's constraints are for installs: the corpus fetches one file by name and hash, installs nothing,
    so a constraint naming another version of the project changes nothing (pip download refused it)."""
    root, marker = served
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("evilpkg==2.0\n")
    monkeypatch.setenv("PIP_CONSTRAINT", str(constraints))
    manifest = _manifest(tmp_path, root / "files" / "evilpkg-1.0.tar.gz")
    folder = build_builtin(NAME, manifest_path=manifest, root=tmp_path / "cache", say=lambda line: None)
    assert json.loads((folder / "manifest.json").read_text())["documents"] == 3 and not marker.exists()
