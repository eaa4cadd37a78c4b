"""`ablate export` end to end: a real sweep (Trainer, Optuna journal, MLflow store) of the mini recipe, each
finished run written as a transformers folder through the command line, loaded offline by `transformers` and
held to the run's own checkpoint; its MLflow run links the folder; a run that does not exist is one line."""

from __future__ import annotations

import json

import pytest
import torch
from mini_project import one_line_refusal, sweep_argv, write_recipe

pytest.importorskip("transformers")
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from ablate.cli import main  # noqa: E402
from ablate.data.tokenizers import ByteTokenizer  # noqa: E402
from ablate.probes.run import load_model  # noqa: E402
from ablate.recipe.loading import load_recipe  # noqa: E402
from ablate.store import names  # noqa: E402
from ablate.store.stores import Stores  # noqa: E402

SHORT = {"base__train__steps": 4, "base__train__val_every": 2}


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(name, "1")
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")


@pytest.mark.slow
def test_a_swept_run_exports_and_loads_in_transformers(tmp_path, capsys):
    recipe = write_recipe(tmp_path, **SHORT)
    assert main(sweep_argv(recipe, tmp_path)) == 0
    ws = ["--workspace", str(tmp_path / "ws")]
    stores = Stores(tmp_path / "ws")
    specs = _finished(recipe, stores)
    expected = {"transformer": ("LlamaForCausalLM", False), "diff": ("DiffLlamaForCausalLM", False)}
    for variant, (architecture, remote) in expected.items():
        out = tmp_path / f"hf-{variant}"
        capsys.readouterr()
        assert main(["export", str(recipe), "--run", f"{variant}-s0", "--out", str(out), *ws]) == 0
        assert architecture in capsys.readouterr().out
        config = json.loads((out / "config.json").read_text())
        assert config["architectures"] == [architecture]
        record = json.loads((out / "ablate_export.json").read_text())
        client = stores.client()
        tags = client.get_run(record["mlflow_run_id"]).data.tags
        assert tags[names.HF_EXPORT] == str(out.resolve())
        assert tags[names.HF_EXPORT_CLASS] == architecture
        ours = load_model(specs[f"{variant}-s0"], stores.workspace, "best")
        hf = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=remote).eval()
        tok = AutoTokenizer.from_pretrained(out)
        text = "def w1 ( w2 ) :\n return self"
        ids = tok.encode(text)
        assert ids == ByteTokenizer().encode(text).tolist()
        tokens = torch.tensor([ids])
        with torch.no_grad():
            assert (ours(tokens) - hf(tokens).logits).abs().max().item() < 1e-5

    capsys.readouterr()
    code = main(["export", str(recipe), "--run", "nope-s0", "--out", str(tmp_path / "x"), *ws])
    one_line_refusal(capsys, code, "--run", "nope-s0", "transformer-s0")
    assert not (tmp_path / "x").exists()


def _finished(recipe, stores):
    """run name -> RunSpec of the sweep's finished runs, read as every verb reads them."""
    from ablate.probes.run import finished_runs
    from ablate.store.study import finished_sweep

    loaded = load_recipe(str(recipe), [])
    ctx, study, client = finished_sweep(loaded, loaded.scale, stores, "test")
    return {spec.name: spec for spec, _ in finished_runs(ctx, study, client)[0]}
