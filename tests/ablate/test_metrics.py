"""AR-Hit / Others slices: hand-built cases, a brute-force reference, and the slice arithmetic."""

import math

import numpy as np
import pytest
import torch

from ablate.train.metrics import ar_hit_mask, merge_sums, slice_summary, sliced_loss_sums, unigram_entropy


def brute_force_mask(seq: list[int]) -> list[bool]:
    """Target t is a hit iff an earlier position s < t starts the same bigram (written independently)."""
    out = []
    for t in range(len(seq) - 1):
        hit = False
        for s in range(t):
            if seq[s] == seq[t] and seq[s + 1] == seq[t + 1]:
                hit = True
        out.append(hit)
    return out


@pytest.mark.parametrize(
    ("seq", "expected"),
    [
        # bigrams: (1,2) (2,1) (1,2)* (2,3) (3,1) (1,2)* (2,3)*
        ([1, 2, 1, 2, 3, 1, 2, 3], [0, 0, 1, 0, 0, 1, 1]),
        # a run of one token: overlapping (5,5) bigrams, every one after the first is a hit
        ([5, 5, 5, 5, 5], [0, 1, 1, 1]),
        # reversed bigrams are different bigrams; repeated tokens alone are not hits
        ([1, 2, 3, 2, 1], [0, 0, 0, 0]),
        ([4, 9, 4, 7, 4, 9], [0, 0, 0, 0, 1]),
        # overlapping: (6,6) at 0, (6,6) at 1 shares a token with it
        ([6, 6, 6, 0, 6, 6], [0, 1, 0, 0, 1]),
        # ids beyond 16 bits (tiktoken-size vocabularies) and id 0
        ([100000, 3, 100000, 3, 0, 100000, 3], [0, 0, 1, 0, 0, 1]),
        # (0, 65536) and (1, 0) are different bigrams, whatever packing of pairs the code uses
        ([0, 65536, 1, 0, 70000, 0, 65536], [0, 0, 0, 0, 0, 1]),
        ([7], []),
    ],
)
def test_ar_hit_mask_hand_built(seq, expected):
    mask = ar_hit_mask(torch.tensor([seq]))
    assert mask.dtype == torch.bool
    assert mask.shape == (1, len(seq) - 1)
    assert mask[0].tolist() == [bool(e) for e in expected]


def test_ar_hit_mask_batch_rows_are_independent():
    tokens = torch.tensor([[7, 8, 9, 9, 9], [7, 8, 7, 8, 0], [9, 9, 1, 7, 8]])
    # row 0: (7,8) (8,9) (9,9) (9,9)*; row 1: (7,8) (8,7) (7,8)* (8,0); row 2 repeats nothing of its own
    expected = [[0, 0, 0, 1], [0, 0, 1, 0], [0, 0, 0, 0]]
    assert ar_hit_mask(tokens).int().tolist() == expected
    for row in range(3):
        assert ar_hit_mask(tokens[row : row + 1])[0].tolist() == ar_hit_mask(tokens)[row].tolist()


@pytest.mark.parametrize("vocab", [3, 20, 5000])
def test_ar_hit_mask_matches_brute_force(vocab):
    gen = torch.Generator().manual_seed(vocab)
    tokens = torch.randint(0, vocab, (6, 97), generator=gen)
    mask = ar_hit_mask(tokens)
    for row in range(tokens.shape[0]):
        assert mask[row].tolist() == brute_force_mask(tokens[row].tolist())
    if vocab == 3:
        assert mask.any() and not mask.all()  # the comparison saw both classes


def test_sliced_sums_add_up_to_total():
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 12, (4, 65), generator=gen)
    loss = torch.rand(4, 64, generator=gen) * 5
    mask = ar_hit_mask(tokens)
    sums = sliced_loss_sums(loss, mask)
    flat_loss, flat_mask = loss.flatten().tolist(), mask.flatten().tolist()
    hits = [v for v, m in zip(flat_loss, flat_mask) if m]
    others = [v for v, m in zip(flat_loss, flat_mask) if not m]
    assert int(sums["ar_hit_count"]) == len(hits) and int(sums["others_count"]) == len(others)
    assert int(sums["total_count"]) == 4 * 64
    assert float(sums["ar_hit_sum"]) == pytest.approx(math.fsum(hits), rel=1e-9)
    assert float(sums["others_sum"]) == pytest.approx(math.fsum(others), rel=1e-9)

    s = slice_summary(sums)
    assert s["loss"] == pytest.approx(loss.double().mean().item(), rel=1e-12)
    assert s["ar_hit_loss"] == pytest.approx(math.fsum(hits) / len(hits), rel=1e-9)
    assert s["ar_hit_share"] + s["others_share"] == pytest.approx(1.0)
    # the two slices weighted by their token counts give the total
    weighted = s["ar_hit_share"] * s["ar_hit_loss"] + s["others_share"] * s["others_loss"]
    assert weighted == pytest.approx(s["loss"], rel=1e-12)


def test_merge_sums_equals_sums_over_concatenated_batches():
    gen = torch.Generator().manual_seed(1)
    a_tok, b_tok = (torch.randint(0, 8, (3, 33), generator=gen) for _ in range(2))
    a_loss, b_loss = (torch.rand(3, 32, generator=gen) for _ in range(2))
    acc = merge_sums(None, sliced_loss_sums(a_loss, ar_hit_mask(a_tok)))
    acc = merge_sums(acc, sliced_loss_sums(b_loss, ar_hit_mask(b_tok)))
    whole = sliced_loss_sums(torch.cat([a_loss, b_loss]), ar_hit_mask(torch.cat([a_tok, b_tok])))
    for key in whole:
        assert float(acc[key]) == pytest.approx(float(whole[key]), rel=1e-12)


def test_empty_slice_has_nan_mean_and_zero_share():
    tokens = torch.tensor([[1, 2, 3, 4]])  # no repeats
    s = slice_summary(sliced_loss_sums(torch.tensor([[1.0, 2.0, 3.0]]), ar_hit_mask(tokens)))
    assert math.isnan(s["ar_hit_loss"]) and s["ar_hit_share"] == 0.0
    assert s["others_loss"] == pytest.approx(2.0) and s["others_share"] == 1.0


def test_unigram_entropy():
    assert unigram_entropy(np.array([0, 0, 1, 1], dtype=np.uint16), 257) == pytest.approx(math.log(2))
    assert unigram_entropy(np.array([3, 3, 3]), 4) == pytest.approx(0.0)
    p = np.array([0.5, 0.25, 0.25])
    assert unigram_entropy(np.array([0, 0, 1, 2]), 3) == pytest.approx(-(p * np.log(p)).sum())
