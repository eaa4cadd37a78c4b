"""The built-in download corpus (`ablate.data.builtin_corpus`), built from small local archives.

Everything runs through the same code as a real build except the download: `fetch` copies the archive
the test wrote instead of asking pip (tests have no network). Checked: two builds in two cache folders
give the same fingerprint and token counts; the extraction rule (suffixes, skips, size cap, UTF-8,
duplicates) against a list the test derives itself; a download whose sha256 differs from the pin is
refused in one line and nothing is published; a killed build resumes with the archives it had.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
import tarfile
import zipfile
from pathlib import Path

import pytest

from ablate.core.errors import UserError
from ablate.core.workspace import Workspace
from ablate.data import builtin_corpus as bc
from ablate.data.config import DataConfig
from ablate.data.corpus import build_builtin, count_tokens, open_text_corpus
from ablate.data.tokenizers import ByteTokenizer
from ablate.data.tokens import load_tokens

NAME = "pypi-sdists"
INCLUDE = {"suffixes": [".py", ".rst", ".txt"], "skip": [".egg-info/", "/PKG-INFO"], "max_file_bytes": 4000}
PROSE = "The quick brown fox jumps over the lazy dog while the compiler reads its tokens. "


def _files_a() -> dict[str, bytes]:
    files = {
        f"alpha-1.0/alpha/mod{i}.py": f"def f{i}(x):\n    return x + {i}  # {PROSE}\n".encode()
        for i in range(12)
    }
    files.update(
        {
            f"alpha-1.0/docs/page{i}.rst": f"Page {i}\n=======\n\n{PROSE * (i + 1)}\n".encode()
            for i in range(8)
        }
    )
    files["alpha-1.0/alpha/vendored_six.py"] = b"# the same bytes in both archives\nX = 1\n"
    files["alpha-1.0/alpha.egg-info/SOURCES.txt"] = b"alpha/mod0.py\n"  # skipped: egg-info
    files["alpha-1.0/PKG-INFO"] = b"Metadata-Version: 2.1\nName: alpha\n"  # skipped: PKG-INFO
    files["alpha-1.0/logo.png"] = b"\x89PNG not text"  # skipped: suffix
    files["alpha-1.0/big.txt"] = b"x" * 5000  # skipped: over max_file_bytes
    files["alpha-1.0/latin1.txt"] = "caf\xe9".encode("latin-1")  # skipped: not UTF-8
    files["alpha-1.0/empty.py"] = b""  # skipped: empty
    return files


def _files_b() -> dict[str, bytes]:
    files = {f"beta-2.0/beta/b{i}.py": f"class B{i}:\n    '''{PROSE}'''\n".encode() for i in range(10)}
    files["beta-2.0/README.txt"] = ("Beta: " + PROSE * 3 + "\u00e9t\u00e9 \u2014 \u4e2d\u6587\n").encode()
    files["beta-2.0/beta/six.py"] = b"# the same bytes in both archives\nX = 1\n"  # a duplicate of alpha's
    return files


def _tar_gz(path: Path, files: dict[str, bytes]) -> None:
    with tarfile.open(path, "w:gz") as t:
        for name in reversed(sorted(files)):  # not sorted: the build sorts
            info = tarfile.TarInfo(name)
            info.size = len(files[name])
            t.addfile(info, io.BytesIO(files[name]))


def _zip(path: Path, files: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w") as z:
        for name in reversed(sorted(files)):
            z.writestr(name, files[name])


@pytest.fixture
def archives(tmp_path: Path) -> tuple[Path, Path]:
    """A folder of two archives (a .tar.gz and a .zip) and a manifest pinning them."""
    src = tmp_path / "index"
    src.mkdir()
    _tar_gz(src / "alpha-1.0.tar.gz", _files_a())
    _zip(src / "beta-2.0.zip", _files_b())
    packages = [
        {
            "name": name,
            "version": version,
            "file": file,
            "bytes": (src / file).stat().st_size,
            "sha256": hashlib.sha256((src / file).read_bytes()).hexdigest(),
            "license": "MIT",
        }
        for name, version, file in (("alpha", "1.0", "alpha-1.0.tar.gz"), ("beta", "2.0", "beta-2.0.zip"))
    ]
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"name": NAME, "format": 1, "include": INCLUDE, "packages": packages}))
    return src, manifest


def copy_from(src: Path, log: list[str] | None = None):
    """A fetch that copies the archive from a local folder (the download step's stand-in)."""

    def fetch(package: bc.Package, dest: Path) -> Path:
        if log is not None:
            log.append(package.file)
        return Path(shutil.copy(src / package.file, dest / package.file))

    return fetch


def _build(manifest: Path, root: Path, fetch, lines: list[str] | None = None) -> Path:
    say = lines.append if lines is not None else lambda line: None
    return build_builtin(NAME, manifest_path=manifest, root=root, fetch=fetch, say=say)


def _record(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())


def test_two_builds_give_the_same_corpus_and_fingerprint(archives, tmp_path):
    src, manifest = archives
    lines: list[str] = []
    one = _build(manifest, tmp_path / "cache1", copy_from(src), lines)
    two = _build(manifest, tmp_path / "cache2", copy_from(src))
    a, b = _record(one), _record(two)
    assert one.name == two.name == f"{NAME}-{bc.manifest_hash(json.loads(manifest.read_text()))}"
    assert a["fingerprint"] == b["fingerprint"] and a["tokens"] == b["tokens"]
    assert a["fingerprint"]["source"] == NAME and len(a["fingerprint"]["sha256"]) == 64
    for f in (one / "documents").iterdir():
        assert f.read_bytes() == (two / "documents" / f.name).read_bytes()
    assert not list(tmp_path.glob("cache*/.*partial"))  # the work folder is gone once published
    assert any("downloading 1/2 alpha-1.0.tar.gz" in line for line in lines)
    assert any("extracting" in line for line in lines) and any("counting bpe-2048" in line for line in lines)

    # the documents: what the test's own reading of the rule keeps, in path order, the duplicate once
    expected_a = {
        k: v
        for k, v in _files_a().items()
        if k.endswith((".py", ".rst", ".txt"))
        and ".egg-info/" not in k
        and 0 < len(v) <= 4000
        and k != "alpha-1.0/latin1.txt"
    }
    expected_b = {k: v for k, v in _files_b().items() if k != "beta-2.0/beta/six.py"}
    for stem, expected in (("alpha-1.0", expected_a), ("beta-2.0", expected_b)):
        records = [
            json.loads(line) for line in (one / "documents" / f"{stem}.jsonl").read_text().splitlines()
        ]
        assert [r["path"] for r in records] == sorted(expected)
        assert [r["text"].encode() for r in records] == [expected[k] for k in sorted(expected)]
    assert a["documents"] == len(expected_a) + len(expected_b)
    assert a["bytes"] == sum(map(len, expected_a.values())) + sum(map(len, expected_b.values()))
    assert [p["documents"] for p in a["packages"]] == [len(expected_a), len(expected_b)]

    # opening it as data.source gives that fingerprint; a rebuild call finds it built and fetches nothing
    log: list[str] = []
    assert _build(manifest, tmp_path / "cache1", copy_from(src, log)) == one and log == []


def test_data_source_opens_the_built_corpus_and_its_token_counts_match_load_tokens(
    archives, tmp_path, monkeypatch
):
    src, manifest = archives
    monkeypatch.setitem(bc.BUILTIN_CORPORA, NAME, manifest)
    monkeypatch.setenv(bc.CORPORA_ENV, str(tmp_path / "corpora"))
    folder = _build(manifest, tmp_path / "corpora", copy_from(src))
    record = _record(folder)
    corpus = open_text_corpus(DataConfig(source=NAME))
    assert corpus.fingerprint == record["fingerprint"]
    assert corpus.n_documents("val") >= 1 and corpus.n_documents("train") >= 1
    data = load_tokens(
        {"source": NAME, "tokenizer": {"name": "bpe", "vocab_size": 2048}}, Workspace(tmp_path / "ws")
    )
    counts = record["tokens"]["bpe-2048"]
    assert (len(data.train), len(data.val)) == (counts["train"], counts["val"])
    assert data.fingerprint == record["fingerprint"]


def test_count_tokens_against_the_utf8_bytes(archives, tmp_path, monkeypatch):
    src, manifest = archives
    monkeypatch.setitem(bc.BUILTIN_CORPORA, NAME, manifest)
    monkeypatch.setenv(bc.CORPORA_ENV, str(tmp_path / "corpora"))
    _build(manifest, tmp_path / "corpora", copy_from(src))
    corpus = open_text_corpus(DataConfig(source=NAME, val_fraction=0.3))
    counts = count_tokens(corpus, ByteTokenizer())
    for split in ("train", "val"):  # bytes tokenizer: one token per UTF-8 byte, one end-of-document each
        docs = list(corpus.documents(split))
        assert counts[split] == sum(len(d.encode()) for d in docs) + len(docs)
    assert counts["val_fraction"] == 0.3


def test_a_download_with_another_hash_is_refused_in_one_line(archives, tmp_path):
    src, manifest = archives
    spec = json.loads(manifest.read_text())
    spec["packages"][1]["sha256"] = "0" * 64
    manifest.write_text(json.dumps(spec))
    with pytest.raises(UserError) as e:
        _build(manifest, tmp_path / "cache", copy_from(src))
    msg = str(e.value)
    assert "\n" not in msg and "beta-2.0.zip" in msg and "0" * 64 in msg
    assert hashlib.sha256((src / "beta-2.0.zip").read_bytes()).hexdigest() in msg
    folder = bc.corpus_folder(NAME, spec, tmp_path / "cache")
    assert not folder.exists()
    downloads = folder.parent / f".{folder.name}.partial" / "downloads"
    assert sorted(p.name for p in downloads.iterdir()) == ["alpha-1.0.tar.gz"]  # the good one kept


def test_a_killed_build_resumes_with_the_archives_it_had(archives, tmp_path):
    src, manifest = archives
    clean = _record(_build(manifest, tmp_path / "clean", copy_from(src)))

    def dies_on_beta(package: bc.Package, dest: Path) -> Path:
        if package.name == "beta":
            (dest / package.file).write_bytes(b"half a zip")  # what a killed download leaves
            raise KeyboardInterrupt
        return copy_from(src)(package, dest)

    with pytest.raises(KeyboardInterrupt):
        _build(manifest, tmp_path / "cache", dies_on_beta)
    spec = json.loads(manifest.read_text())
    folder = bc.corpus_folder(NAME, spec, tmp_path / "cache")
    assert not folder.exists()  # nothing published: a later open builds, never reads half a corpus
    log: list[str] = []
    lines: list[str] = []
    resumed = _record(_build(manifest, tmp_path / "cache", copy_from(src, log), lines))
    assert log == ["beta-2.0.zip"]  # alpha was kept, not fetched again
    assert any("kept 1/2 alpha-1.0.tar.gz" in line for line in lines)
    assert resumed["fingerprint"] == clean["fingerprint"] and resumed["tokens"] == clean["tokens"]


def test_a_half_extracted_build_is_redone(archives, tmp_path):
    """A build killed after its downloads, mid-extraction, leaves a staging folder: the next build
    replaces it and publishes the same corpus."""
    src, manifest = archives
    spec = json.loads(manifest.read_text())
    folder = bc.corpus_folder(NAME, spec, tmp_path / "cache")
    staging = folder.parent / f".{folder.name}.partial" / "build" / "documents"
    staging.mkdir(parents=True)
    (staging / "alpha-1.0.jsonl").write_text('{"path": "half", "text": "a half-written')
    clean = _record(_build(manifest, tmp_path / "clean", copy_from(src)))
    assert (
        _record(_build(manifest, tmp_path / "cache", copy_from(src)))["fingerprint"] == clean["fingerprint"]
    )


def test_the_shipped_manifest_pins_every_archive():
    spec = bc.load_manifest(bc.BUILTIN_CORPORA[NAME])
    packages = bc.packages_of(spec)
    assert len({p.name.lower() for p in packages}) == len(packages) == len({p.file for p in packages})
    for p in packages:
        assert re.fullmatch(r"[0-9a-f]{64}", p.sha256), p
        assert p.file.endswith(".tar.gz") and p.version in p.file and p.bytes > 0 and p.license
    assert set(spec["include"]) == {"suffixes", "skip", "max_file_bytes"}
    assert sum(p.bytes for p in packages) < 300e6  # a moderate download


def test_prepare_builds_a_builtin_corpus_by_name(archives, tmp_path, monkeypatch, capsys):
    from ablate.cli import main

    src, manifest = archives
    monkeypatch.setitem(bc.BUILTIN_CORPORA, NAME, manifest)
    monkeypatch.setenv(bc.CORPORA_ENV, str(tmp_path / "corpora"))
    folder = _build(manifest, tmp_path / "corpora", copy_from(src))  # built here: prepare must not download
    assert main(["prepare", NAME]) == 0
    assert capsys.readouterr().out.strip() == str(folder)
    assert _record(folder)["tokens"]["bpe-2048"]["train"] > 0


def test_prepare_of_a_recipe_without_out_is_one_line(tmp_path, capsys):
    from ablate.cli import main

    assert main(["prepare", str(tmp_path / "recipe.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--out: missing" in err
