"""Batches: the same for every variant with a seed, resumable, windows of real tokens; each pass a
permutation of disjoint windows (or, `random`, windows at random offsets); fixed validation."""

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from ablate.core.errors import UserError
from ablate.data import SAMPLINGS, TrainBatches, ValBatches, micro_batch, passes, train_batch, val_starts

SEQ, MB = 16, 4


@pytest.fixture
def tokens():
    return np.arange(5000, dtype=np.uint16)  # a window of consecutive ids shows where it came from


def first(ds, n):
    it = iter(ds)
    return [next(it) for _ in range(n)]


def test_batches_are_windows_of_the_tokens(tokens):
    batch = train_batch(tokens, 0, seq_len=SEQ, micro_batch_size=MB, seed=0)
    assert batch.dtype == torch.long and batch.shape == (MB, SEQ + 1)
    for row in batch:
        assert torch.equal(row, torch.arange(int(row[0]), int(row[0]) + SEQ + 1))
    # offsets reach both ends of the array (a tiny array leaves only two possible windows)
    starts = {
        int(train_batch(tokens[: SEQ + 2], i, seq_len=SEQ, micro_batch_size=1, seed=3)[0, 0])
        for i in range(64)
    }
    assert starts == {0, 1}


@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_same_seed_same_batches_whatever_else_happens(tokens, sampling):
    a = first(TrainBatches(tokens, seq_len=SEQ, micro_batch_size=MB, seed=7, sampling=sampling), 6)
    # global random state is what model code touches (init, dropout): it must not matter
    torch.manual_seed(123)
    np.random.seed(456)
    torch.nn.Linear(64, 64)
    torch.rand(1000)
    b = first(TrainBatches(tokens, seq_len=SEQ, micro_batch_size=MB, seed=7, sampling=sampling), 6)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    c = first(TrainBatches(tokens, seq_len=SEQ, micro_batch_size=MB, seed=8, sampling=sampling), 6)
    assert not any(torch.equal(x, y) for x, y in zip(a, c))
    assert not torch.equal(a[0], a[1])  # successive batches differ too


@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_resume_at_micro_batch_i_continues_the_stream(tokens, sampling):
    # 312 windows a pass (permutation): micro-batch 78 is the first of the second pass
    stream = first(TrainBatches(tokens, seq_len=SEQ, micro_batch_size=MB, seed=1, sampling=sampling), 84)
    resumed = list(
        TrainBatches(tokens, seq_len=SEQ, micro_batch_size=MB, seed=1, start=75, stop=84, sampling=sampling)
    )
    assert len(resumed) == 9
    assert all(torch.equal(x, y) for x, y in zip(stream[75:], resumed))
    alone = micro_batch(tokens, 80, seq_len=SEQ, micro_batch_size=MB, seed=1, sampling=sampling)
    assert torch.equal(alone, stream[80])


def test_random_sampling_is_train_batch():
    tokens = np.arange(5000, dtype=np.uint16)
    stream = first(TrainBatches(tokens, seq_len=SEQ, micro_batch_size=MB, seed=1, sampling="random"), 6)
    assert torch.equal(train_batch(tokens, 5, seq_len=SEQ, micro_batch_size=MB, seed=1), stream[5])


