"""Tasks (kind `task`): the generators' promises, checked by reading the tokens back independently."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ablate.core import registry
from ablate.core.errors import UserError
from ablate.data.task_batches import TaskTrainBatches, TaskValBatches, build_task, check_fits, collate
from ablate.data.tasks import PAD, Task
from ablate.data.tasks.mqar import MQAR
from ablate.data.tasks.multi_needle import BOS, IS, NEEDLE, QUERY, MultiNeedle
from ablate.train.metrics import task_summary, task_sums

LEVELS = [[1, 1], [2, 2], [4, 2], [6, 2]]


def _task(**kw) -> MultiNeedle:
    return MultiNeedle(**{"levels": LEVELS, "lengths": [160, 320], **kw})


def _parse(task: MultiNeedle, tokens: np.ndarray):
    """Read a multi-needle sample back from its tokens alone: needles (start, key, value) and queries."""
    k, v = task.key_len, task.value_len
    needles, queries = [], []
    for i, t in enumerate(tokens):
        if t in (NEEDLE, QUERY):
            assert tokens[i + 1 + k] == IS
            entry = (i, tuple(tokens[i + 1 : i + 1 + k]), tuple(tokens[i + 2 + k : i + 2 + k + v]))
            (needles if t == NEEDLE else queries).append(entry)
    return needles, queries


def test_registered_and_built_from_a_recipe_spec():
    registry.load_plugins()
    assert registry.get("task", "multi_needle") is MultiNeedle and registry.get("task", "mqar") is MQAR
    task = build_task({"task": {"name": "multi_needle", "n_needles": 6, "n_queries": 2, "lengths": [256]}})
    assert task.cells()[0] == {"level": "N6R2", "depth": 0, "length": 256} and len(task.cells()) == 5


@pytest.mark.parametrize("index", range(0, 80, 3))
def test_answer_needle_at_the_stated_depth_within_one_needle(index):
    task = _task()
    s = task.held_out_sample(index)
    needles, queries = _parse(task, s.tokens)
    n, r = (int(x) for x in s.tags["level"][1:].split("R"))
    assert len(needles) == n and len(queries) == r and len(s.tokens) == s.tags["length"]
    haystack = s.context[1] - s.context[0]
    expected = s.context[0] + s.tags["depth"] / 100 * haystack  # depth as a fraction of the context
    start = s.needle_spans[0][0]  # needle_spans[0] is the needle the cell's depth places
    assert abs(start - expected) <= task.needle_len
    assert s.context[0] <= start and s.needle_spans[0][1] <= s.context[1]
    # ... and it is a queried needle: its key is asked for at the end.
    answer_key = next(key for at, key, _ in needles if at == start)
    assert answer_key in [key for _, key, _ in queries]


def test_keys_unique_needles_apart_and_answers_only_in_the_context():
    task = _task()
    for i in range(60):
        s = task.train_sample(3, i)
        needles, queries = _parse(task, s.tokens)
        keys = [key for _, key, _ in needles]
        assert len(set(keys)) == len(keys)  # keys unique within a sample
        starts = sorted(at for at, _, _ in needles)
        assert all(b - a >= task.needle_len for a, b in zip(starts, starts[1:]))  # needles never overlap
        value_of = {key: value for _, key, value in needles}
        answers = s.tokens[s.answer_positions]
        expected = np.concatenate([value_of[key] for _, key, _ in queries])
        assert np.array_equal(answers, expected)  # the answer is the value its needle holds
        for (a, b), p in zip(s.answer_spans, s.answer_positions):
            assert s.tokens[p] in s.tokens[a:b]  # every answer token's span holds it
        assert s.tokens[0] == BOS and PAD not in s.tokens
        # value tokens appear only in needles and answers: the filler cannot give them away
        is_value = (s.tokens >= task.value_base) & (s.tokens < task.filler_base)
        assert is_value.sum() == task.value_len * (len(needles) + len(queries))


def test_no_key_to_value_mapping_to_memorise():
    """Answers are recoverable only from the context: across samples a key's value is a fresh draw."""
    task = MultiNeedle(n_needles=6, n_queries=2, lengths=[256], n_key_tokens=8, key_len=1)  # 8 keys, reused
    values: dict[tuple, set] = {}
    for i in range(200):
        needles, _ = _parse(task, task.train_sample(0, i).tokens)
        for _, key, value in needles:
            values.setdefault(key, set()).add(value)
    # 1000 possible values, ~150 draws per key: a fixed mapping would give one value per key.
    assert all(len(v) > 100 for v in values.values())


