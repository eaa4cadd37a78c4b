"""Built-in download corpora: pinned packages fetched by name, checked by hash, unpacked once into a shared cache.

`pypi-sdists` (`data.source: pypi-sdists`) is the text of the source distributions of 21 pinned Python
projects (Django, SymPy, SQLAlchemy, Sphinx, Ansible, Salt, transformers, ...): their code (.py, .pyi) and
their documentation (.rst, .md, .txt), one document per file. Its manifest, `pypi_sdists.json` beside this
module, pins every distribution by name, version, file name and sha256, and says which files of an
archive are documents; the corpus is what those pinned files hold, so every machine that builds it gets
the same bytes and the same fingerprint. Each archive is fetched by its pinned file name from the indexes the
machine's pip is set up for (`ablate.data.index_fetch`: bytes only, never `pip download`, which would run
the archive's build backend), and a file whose sha256 differs from the pin is refused in one line before
anything opens it; nothing from an archive is ever run or built.

Where it lives: `$ABLATE_CORPORA`, else `$XDG_CACHE_HOME/ablate/corpora`, else `~/.cache/ablate/corpora`,
in `<name>-<manifest hash>/`: outside any workspace, so every workspace of a machine shares one copy, and a
changed manifest is a new folder. The folder holds `documents/<archive>.jsonl` (one record per file:
{"path", "text"}) and `manifest.json` (the packages, the counts, the fingerprint, the token counts).

The build is resumable and atomic: archives are downloaded one by one into `.<folder>.partial/downloads/`
(a download lands there only whole and verified, so a killed build keeps every finished one); the
documents are then extracted into a fresh folder beside it, measured, and renamed into place in one step,
so a half-built corpus is never read. Each open checks the folder against its manifest.json (read through
ablate.core.fields: a field of the wrong type is damage): every document file there, at the size it was
built with, and of the SHA-256 the build recorded, hashed on the first open after the file was copied or
its modification time changed (`verified.json` beside the manifest keeps each hash by the file's size,
time, inode and device; any other open reads no text), so a folder damaged, edited or half-copied later is
said in one line and built again. (A folder built before the documents were hashed is checked by size.) A file lock lets one process build while another waits for it,
saying so. A write that fails (a read-only cache, a full disk) is one line.

Why not a library: pip knows the machine's indexes but has no call that fetches a file without preparing
(building) it; what this module adds is the extraction rule, the shared cache and the pinned fingerprint.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import sys
import tarfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ablate.core import fields, json_cache
from ablate.core.errors import UserError
from ablate.data.index_fetch import fetch_pinned

BUILTIN_CORPORA = {"pypi-sdists": Path(__file__).with_name("pypi_sdists.json")}
# What a build gives (documents, text, token counts), measured, for `ablate check` before a build
EXPECTED = {"pypi-sdists": Path(__file__).with_name("pypi_sdists_counts.json")}
CORPORA_ENV = "ABLATE_CORPORA"
_HASH_BLOCK = 1 << 22

Say = Callable[[str], None]
Fetch = Callable[["Package", Path], Path]  # (package, an empty folder) -> the archive it wrote there
Measure = Callable[[Path], dict]  # the extracted folder -> fields for its manifest.json


@dataclass(frozen=True)
class Package:
    """One pinned archive of a download corpus."""

    name: str
    version: str
    file: str
    bytes: int
    sha256: str
    license: str

    @property
    def stem(self) -> str:
        for suffix in (".tar.gz", ".tar.bz2", ".tar.xz", ".tgz", ".zip"):
            if self.file.endswith(suffix):
                return self.file[: -len(suffix)]
        return self.file


def load_manifest(path: Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def packages_of(manifest: dict[str, Any]) -> list[Package]:
    return [Package(**p) for p in manifest["packages"]]


def manifest_hash(manifest: dict[str, Any]) -> str:
    """16 hex digits of the SHA-256 of the manifest's canonical JSON: the cache folder's key."""
    canonical = json.dumps(manifest, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


def cache_root() -> Path:
    """Where download corpora live: $ABLATE_CORPORA, else the user's cache folder."""
    if os.environ.get(CORPORA_ENV):
        return Path(os.environ[CORPORA_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ablate" / "corpora"


def corpus_folder(name: str, manifest: dict[str, Any], root: Path | None = None) -> Path:
    return Path(root or cache_root()) / f"{name}-{manifest_hash(manifest)}"


def sha256_of(path: Path) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_HASH_BLOCK):
            sha.update(block)
    return sha.hexdigest()


def index_download(package: Package, dest: Path) -> Path:
    """The package's pinned archive, fetched by file name from the indexes pip is set up for and checked
    against its pin before anything opens it; never built (`ablate.data.index_fetch`)."""
    return fetch_pinned(package, dest)


def build(
    name: str,
    *,
    manifest_path: Path | None = None,
    root: Path | None = None,
    fetch: Fetch = index_download,
    measure: Measure | None = None,
    say: Say | None = None,
) -> Path:
    """The built corpus folder of `name` (download, extract, measure, publish), built on first use and
    resumed where a killed build stopped; a folder that is not whole (`damage`) is said in a line and
    built again. `fetch` gets each archive (from the package index by default); `measure` adds fields (the
    fingerprint, token counts) to the corpus's manifest.json from the extracted folder."""
    say = say or say_stderr
    manifest = load_manifest(manifest_path or BUILTIN_CORPORA[name])
    folder = corpus_folder(name, manifest, root)
    if folder.exists() and (problem := damage(folder, manifest)) is None:
        return folder
    if folder.exists():
        say(f"{name}: {folder} is not whole ({problem}); building it again")
    work = folder.parent / f".{folder.name}.partial"
    with _writing(folder.parent):
        work.mkdir(parents=True, exist_ok=True)
        lock = open(work / "lock", "a")
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"{name}: waiting for another process that is building {folder} (it holds {work / 'lock'})")
            fcntl.flock(lock, fcntl.LOCK_EX)
        if folder.exists() and damage(folder, manifest) is None:
            return folder  # the other process built it
        with _writing(folder.parent):
            _build_into(name, manifest, folder, work, fetch, measure, say)
    shutil.rmtree(work, ignore_errors=True)
    return folder


