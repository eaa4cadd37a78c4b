"""ablate's model in LM Eval Harness (ablate.hf.harness) and the downstream table (ablate.hf.downstream_table).

Two independent paths agree: ablate's harness model (ablate's DecoderLM and tokenizer) and the harness's own
`hf` model on the exported folder (transformers' Llama and the exported tokenizer.json) give the same
log-likelihoods and the same acc on a small multiple-choice task this test writes in the harness's format.
The gold answer's bits per byte is held to a float64 computation written here; the table's paired
differences and Holm to scipy's paired t-test and Holm's rule written out."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("lm_eval")
pytest.importorskip("accelerate")

from ablate.data.tokenizers import EOD_TEXT, ByteTokenizer  # noqa: E402
from ablate.hf.downstream import DownstreamSettings, load_tasks, score  # noqa: E402
from ablate.hf.downstream_table import table_rows, write_table  # noqa: E402
from ablate.hf.export import export_model  # noqa: E402
from ablate.hf.tokenizer import byte_tokenizer  # noqa: E402
from ablate.model.decoder import build_model  # noqa: E402


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(name, "1")
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))


def write_task(folder: Path, name: str = "tiny_mc", n: int = 10, seed: int = 0) -> Path:
    """A multiple-choice task in the harness's format: a YAML and its local JSON lines (sums to pick)."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for _ in range(n):
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        choices = [str(a + b), str(a + b + 1), str(a * b + 3)]
        rng.shuffle(choices)
        rows.append(
            {"question": f"Q: {a} plus {b}?\nA:", "choices": choices, "label": choices.index(str(a + b))}
        )
    data = folder / f"{name}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / f"{name}.yaml").write_text(
        f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
        "test_split: test\noutput_type: multiple_choice\n"
        'doc_to_text: "{{question}}"\ndoc_to_choice: "{{choices}}"\ndoc_to_target: "{{label}}"\n'
        "metric_list:\n  - metric: acc\n  - metric: acc_norm\n"
    )
    return folder


def _model(seed: int = 0, attention: str = "softmax"):
    cfg = {
        "vocab_size": 257, "d_model": 32, "n_layers": 2, "head_dim": 4, "attention": attention,
        "attention_backend": "math", "zero_init_residual": False,
    }  # fmt: skip
    return build_model(cfg, seed=seed).eval()


def _evaluate(lm, manager, task: str = "tiny_mc"):
    import lm_eval

    out = lm_eval.simple_evaluate(
        model=lm, tasks=[task], task_manager=manager, log_samples=True, bootstrap_iters=0, verbosity="ERROR"
    )
    return out["results"][task], out["samples"][task]


@pytest.mark.parametrize("attention", ["softmax", "diff"])  # Llama and DiffLlama in the harness's hf model
def test_ablates_harness_model_and_the_harness_hf_model_agree(tmp_path, attention):
    from lm_eval.models.huggingface import HFLM

    from ablate.hf.harness import AblateLM

    model = _model(attention=attention)
    export_model(model, tmp_path / "hf", tokenizer=byte_tokenizer(), eos=EOD_TEXT, max_positions=128)
    manager = load_tasks(
        DownstreamSettings(tasks=("tiny_mc",), task_folder=str(write_task(tmp_path / "tasks")))
    )
    ours, our_samples = _evaluate(AblateLM(model, ByteTokenizer(), max_length=128, batch_size=3), manager)
    hf = HFLM(pretrained=str(tmp_path / "hf"), dtype="float32", device="cpu", batch_size=2)
    theirs, their_samples = _evaluate(hf, manager)
    lls = [
        (a[0][0], b[0][0]) for s, t in zip(our_samples, their_samples) for a, b in zip(s["resps"], t["resps"])
    ]
    assert len(lls) == 30
    assert max(abs(a - b) for a, b in lls) < 1e-5
    assert len({round(a, 3) for a, _ in lls}) > 10  # distinct scores: the comparison can fail
    assert ours["acc,none"] == theirs["acc,none"] and ours["acc_norm,none"] == theirs["acc_norm,none"]


def test_the_gold_answers_bits_per_byte_is_its_log_likelihood_over_its_bytes(tmp_path):
    model = _model(seed=1)
    folder = write_task(tmp_path / "tasks", n=6, seed=2)
    settings = DownstreamSettings(tasks=("tiny_mc",), task_folder=str(folder))
    scores = score(model, ByteTokenizer(), 128, load_tasks(settings), settings)["tiny_mc"]
    bits = nbytes = 0.0
    for line in (folder / "tiny_mc.jsonl").read_text().splitlines():
        doc = json.loads(line)
        context, gold = doc["question"].encode(), (" " + doc["choices"][doc["label"]]).encode()
        tokens = torch.tensor([list(context + gold)])
        with torch.no_grad():
            logp = torch.log_softmax(model(tokens[:, :-1]).double(), dim=-1)[0]
        targets = tokens[0, len(context) :]
        bits -= logp[len(context) - 1 :].gather(1, targets[:, None]).sum().item() / math.log(2)
        nbytes += len(gold)
    assert scores["bpb"] == pytest.approx(bits / nbytes, rel=1e-5)
    assert scores["chance"] == pytest.approx(1 / 3) and scores["documents"] == 6
    assert 0.0 <= scores["acc"] <= 1.0


