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


def _same_size_change(document: Path) -> None:
    """One byte of a document's text changed in place, its size kept (a record's text, not its JSON)."""
    data = bytearray(document.read_bytes())
    at = data.index(b'"text": "') + len(b'"text": "')
    data[at] = ord("Q") if data[at] != ord("Q") else ord("R")
    document.write_bytes(bytes(data))


class _Hashes:
    """Counts the documents hashed (bc.sha256_of), calling the real hash."""

    def __init__(self, monkeypatch):
        self.paths: list[str] = []
        real = bc.sha256_of
        monkeypatch.setattr(bc, "sha256_of", lambda path: self.paths.append(Path(path).name) or real(path))


def test_a_same_size_change_inside_a_document_is_found_by_its_hash_and_built_again(
    archives,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    src, manifest = archives
    folder = _build(manifest, tmp_path / "cache", copy_from(src))
    clean = _fingerprint(folder)
    recorded = json.loads((folder / "manifest.json").read_text())["sha256"]
    assert recorded == {r: hashlib.sha256((folder / r).read_bytes()).hexdigest() for r in recorded}
    hashes = _Hashes(monkeypatch)
    assert bc.damage(folder, json.loads(manifest.read_text())) is None and hashes.paths == []  # build's
    document = folder / "documents" / "beta-2.0.jsonl"
    size = document.stat().st_size
    _same_size_change(document)
    assert document.stat().st_size == size
    lines: list[str] = []
    log: list[str] = []
    assert _build(manifest, tmp_path / "cache", copy_from(src, log), lines) == folder
    notes = [line for line in lines if "not whole" in line]
    assert (
        len(notes) == 1 and "documents/beta-2.0.jsonl does not hold the bytes it was built with" in notes[0]
    )
    assert log == ["alpha-1.0.tar.gz", "beta-2.0.zip"] and _fingerprint(folder) == clean
    hashes.paths.clear()
    lines.clear()
    _build(manifest, tmp_path / "cache", copy_from(src, log), lines)  # whole, and checked at its build
    assert lines == [] and hashes.paths == [] and len(log) == 2


def test_a_copied_corpus_is_hashed_on_its_first_open_only(archives, tmp_path, monkeypatch):  # noqa: F811
    """A copy keeps sizes and, with `cp -p`, modification times: its first open hashes every document."""
    src, manifest = archives
    folder = _build(manifest, tmp_path / "cache", copy_from(src))
    copy = tmp_path / "elsewhere" / folder.name
    copy.parent.mkdir()
    subprocess.run(["cp", "-rp", str(folder), str(copy)], check=True)
    hashes = _Hashes(monkeypatch)
    spec = json.loads(manifest.read_text())
    assert bc.damage(copy, spec) is None
    assert sorted(hashes.paths) == ["alpha-1.0.jsonl", "beta-2.0.jsonl"]
    assert bc.damage(copy, spec) is None and len(hashes.paths) == 2  # the second open hashes nothing
    before = (copy / "documents" / "alpha-1.0.jsonl").stat().st_mtime_ns
    _same_size_change(copy / "documents" / "alpha-1.0.jsonl")
    os.utime(copy / "documents" / "alpha-1.0.jsonl", ns=(before, before))  # even with its time put back
    other = tmp_path / "third" / folder.name
    other.parent.mkdir()
    subprocess.run(["cp", "-rp", str(copy), str(other)], check=True)
    assert "documents/alpha-1.0.jsonl does not hold the bytes" in bc.damage(other, spec)


MANIFEST_HARMS = {
    "size-as-text": (
        lambda r: r["files"].update({"documents/beta-2.0.jsonl": "1234"}),
        "files.documents/beta",
    ),
    "files-a-list": (lambda r: r.update(files=["documents/beta-2.0.jsonl"]), "files is ['documents/beta"),
    "files-missing": (lambda r: r.pop("files"), "files is missing"),
    "size-negative": (
        lambda r: r["files"].update({"documents/beta-2.0.jsonl": -1}),
        "an integer of 0 or more",
    ),
    "hash-not-hex": (lambda r: r["sha256"].update({"documents/beta-2.0.jsonl": "zz"}), "64 lowercase hex"),
    "not-a-mapping": (lambda r: r.clear() or r.update(x=1), "another corpus's"),
}


@pytest.mark.parametrize("harm, said", MANIFEST_HARMS.values(), ids=MANIFEST_HARMS.keys())
def test_a_manifest_with_a_field_of_the_wrong_type_is_named_and_built_again(archives, tmp_path, harm, said):  # noqa: F811
    src, manifest = archives
    folder = _build(manifest, tmp_path / "cache", copy_from(src))
    clean = _fingerprint(folder)
    record = json.loads((folder / "manifest.json").read_text())
    harm(record)
    (folder / "manifest.json").write_text(json.dumps(record))
    lines: list[str] = []
    assert _build(manifest, tmp_path / "cache", copy_from(src), lines) == folder
    notes = [line for line in lines if "not whole" in line]
    assert len(notes) == 1 and said in notes[0] and "\n" not in notes[0], lines
    assert _fingerprint(folder) == clean and bc.damage(folder, json.loads(manifest.read_text())) is None
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [folder.name]


def test_a_corpus_built_before_documents_were_hashed_is_checked_by_size(archives, tmp_path):  # noqa: F811
    src, manifest = archives
    folder = _build(manifest, tmp_path / "cache", copy_from(src))
    record = json.loads((folder / "manifest.json").read_text())
    del record["sha256"]
    (folder / "manifest.json").write_text(json.dumps(record))
    (folder / bc.VERIFIED).unlink()
    assert bc.damage(folder, json.loads(manifest.read_text())) is None
    assert not (folder / bc.VERIFIED).exists()