def test_held_out_never_in_the_train_stream():
    # 12 possible samples (3 keys x 4 values, queried at once): without the split the streams would meet.
    task = MQAR(vocab_size=8, settings=[[4, 1]])
    held_out = {task.held_out_sample(i).tokens.tobytes() for i in range(200)}
    train = {task.train_sample(seed, i).tokens.tobytes() for seed in range(3) for i in range(200)}
    assert held_out and train and not held_out & train
    assert len(held_out | train) == 12  # and between them they cover the whole space
    big = _task()
    held = {big.held_out_sample(i).tokens.tobytes() for i in range(100)}
    assert not held & {big.train_sample(s, i).tokens.tobytes() for s in range(2) for i in range(200)}


def test_samples_depend_on_seed_and_index_only():
    a, b = _task(), _task()
    assert np.array_equal(a.train_sample(5, 17).tokens, b.train_sample(5, 17).tokens)
    assert not np.array_equal(a.train_sample(5, 17).tokens, a.train_sample(6, 17).tokens)
    assert np.array_equal(a.held_out_sample(4).tokens, b.held_out_sample(4).tokens)
    first = TaskTrainBatches(a, seq_len=320, micro_batch_size=4, seed=2).batch(3)
    again = next(iter(TaskTrainBatches(b, seq_len=320, micro_batch_size=4, seed=2, start=3)))
    assert torch.equal(first["tokens"], again["tokens"])  # a resumed stream continues where it stopped


def test_held_out_is_a_balanced_grid():
    task = _task()
    cells = [task.held_out_sample(i).tags for i in range(2 * len(task.cells()))]
    assert cells == task.cells() * 2


def test_mqar_layout_and_power_law():
    task = MQAR(vocab_size=512, settings=[[128, 8], [64, 4]])
    half = 256
    for i in range(40):
        s = task.train_sample(0, i)
        pairs, length = s.tags["pairs"], s.tags["length"]
        kv = s.tokens[: 2 * pairs]
        keys, values = kv[0::2], kv[1::2]
        assert ((keys >= 1) & (keys < half)).all() and ((values >= half) & (values < 512)).all()
        assert len(set(keys)) == pairs and len(set(values)) == pairs
        queried = s.tokens[s.answer_positions - 1]
        assert sorted(queried) == sorted(keys)  # every key queried once
        lookup = dict(zip(keys, values))
        assert all(s.tokens[p] == lookup[q] for p, q in zip(s.answer_positions, queried))
        assert ((s.answer_positions - 2 * pairs) % 2 == 1).all() and len(s.tokens) == length
    near = MQAR(vocab_size=512, settings=[[256, 8]], power_a=0.01)
    flat = MQAR(vocab_size=512, settings=[[256, 8]], power_a=1.0)
    gap = [np.mean([m.train_sample(0, i).answer_positions.mean() for i in range(100)]) for m in (near, flat)]
    assert gap[0] < gap[1] - 20  # a small power_a puts the queries close to the pairs


def test_collate_masks_targets_and_padding():
    task = _task()
    samples = [task.held_out_sample(i) for i in (0, 1)]  # lengths 160 and 320
    batch = collate(task, samples, 321)
    assert batch["tokens"].shape == (2, 321) and (batch["tokens"][0, 160:] == PAD).all()
    for row, s in enumerate(samples):
        targets = torch.nonzero(batch["answer_mask"][row]).flatten() + 1
        assert targets.tolist() == s.answer_positions.tolist()
        assert batch["loss_mask"][row].sum() == len(s.tokens) - 1
        assert task.cells()[int(batch["cell"][row])] == s.tags
    val = TaskValBatches(task, seq_len=320, micro_batch_size=2, n_batches=3)
    assert len(val) == 3 and torch.equal(val[0]["tokens"], batch["tokens"])


