"""`ablate check` of a recipe on a built-in corpus not built here counts its passes from the counts earlier
builds of the same manifest measured, and says what a run will download and build, with its size, before
anything starts: it downloads, unpacks and tokenizes nothing (ablate.data.builtin_corpus.pending_build)."""

from __future__ import annotations

import json

from mini_project import write_recipe

from ablate.cli import main
from ablate.data import builtin_corpus as bc


def test_check_counts_an_unbuilt_corpus_from_its_manifest_and_downloads_nothing(
    tmp_path, capsys, monkeypatch
):
    cache = tmp_path / "corpora"
    monkeypatch.setenv(bc.CORPORA_ENV, str(cache))
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_INDEX_URL", (tmp_path / "no-index").as_uri())  # a download would fail loudly
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    recipe = write_recipe(
        tmp_path,
        base__data__source="pypi-sdists",
        base__data__tokenizer={"name": "bpe", "vocab_size": 2048},
        base__model__vocab_size=2048,
        base__data__val_fraction=0.05,
    )
    capsys.readouterr()
    assert main(["check", str(recipe), "--workspace", str(tmp_path / "ws")]) == 0
    out = capsys.readouterr().out
    (line,) = [line for line in out.splitlines() if line.startswith("data: pypi-sdists")]
    expected = json.loads(bc.EXPECTED["pypi-sdists"].read_text())
    manifest = bc.load_manifest(bc.BUILTIN_CORPORA["pypi-sdists"])
    assert expected["manifest_sha256"] == bc.manifest_hash(manifest)  # the counts are this manifest's
    megabytes = sum(p["bytes"] for p in manifest["packages"]) / 1e6
    assert f"downloads {megabytes:.1f} MB (21 archives), unpacks about 514 MB of text" in line, line
    assert "164M" in line and "under bpe-2048" in line, line  # the training split, from the counts
    assert not cache.exists() or not any(cache.iterdir())  # nothing downloaded, unpacked or locked
    # another split than the one measured: passes not counted, and still what a run downloads first
    recipe = write_recipe(tmp_path, base__data__source="pypi-sdists", base__data__val_fraction=0.2)
    assert main(["check", str(recipe), "--workspace", str(tmp_path / "ws")]) == 0
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("data: pypi-sdists")]
    assert "passes not counted (no measured count under byte at val_fraction 0.2)" in line, line
    assert "downloads 159.5 MB" in line and (not cache.exists() or not any(cache.iterdir()))