def _build_into(
    name: str, manifest: dict, folder: Path, work: Path, fetch: Fetch, measure: Measure | None, say: Say
) -> None:
    packages = packages_of(manifest)
    archives = _download_all(name, packages, work / "downloads", fetch, say)
    staging = work / "build"
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "documents").mkdir(parents=True)
    say(f"{name}: extracting the documents of {len(packages)} archives")
    counts = _extract_all(packages, archives, manifest["include"], staging / "documents")
    record = {
        "name": name,
        "manifest_sha256": manifest_hash(manifest),
        "about": manifest.get("about", ""),
        "bytes": sum(c["bytes"] for c in counts),
        "documents": sum(c["documents"] for c in counts),
        "download_bytes": sum(p.bytes for p in packages),
        "packages": [{**p.__dict__, **c} for p, c in zip(packages, counts, strict=True)],
        "files": {
            f"documents/{p.stem}.jsonl": (staging / "documents" / f"{p.stem}.jsonl").stat().st_size
            for p in packages
        },  # fmt: skip
    }
    say(f"{name}: hashing the documents")
    record["sha256"] = {relative: sha256_of(staging / relative) for relative in record["files"]}
    verified = {
        _stat_key(staging / relative, relative): digest for relative, digest in record["sha256"].items()
    }
    json_cache.add(staging / VERIFIED, verified)  # as hashed now: the first open reads no document again
    if measure is not None:
        say(f"{name}: {record['documents']:,} documents, {record['bytes'] / 1e6:.0f} MB; measuring")
        record.update(measure(staging))
    (staging / "manifest.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    if folder.exists():  # a damaged copy (named in a line above): out of the way in one rename, then gone
        old = work / "damaged"
        shutil.rmtree(old, ignore_errors=True)
        os.rename(folder, old)
        shutil.rmtree(old, ignore_errors=True)
    os.rename(staging, folder)
    say(f"{name}: built {folder}")


VERIFIED = "verified.json"  # beside manifest.json: each document's hash as last checked, by its file's stat


def damage(folder: Path, manifest: dict[str, Any]) -> str | None:
    """What is wrong with a built corpus folder: None when it is whole, else what is missing, of another
    size than its manifest.json records, or (where the manifest records the documents' SHA-256, as every
    build since 2026-12 does) of other bytes. A document's bytes are hashed on the first open after it
    was copied or its modification time changed (`_verified`); every other open reads no document. The
    manifest itself is read through ablate.core.fields: a field of the wrong type is damage too."""
    where = f"its manifest.json ({folder / 'manifest.json'})"
    try:
        record = json.loads(fields.text_file(folder / "manifest.json", "manifest.json"))
    except UserError as e:
        return "it has no manifest.json" if not (folder / "manifest.json").exists() else str(e)
    except ValueError as e:
        return f"its manifest.json cannot be read: {e}"
    if not isinstance(record, dict) or record.get("manifest_sha256") != manifest_hash(manifest):
        return "its manifest.json is another corpus's"
    try:
        sizes = fields.get(where, record, "files", fields.MAPPING)
        for relative, size in sizes.items():
            fields.field(where, f"files.{relative}", size, fields.NATURAL)
        hashes = fields.field(where, "sha256", record.get("sha256", {}), fields.MAPPING)
        for relative, digest in hashes.items():
            fields.field(where, f"sha256.{relative}", digest, fields.SHA256)
    except UserError as e:
        return str(e)
    for relative, size in sizes.items():
        path = folder / relative
        if not path.is_file():
            return f"{relative} is missing"
        if path.stat().st_size != size:
            return f"{relative} holds {path.stat().st_size:,} bytes, not the {size:,} it was built with"
        if relative in hashes and _verified(folder, relative) != hashes[relative]:
            return f"{relative} does not hold the bytes it was built with (its SHA-256 differs)"
    extra = {f"documents/{p.name}" for p in (folder / "documents").glob("*.jsonl")} - set(sizes)
    if extra:
        return f"{sorted(extra)[0]} is not one of its documents"
    return None


def _stat_key(path: Path, relative: str) -> str:
    """What changes when a file is copied or written: its size, modification time, inode and device."""
    st = path.stat()
    return f"{relative}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}|{st.st_dev}"


def _verified(folder: Path, relative: str) -> str:
    """The SHA-256 of the document `relative`, hashed once per state of its file (`_stat_key`) and kept in
    the folder's `VERIFIED` (ablate.core.json_cache: a damaged or unwritable one costs a hash)."""
    path = folder / relative
    digest, _ = json_cache.measured_once(
        folder / VERIFIED, _stat_key(path, relative), lambda: sha256_of(path), fields.SHA256.read
    )
    return digest


@contextlib.contextmanager
def _writing(where: Path):
    """A write into the corpus cache that fails is one line: a full disk, a read-only folder, any other."""
    try:
        yield
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            free = shutil.disk_usage(where).free if where.exists() else 0
            raise UserError(
                f"{CORPORA_ENV}: the disk holding {where} is full ({free / 2**20:.0f} MiB free) while the "
                f"corpus was built; free some space (the finished downloads are kept) or point {CORPORA_ENV} "
                "at a folder on another disk"
            ) from None
        if e.errno is None:
            raise
        raise UserError(
            f"{CORPORA_ENV}: cannot write {e.filename or where} ({e.strerror}); point {CORPORA_ENV} at a "
            "writable folder"
        ) from None


@dataclass(frozen=True)
class PendingBuild:
    """A built-in corpus not built (whole) on this machine yet: what its first use downloads and builds."""

    name: str
    folder: Path
    archives: int
    download_bytes: int
    text_bytes: int | None  # measured on earlier builds of the same manifest (EXPECTED), when known
    tokens: dict[str, dict[str, Any]]  # tokenizer label -> {train, val, val_fraction}, the same way

    def line(self) -> str:
        text = f", unpacks about {self.text_bytes / 1e6:.0f} MB of text" if self.text_bytes else ""
        return (
            f"{self.name} is not built in {self.folder.parent} yet: the first run (or `ablate prepare "
            f"{self.name}`) downloads {self.download_bytes / 1e6:.1f} MB ({self.archives} archives){text} and "
            "tokenizes it before training"
        )


def pending_build(name: str, root: Path | None = None) -> PendingBuild | None:
    """None when `name` is built whole here (or is not a built-in corpus); else what building it takes,
    with the counts earlier builds of the same manifest measured. Nothing is downloaded or written."""
    if name not in BUILTIN_CORPORA:
        return None
    manifest = load_manifest(BUILTIN_CORPORA[name])
    folder = corpus_folder(name, manifest, root)
    if folder.exists() and damage(folder, manifest) is None:
        return None
    expected: dict[str, Any] = {}
    if name in EXPECTED and EXPECTED[name].is_file():
        expected = json.loads(EXPECTED[name].read_text(encoding="utf-8"))
        if expected.get("manifest_sha256") != manifest_hash(manifest):
            expected = {}  # measured for another manifest: not this corpus's counts
    packages = packages_of(manifest)
    return PendingBuild(
        name,
        folder,
        len(packages),
        sum(p.bytes for p in packages),
        expected.get("text_bytes"),
        expected.get("tokens", {}),
    )


def say_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _download_all(name: str, packages: list[Package], downloads: Path, fetch: Fetch, say: Say) -> list[Path]:
    downloads.mkdir(parents=True, exist_ok=True)
    total = sum(p.bytes for p in packages)
    done = 0
    paths = []
    for i, package in enumerate(packages, 1):
        path = downloads / package.file
        if path.is_file() and sha256_of(path) != package.sha256:
            path.unlink()  # not the pinned file (the manifest changed under it): fetch it again
        state = "kept" if path.is_file() else "downloading"
        say(
            f"{name}: {state} {i}/{len(packages)} {package.file} ({package.bytes / 1e6:.1f} MB; "
            f"{done / 1e6:.0f} of {total / 1e6:.0f} MB before it)"
        )
        if state == "downloading":
            _fetch_verified(package, downloads, fetch)
        done += package.bytes
        paths.append(path)
    return paths


def _fetch_verified(package: Package, downloads: Path, fetch: Fetch) -> None:
    """Fetch into a fresh folder, check the pin, then move the archive beside the others in one rename."""
    incoming = downloads.parent / "incoming"
    shutil.rmtree(incoming, ignore_errors=True)
    incoming.mkdir()
    try:
        got = Path(fetch(package, incoming))
        if not got.is_file():
            raise UserError(
                f"data.source: fetching {package.name}=={package.version} gave no {package.file}; "
                "the index serves it under another name"
            )
        digest = sha256_of(got)
        if digest != package.sha256:
            raise UserError(
                f"data.source: {package.file} has sha256 {digest}, but the corpus manifest pins "
                f"{package.sha256}; the index served a different file, so the corpus would not be the same"
            )
        os.replace(got, downloads / package.file)
    finally:
        shutil.rmtree(incoming, ignore_errors=True)


def _extract_all(packages: list[Package], archives: list[Path], include: dict, out: Path) -> list[dict]:
    """One `<archive>.jsonl` per package; a file whose bytes an earlier one had is skipped (vendored copies)."""
    seen: set[bytes] = set()
    counts = []
    for package, archive in zip(packages, archives, strict=True):
        n = size = 0
        with open(out / f"{package.stem}.jsonl", "w", encoding="utf-8") as f:
            for path, data in _members(archive, lambda path, size: _wanted(path, size, include)):
                digest = hashlib.sha256(data).digest()
                try:
                    text = data.decode("utf-8")
                except UnicodeDecodeError:
                    continue
                if digest in seen or not text.strip():
                    continue
                seen.add(digest)
                f.write(json.dumps({"path": path, "text": text}, ensure_ascii=False) + "\n")
                n, size = n + 1, size + len(data)
        counts.append({"documents": n, "bytes": size})
    return counts


def _wanted(path: str, size: int, include: dict) -> bool:
    lower = "/" + path.lower()
    return (
        0 < size <= include["max_file_bytes"]
        and lower.endswith(tuple(include["suffixes"]))
        and not any(skip.lower() in lower for skip in include["skip"])
    )


def _members(archive: Path, wanted: Callable[[str, int], bool]) -> list[tuple[str, bytes]]:
    """(path, bytes) of the wanted regular files of a .tar.* or .zip, sorted by path: archives differ in
    member order, the corpus must not. Read in the archive's own order (a compressed tar cannot seek)."""
    found = []
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as z:
            for info in z.infolist():
                if not info.is_dir() and wanted(info.filename, info.file_size):
                    found.append((info.filename, z.read(info)))
    else:
        with tarfile.open(archive) as t:
            for m in t:
                if m.isfile() and wanted(m.name, m.size) and (f := t.extractfile(m)) is not None:
                    found.append((m.name, f.read()))
    return sorted(found, key=lambda item: item[0])