def test_task_accuracy_sums_against_a_direct_count():
    gen = torch.Generator().manual_seed(0)
    task = _task(levels=[[1, 1], [2, 2]], lengths=[160])
    samples = [task.held_out_sample(i) for i in range(12)]
    batch = collate(task, samples, 161)
    targets = batch["tokens"][:, 1:]
    predictions = torch.where(torch.rand(targets.shape, generator=gen) < 0.9, targets, targets + 1)
    loss = torch.rand(targets.shape, generator=gen)
    summary = task_summary(task_sums(loss, predictions, batch, len(task.cells())), task.cells())
    exact, answer_loss, answer_tokens = [], 0.0, 0
    for row, s in enumerate(samples):
        rows = s.answer_positions - 1
        exact.append(all(int(predictions[row, t]) == int(s.tokens[t + 1]) for t in rows))
        answer_loss += float(loss[row, rows].double().sum())
        answer_tokens += len(rows)
    assert summary["val/accuracy"] == pytest.approx(np.mean(exact))
    assert summary["val/answer_loss"] == pytest.approx(answer_loss / answer_tokens)
    for depth in task.depths:
        mine = [e for e, s in zip(exact, samples) if s.tags["depth"] == depth]
        assert summary[f"val/accuracy/depth_{depth}"] == pytest.approx(np.mean(mine))
    deep = [e for e, s in zip(exact, samples) if s.tags["level"] == "N2R2" and s.tags["depth"] == 50]
    assert summary["val/accuracy_cell/level_N2R2/depth_50/length_160"] == pytest.approx(np.mean(deep))
    assert 0 < summary["val/accuracy"] < 1 and not math.isnan(summary["val/accuracy/level_N1R1"])


@pytest.mark.parametrize(
    "spec, key",
    [
        ({"name": "multi_needl"}, "did you mean 'multi_needle'"),
        ({"name": "multi_needle", "n_needles": 0}, "data.task.levels"),
        ({"name": "multi_needle", "levels": [[2, 3]]}, "n_queries <= n_needles"),
        ({"name": "multi_needle", "levels": [[2, 1, 1]]}, "n_queries <= n_needles"),
        ({"name": "multi_needle", "n_needles": 6, "lengths": [40]}, "data.task.lengths"),
        ({"name": "multi_needle", "depths": [120]}, "data.task.depths"),
        ({"name": "multi_needle", "needles": 3}, "data.task.needles"),
        ({"name": "mqar", "settings": [[63, 4]]}, "data.task.settings"),
        ({"name": "mqar", "power_a": 0}, "data.task.power_a"),
    ],
)
def test_bad_task_options_are_user_errors(spec, key):
    with pytest.raises(UserError, match=key.replace("(", r"\(")):
        build_task({"task": spec})


def test_task_must_fit_the_model():
    task = _task()
    with pytest.raises(UserError, match="train.seq_len"):
        check_fits(task, seq_len=200, vocab_size=4096)
    with pytest.raises(UserError, match="model.vocab_size"):
        check_fits(task, seq_len=320, vocab_size=task.vocab_size - 1)
    check_fits(task, seq_len=319, vocab_size=task.vocab_size)


def test_a_task_is_a_task_subclass():
    class NotATask:
        def __init__(self):
            pass

    registry.register("task", "test_not_a_task")(NotATask)
    with pytest.raises(UserError, match="not an ablate.data.tasks.Task"):
        build_task({"task": "test_not_a_task"})
    assert issubclass(MultiNeedle, Task)


@pytest.mark.parametrize("scale", ["tiny", "small"])
def test_retrieval_recipe_resolves_and_its_task_fits(scale):
    from pathlib import Path

    from ablate.recipe.loading import load_recipe

    recipe = Path(__file__).resolve().parents[2] / "recipes" / "retrieval.yaml"
    runs = load_recipe(recipe).resolve(scale, seeds=[0])
    assert [r.variant for r in runs][:2] == ["transformer", "diff"]
    for run in runs:
        task = build_task(run.config["data"])
        check_fits(task, seq_len=run.train.seq_len, vocab_size=run.config["model"]["vocab_size"])
        assert {c["level"] for c in task.cells()} == {"N1R1", "N2R2", "N4R2", "N6R2"}
        assert run.config["data"]["task_loss"] == "answers"
        assert (
            run.train.val_batches * run.train.micro_batch_size % len(task.cells()) == 0
        )  # balanced held-out grid
