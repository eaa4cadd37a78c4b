"""A built-in corpus is whole or built again (ablate.data.builtin_corpus.damage), and a build's failures
are one line each.

The corpus is built from the small local archives of test_builtin_corpus (its `fetch` copies them), in
real folders; a read-only cache and a full disk are real tmpfs mounts. Checked: a deleted or truncated
document file, or a missing manifest.json, is named in one line and the folder built again to the same
fingerprint; a read-only cache with a leftover work folder and a disk that fills while unpacking are one
line each; a second builder says what it waits for.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import subprocess
import tarfile
import threading
from pathlib import Path

import pytest
from test_builtin_corpus import NAME, archives, copy_from  # noqa: F401 -- `archives` is a fixture

from ablate.core.errors import UserError
from ablate.data import builtin_corpus as bc
from ablate.data.corpus import build_builtin


def _build(manifest: Path, root: Path, fetch, lines: list[str] | None = None) -> Path:
    say = lines.append if lines is not None else lambda line: None
    return build_builtin(NAME, manifest_path=manifest, root=root, fetch=fetch, say=say)


def _fingerprint(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())["fingerprint"]


@pytest.mark.parametrize("harm", ["delete-a-document", "truncate-a-document", "no-manifest"])
def test_a_damaged_corpus_folder_is_named_and_built_again(archives, tmp_path, harm):  # noqa: F811
    src, manifest = archives
    folder = _build(manifest, tmp_path / "cache", copy_from(src))
    clean = _fingerprint(folder)
    document = folder / "documents" / "beta-2.0.jsonl"
    if harm == "delete-a-document":
        document.unlink()
        said = "documents/beta-2.0.jsonl is missing"
    elif harm == "truncate-a-document":
        document.write_bytes(document.read_bytes()[:10])
        said = "documents/beta-2.0.jsonl holds 10 bytes"
    else:
        (folder / "manifest.json").unlink()
        said = "no manifest.json"
    lines: list[str] = []
    log: list[str] = []
    again = _build(manifest, tmp_path / "cache", copy_from(src, log), lines)
    assert again == folder and _fingerprint(folder) == clean
    notes = [line for line in lines if "not whole" in line]
    assert len(notes) == 1 and str(folder) in notes[0] and said in notes[0], lines
    assert log == ["alpha-1.0.tar.gz", "beta-2.0.zip"]  # built again from the archives
    assert bc.damage(folder, json.loads(manifest.read_text())) is None
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [folder.name]  # no work folder left
    lines.clear()
    _build(manifest, tmp_path / "cache", copy_from(src, log), lines)  # whole now: opened, not rebuilt
    assert lines == [] and len(log) == 2


@contextlib.contextmanager
def _tmpfs(where: Path, size: str):
    where.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=True)


def test_a_read_only_cache_with_a_leftover_work_folder_is_one_line(archives, tmp_path):  # noqa: F811
    src, manifest = archives
    folder = bc.corpus_folder(NAME, json.loads(manifest.read_text()), tmp_path / "cache")
    with _tmpfs(tmp_path / "cache", "1m"):
        (folder.parent / f".{folder.name}.partial" / "downloads").mkdir(parents=True)  # a killed build's
        subprocess.run(["mount", "-o", "remount,ro", str(tmp_path / "cache")], check=True)
        with pytest.raises(UserError) as e:
            _build(manifest, tmp_path / "cache", copy_from(src))
        msg = str(e.value)
        assert "\n" not in msg and "cannot write" in msg and "Read-only file system" in msg
        assert bc.CORPORA_ENV in msg and not folder.exists()


def _big_archive(src: Path, manifest: Path) -> None:
    """Replace beta's zip by a .tar.gz that unpacks to far more than it downloads (and pin it)."""
    text = ("Compressible prose repeats itself line after line. " * 70)[:3500]
    with tarfile.open(src / "beta-2.0.tar.gz", "w:gz") as t:
        for i in range(400):
            data = f"{i}\n{text}".encode()
            info = tarfile.TarInfo(f"beta-2.0/doc{i:03d}.txt")
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    spec = json.loads(manifest.read_text())
    archive = src / "beta-2.0.tar.gz"
    spec["packages"][1].update(
        file=archive.name,
        bytes=archive.stat().st_size,
        sha256=hashlib.sha256(archive.read_bytes()).hexdigest(),
    )
    manifest.write_text(json.dumps(spec))


def test_a_disk_that_fills_while_unpacking_is_one_line_and_keeps_the_downloads(archives, tmp_path):  # noqa: F811
    src, manifest = archives
    _big_archive(src, manifest)
    assert (src / "beta-2.0.tar.gz").stat().st_size < 64_000
    folder = bc.corpus_folder(NAME, json.loads(manifest.read_text()), tmp_path / "cache")
    with _tmpfs(tmp_path / "cache", "512k"):  # the downloads fit; 1.4 MB of documents do not
        with pytest.raises(UserError) as e:
            _build(manifest, tmp_path / "cache", copy_from(src))
        msg = str(e.value)
        assert "\n" not in msg and "is full" in msg and str(tmp_path / "cache") in msg
        downloads = folder.parent / f".{folder.name}.partial" / "downloads"
        assert sorted(p.name for p in downloads.iterdir()) == ["alpha-1.0.tar.gz", "beta-2.0.tar.gz"]
        assert not folder.exists()


def test_a_second_builder_says_what_it_waits_for(archives, tmp_path):  # noqa: F811
    src, manifest = archives
    folder = bc.corpus_folder(NAME, json.loads(manifest.read_text()), tmp_path / "cache")
    work = folder.parent / f".{folder.name}.partial"
    work.mkdir(parents=True)
    lines: list[str] = []
    result: list[Path] = []
    with open(work / "lock", "a") as held:  # another builder holds the lock
        fcntl.flock(held, fcntl.LOCK_EX)
        waiter = threading.Thread(
            target=lambda: result.append(_build(manifest, tmp_path / "cache", copy_from(src), lines))
        )
        waiter.start()
        for _ in range(600):
            if any("waiting" in line for line in lines):
                break
            waiter.join(0.05)
        assert not result  # still waiting while the lock is held
        fcntl.flock(held, fcntl.LOCK_UN)
    waiter.join(60)
    note = [line for line in lines if "waiting" in line]
    assert len(note) == 1 and str(folder) in note[0] and str(work / "lock") in note[0]
    assert result == [folder] and bc.damage(folder, json.loads(manifest.read_text())) is None
    assert os.listdir(tmp_path / "cache") == [folder.name]