def _window_numbers(batches) -> list[int]:
    """The windows (of the arange tokens, stride SEQ) `batches` hold, in order; each checked to be one."""
    numbers = []
    for batch in batches:
        for row in batch:
            start = int(row[0])
            assert start % SEQ == 0 and torch.equal(row, torch.arange(start, start + SEQ + 1))
            numbers.append(start // SEQ)
    return numbers


def test_a_pass_reads_every_window_once_in_a_seeded_order_and_the_next_pass_another():
    """4,999 tokens: (4999 - 1) // 16 = 312 windows a pass, whose inputs tile tokens 0 .. 4991 and whose
    targets tile 1 .. 4992; the pass ends inside micro-batch 78 (312 = 78 x 4: at its end) and, with 5
    windows a micro-batch, inside micro-batch 62."""
    tokens = np.arange(4999, dtype=np.uint16)
    for mb in (MB, 5):
        batches = first(TrainBatches(tokens, seq_len=SEQ, micro_batch_size=mb, seed=3), 2 * 312 // mb + 1)
        read = _window_numbers(batches)
        one, two = read[:312], read[312:624]
        assert sorted(one) == sorted(two) == list(range(312))  # each pass: every window once
        assert one != two and one != sorted(one)  # each in its own shuffled order
        inputs = np.sort(np.concatenate([np.arange(k * SEQ, (k + 1) * SEQ) for k in one]))
        assert np.array_equal(inputs, np.arange(312 * SEQ))  # no token an input twice, none left out
        if mb == MB:
            first_order = one
        else:
            assert one == first_order  # the order is the pass's, whatever the micro-batch size
    other_seed = _window_numbers(first(TrainBatches(tokens, seq_len=SEQ, micro_batch_size=MB, seed=4), 78))
    assert sorted(other_seed) == list(range(312)) and other_seed != first_order


def test_ranks_read_disjoint_windows_that_make_up_the_pass():
    tokens = np.arange(4999, dtype=np.uint16)
    world = 2
    per_rank = [
        _window_numbers(
            TrainBatches(tokens, seq_len=SEQ, micro_batch_size=MB, seed=5, stop=78, rank=r, world_size=world)
        )
        for r in range(world)
    ]
    assert len(per_rank[0]) == len(per_rank[1]) == 156
    assert not set(per_rank[0]) & set(per_rank[1])
    assert sorted(per_rank[0] + per_rank[1]) == list(range(312))


@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_ranks_and_workers_share_out_the_same_stream(tokens, sampling):
    stream = first(TrainBatches(tokens, seq_len=SEQ, micro_batch_size=MB, seed=2, sampling=sampling), 12)
    ranks = [
        list(
            TrainBatches(
                tokens,
                seq_len=SEQ,
                micro_batch_size=MB,
                seed=2,
                stop=12,
                rank=r,
                world_size=2,
                sampling=sampling,
            )
        )
        for r in range(2)
    ]
    assert all(torch.equal(x, stream[2 * k]) for k, x in enumerate(ranks[0]))
    assert all(torch.equal(x, stream[2 * k + 1]) for k, x in enumerate(ranks[1]))
    ds = TrainBatches(tokens, seq_len=SEQ, micro_batch_size=MB, seed=2, stop=12, sampling=sampling)
    loaded = list(DataLoader(ds, batch_size=None, num_workers=2))
    assert len(loaded) == 12 and all(torch.equal(x, y) for x, y in zip(loaded, stream))


def test_validation_batches_are_fixed_disjoint_and_spread(tokens):
    val = ValBatches(tokens, seq_len=SEQ, micro_batch_size=MB, n_batches=5)
    assert len(val) == 5
    starts = sorted(int(row[0]) for j in range(len(val)) for row in val[j])
    assert len(starts) == 20 and starts[0] == 0
    assert all(b - a >= SEQ + 1 for a, b in zip(starts, starts[1:]))  # no window overlaps another
    assert starts[-1] + SEQ + 1 > len(tokens) - (len(tokens) // 20)  # the end of the split is covered
    again = ValBatches(tokens, seq_len=SEQ, micro_batch_size=MB, n_batches=5)
    assert all(torch.equal(val[j], again[j]) for j in range(5))
    # exactly enough tokens for the windows: they tile the split
    exact = val_starts(4 * 17, seq_len=16, micro_batch_size=2, n_batches=2)
    assert exact.tolist() == [0, 17, 34, 51]


def test_too_short_corpus_is_a_user_error(tokens):
    with pytest.raises(UserError) as e:
        TrainBatches(tokens[:16], seq_len=SEQ, micro_batch_size=MB, seed=0)
    msg = str(e.value)
    with pytest.raises(UserError, match=r"^data.sampling: 'shuffled' is not one of permutation, random$"):
        TrainBatches(tokens, seq_len=SEQ, micro_batch_size=MB, seed=0, sampling="shuffled")
    assert "\n" not in msg
    assert msg.startswith(
        "seq_len: windows of 17 tokens (seq_len + 1) do not fit in the 16-token train split"
    )
    with pytest.raises(UserError) as e:
        ValBatches(tokens[:1000], seq_len=SEQ, micro_batch_size=MB, n_batches=20)
    assert str(e.value).startswith(
        "val_batches: 20 micro-batches of 4 x 17 tokens need 1360 validation tokens but the val split has 1000;"
        " use at most 14"
    )


def _share_read_twice(batches) -> float:
    """Of the target tokens the batches (of arange tokens) read, the share read before: counted."""
    targets = np.concatenate([batch[:, 1:].numpy().ravel() for batch in batches])
    return 1 - len(np.unique(targets)) / len(targets)


@pytest.mark.parametrize("p", [0.1, 0.6, 1.2])
def test_the_share_read_twice_is_what_the_loader_reads(p):
    """`passes.read_twice` against the windows the real loader draws over a 40K-token split: counted
    exactly under `permutation`; under `random`, the mean of 4 seeds within 4 standard errors of its
    expectation (the count's spread measured across the seeds, not assumed)."""
    split = 40_001  # 2,500 windows of stride 16
    tokens = np.arange(split, dtype=np.int32)
    n_batches = round(p * (split - 1) / (SEQ * MB))
    passes_read = n_batches * SEQ * MB / (split - 1)
    stream = first(TrainBatches(tokens, seq_len=SEQ, micro_batch_size=MB, seed=0), n_batches)
    assert _share_read_twice(stream) == pytest.approx(
        passes.read_twice(passes_read, "permutation"), abs=1e-12
    )
    if p < 1:
        assert _share_read_twice(stream) == 0
    shares = [
        _share_read_twice(
            first(
                TrainBatches(tokens, seq_len=SEQ, micro_batch_size=MB, seed=s, sampling="random"), n_batches
            )
        )
        for s in range(4)
    ]
    spread = max(np.std(shares, ddof=1) / 2, 1e-3)
    assert abs(np.mean(shares) - passes.read_twice(passes_read, "random")) < 4 * spread


def test_the_share_read_twice_in_words():
    assert passes.format_share(passes.read_twice(0.0125, "random")) == "0.6%"  # 1 - (1 - e^-p)/p
    assert passes.format_share(passes.read_twice(0.6, "random")) == "25%"
    assert passes.read_twice(0.999, "permutation") == 0 and passes.read_twice(2.0, "permutation") == 0.5
    line = passes.usage_line(3.5e6, [0.15, 1.2], ["permutation", "permutation"])
    assert line.endswith("0-17% of their tokens read twice (each pass a permutation of disjoint windows)")
    old = passes.usage_line(164e6, [0.0125], [passes.sampling_of({})])  # a run recorded before the key
    assert old.endswith("0.6% of their tokens read twice in expectation (windows at random offsets)")
    assert passes.sampling_of({"data.sampling": "permutation"}) == "permutation"


def test_a_plots_passes_axis_says_the_share_read_twice_at_its_right_edge():
    note = passes.axis_note(164e6, 2.05e6, ["random", "random"])  # 0.0125 passes
    assert note == "0.6% read twice at the right edge (in expectation: windows at random offsets)"
    both = passes.axis_note(1e6, 2e6, ["permutation", "random"])  # 2 passes: 1 - 1/2 and 1 - (1 - e^-2)/2
    assert both == (
        "50% read twice at the right edge (each pass a permutation); "
        "57% read twice at the right edge (in expectation: windows at random offsets)"
    )
    assert passes.axis_note(float("nan"), 2e6, ["random"]) == ""  # the split unknown: nothing said
