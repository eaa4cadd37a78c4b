"""Batches: the same for every variant with a seed, resumable, windows of real tokens; fixed validation."""

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from ablate.core.errors import UserError
from ablate.data import TrainBatches, ValBatches, train_batch, val_starts

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


def test_same_seed_same_batches_whatever_else_happens(tokens):
    a = first(TrainBatches(tokens, seq_len=SEQ, micro_batch_size=MB, seed=7), 6)
    # global random state is what model code touches (init, dropout): it must not matter
    torch.manual_seed(123)
    np.random.seed(456)
    torch.nn.Linear(64, 64)
    torch.rand(1000)
    b = first(TrainBatches(tokens, seq_len=SEQ, micro_batch_size=MB, seed=7), 6)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    c = first(TrainBatches(tokens, seq_len=SEQ, micro_batch_size=MB, seed=8), 6)
    assert not any(torch.equal(x, y) for x, y in zip(a, c))
    assert not torch.equal(a[0], a[1])  # successive batches differ too


def test_resume_at_micro_batch_i_continues_the_stream(tokens):
    stream = first(TrainBatches(tokens, seq_len=SEQ, micro_batch_size=MB, seed=1), 12)
    resumed = list(TrainBatches(tokens, seq_len=SEQ, micro_batch_size=MB, seed=1, start=9, stop=12))
    assert len(resumed) == 3
    assert all(torch.equal(x, y) for x, y in zip(stream[9:], resumed))
    assert torch.equal(train_batch(tokens, 5, seq_len=SEQ, micro_batch_size=MB, seed=1), stream[5])


def test_ranks_and_workers_share_out_the_same_stream(tokens):
    stream = first(TrainBatches(tokens, seq_len=SEQ, micro_batch_size=MB, seed=2), 12)
    ranks = [
        list(TrainBatches(tokens, seq_len=SEQ, micro_batch_size=MB, seed=2, stop=12, rank=r, world_size=2))
        for r in range(2)
    ]
    assert all(torch.equal(x, stream[2 * k]) for k, x in enumerate(ranks[0]))
    assert all(torch.equal(x, stream[2 * k + 1]) for k, x in enumerate(ranks[1]))
    ds = TrainBatches(tokens, seq_len=SEQ, micro_batch_size=MB, seed=2, stop=12)
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