def test_figure_8_scores_the_tasks_again_with_quantized_attention_logits(tmp_path):
    model = _model(seed=4)
    with torch.no_grad():  # sharp attention maps, whose logits 2 bits cannot hold
        for block in model.blocks:
            block.attention.q_proj.weight.mul_(10)
            block.attention.k_proj.weight.mul_(10)
    folder = write_task(tmp_path / "tasks", n=12, seed=3)
    settings = DownstreamSettings(tasks=("tiny_mc",), task_folder=str(folder), logit_bits=(15, 2))
    scores = score(model, ByteTokenizer(), 128, load_tasks(settings), settings)["tiny_mc"]
    assert scores["acc_bits_15"] == scores["acc"] and scores["acc_norm_bits_15"] == scores["acc_norm"]
    import lm_eval

    from ablate.hf.harness import AblateLM
    from ablate.probes.capture import route_attention
    from ablate.probes.quantization import absmax_quantize

    def gold_lls(transform):
        lm = AblateLM(model, ByteTokenizer(), max_length=128)
        with torch.inference_mode(), route_attention(model, logit_transform=transform):
            out = lm_eval.simple_evaluate(
                model=lm,
                tasks=["tiny_mc"],
                task_manager=load_tasks(settings),
                log_samples=True,
                bootstrap_iters=0,
                verbosity="ERROR",
            )
        return [s["filtered_resps"][int(s["target"])][0] for s in out["samples"]["tiny_mc"]]  # fmt: skip

    plain, two_bits = gold_lls(None), gold_lls(lambda t: absmax_quantize(t, 2))
    assert max(abs(a - b) for a, b in zip(plain, two_bits)) > 1e-2  # 2-bit logits change what the model says
    assert 0.0 <= scores["acc_bits_2"] <= 1.0
    rows = table_rows([(_run("base", 0), 0, {"tiny_mc": scores})], ["base"], {})
    assert [r["metric"] for r in rows] == [
        "acc",
        "acc_norm",
        "bpb",
        "acc_bits_15",
        "acc_norm_bits_15",
        "acc_bits_2",
        "acc_norm_bits_2",
    ]


def _run(variant: str, seed: int):
    return SimpleNamespace(variant=variant, seed=seed, label=variant.title())


def test_the_table_pairs_seeds_with_the_reference_and_corrects_across_tasks_by_holm(tmp_path):
    from scipy import stats as st

    rng = random.Random(0)
    tasks = [f"t{i}" for i in range(4)]
    seeds = [0, 1, 2, 3]
    values = {
        (v, s, t): (0.30 + 0.5 * (v == "diff") * (t != "t3") + 0.05 * rng.random(), 1.5 - 0.1 * (v == "diff") + 0.01 * rng.random())
        for v in ("base", "diff") for s in seeds for t in tasks
    }  # fmt: skip
    scored = [
        (_run(v, s), 1024, {t: {"acc": values[v, s, t][0], "acc_norm": values[v, s, t][0], "bpb": values[v, s, t][1],
                          "chance": 0.25, "documents": 400} for t in tasks})
        for v in ("base", "diff") for s in seeds
    ]  # fmt: skip
    rows = table_rows(scored, ["base", "diff"], {"base": "Base", "diff": "Diff"})
    got = {(r["task"], r["metric"], r["variant"]): r for r in rows}
    assert {r["tokens"] for r in rows} == {1024}
    p_values = []
    for t in tasks:
        a = [values["diff", s, t][0] for s in seeds]
        b = [values["base", s, t][0] for s in seeds]
        r = got[(t, "acc", "diff")]
        assert r["diff_vs_first"] == pytest.approx(sum(x - y for x, y in zip(a, b)) / 4)
        assert r["p_value"] == pytest.approx(st.ttest_rel(a, b).pvalue)
        p_values.append(r["p_value"])
    # Holm written out: the k-th smallest p against alpha / (m - k), stopping at the first that fails
    survives, stopped = {}, False
    for k, (p, t) in enumerate(sorted(zip(p_values, tasks))):
        stopped = stopped or p > 0.05 / (4 - k)
        survives[t] = "false" if stopped else "true"
    assert {t: got[(t, "acc", "diff")]["holm_survives"] for t in tasks} == survives
    assert survives["t0"] == "true" and survives["t3"] == "false"
    # the base row sits near chance (0.25 of 4 choices at N = 1600 documents: ±0.021); the diff rows do not
    assert got[("t0", "acc", "diff")]["within_chance"] == "false"
    csv_path, md_path = write_table(rows, tmp_path, DownstreamSettings())
    assert csv_path.read_text().splitlines()[0].startswith("task,metric,tokens,variant,label,seeds,mean")
    assert "Rows by bits per byte" in md_path.read_text() and "Diff 1.4" in md_path.read_text()


def test_accuracies_within_chance_rank_nothing_and_the_page_says_so(tmp_path):
    scored = [
        (_run(v, s), 1024, {"t": {"acc": 0.25 + 0.01 * s * (v == "diff"), "acc_norm": 0.26, "bpb": 2.0 - 0.1 * (v == "diff") - 0.01 * s,
                            "chance": 0.25, "documents": 100}})
        for v in ("base", "diff") for s in (0, 1, 2)
    ]  # fmt: skip
    rows = table_rows(scored, ["base", "diff"], {"base": "Base", "diff": "Diff"})
    accs = [r for r in rows if r["metric"] in ("acc", "acc_norm")]
    assert all(r["within_chance"] == "true" for r in accs)
    assert all(r["holm_survives"] == "chance" for r in accs if r["variant"] == "diff")
    bpb = next(r for r in rows if r["metric"] == "bpb" and r["variant"] == "diff")
    assert bpb["holm_survives"] in ("true", "false") and bpb["diff_vs_first"] < 0
    _, md = write_table(rows, tmp_path, DownstreamSettings())
    text = md.read_text()
    assert "Every accuracy here is within its interval of chance" in text
    assert text.index("Diff 1.890") < text.index("Base 1.990")  # bits per byte still orders the rows
