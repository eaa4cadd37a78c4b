"""The `triton` backend's launch configurations (components/attention/triton/configs.py): the chooser
driven by fake timings (the fastest per kernel, shape, dtype, length bucket and GPU; remembered in the
process and in a JSON file; a candidate the GPU cannot launch left out), and the interpreter's fixed
configuration on CPU, chosen without timing anything."""

from __future__ import annotations

import json

import pytest
import torch

from components.attention.triton import configs as triton_configs
from components.attention.triton import op as triton_op
from components.attention.triton.configs import Chooser, Config, Key, bucket, candidates

pytest.importorskip("triton")


def key(kernel="forward", dtype=torch.bfloat16, seq_len=2048, capability=(9, 0)) -> Key:
    return Key(kernel, 2, 64, 128, dtype, seq_len, capability)


class FakeTimer:
    """Milliseconds from a table per configuration, by running the candidate and reading what it ran."""

    def __init__(self, ms):
        self.ms, self.calls = ms, 0

    def __call__(self, run):
        self.calls += 1
        return self.ms(run())


def launched(config: Config) -> Config:
    return config  # what a launch would run with


def test_the_fastest_candidate_is_chosen_and_remembered(tmp_path):
    wanted = candidates("forward", torch.bfloat16, 128)[2]
    timer = FakeTimer(lambda c: 1.0 if c == wanted else 2.0 + c.block_m / 1000)
    chooser = Chooser(timer=timer, folder=tmp_path)
    assert chooser.choose(key(), launched) == wanted
    assert timer.calls == len(candidates("forward", torch.bfloat16, 128))
    assert chooser.choose(key(seq_len=1500), launched) == wanted  # the same bucket: not timed again
    assert timer.calls == len(candidates("forward", torch.bfloat16, 128))

    stored = json.loads((tmp_path / triton_configs.FILE).read_text())
    assert stored[key().name()]["config"] == [
        wanted.block_m,
        wanted.block_n,
        wanted.num_warps,
        wanted.num_stages,
    ]
    assert min(stored[key().name()]["ms"].values()) == 1.0

    def no_timing(run):
        raise AssertionError("timed what the file holds")

    assert Chooser(timer=no_timing, folder=tmp_path).choose(key(), launched) == wanted


def test_each_kernel_dtype_bucket_and_gpu_is_chosen_apart(tmp_path):
    timer = FakeTimer(lambda c: float(c.block_m * 1000 + c.block_n + c.num_stages))
    chooser = Chooser(timer=timer, folder=tmp_path)
    keys = [
        key(),
        key(kernel="backward_kv"),
        key(kernel="backward_q"),
        Key("backward_kv", 2, 64, 128, torch.bfloat16, 2048, (9, 0), atomic=True),  # the single pass
        key(dtype=torch.float16),
        key(dtype=torch.float32),
        key(seq_len=4096),
        key(capability=(8, 0)),
    ]
    for k in keys:
        best = chooser.choose(k, launched)
        assert best == min(candidates(k.kernel, k.dtype, k.v_width), key=lambda c: timer.ms(c))
    assert (
        len({k.name() for k in keys})
        == len(keys)
        == len(json.loads((tmp_path / triton_configs.FILE).read_text()))
    )
    assert timer.calls == sum(len(candidates(k.kernel, k.dtype, k.v_width)) for k in keys)


def test_a_candidate_that_does_not_fit_is_left_out():
    from triton.runtime.errors import OutOfResources

    first = candidates("backward_kv", torch.bfloat16, 128)[0]

    def timer(run):
        config = run()
        if config == first:
            raise OutOfResources(300000, 232448, "shared memory")
        return float(config.block_m)

    chosen = Chooser(timer=timer).choose(key(kernel="backward_kv"), launched)
    assert chosen != first and chosen.block_m == min(
        c.block_m for c in candidates("backward_kv", torch.bfloat16, 128)[1:]
    )

    def broken(run):
        raise RuntimeError("a bug, not a size")

    with pytest.raises(RuntimeError, match="a bug"):
        Chooser(timer=broken).choose(key(), launched)


def test_length_buckets():
    assert [bucket(n) for n in (1, 512, 513, 1024, 1500, 2048, 3000, 8192, 10000, 100000)] == [
        512, 512, 1024, 1024, 2048, 2048, 4096, 8192, 16384, 16384
    ]  # fmt: skip


def test_the_interpreter_takes_its_fixed_configuration_untimed():
    """CPU tensors: no timing, nothing chosen; the kernels run with `INTERPRETED`'s tiles."""

    def no_timing(run):
        raise AssertionError("timed under the interpreter")

    previous = triton_configs.use(Chooser(timer=no_timing))
    try:
        gen = torch.Generator().manual_seed(0)
        q, k = torch.randn(1, 2, 2, 70, 16, generator=gen), torch.randn(1, 2, 1, 70, 16, generator=gen)
        v, lam = torch.randn(1, 1, 70, 32, generator=gen), torch.tensor(0.3)
        leaves = [t.requires_grad_() for t in (q, k, v, lam)]
        out = triton_op.diff_attention(q, k, v, lam)  # 70 rows: two tiles of 64
        grads = torch.autograd.grad(out.square().sum(), leaves)
        same = triton_op.diff_attention(q, k, v, lam, block=triton_configs.INTERPRETED.block_m)
        assert torch.equal(out, same)
        assert all(g.abs().sum() > 0 for g in grads)
        assert triton_configs.chooser().chosen == {}
    finally:
        triton_configs.use(previous)


def test_remember_in_keeps_the_choices_made_and_stores_every_one_in_the_folder(tmp_path):
    """A run hands the process's chooser its workspace's folder: choices made before stay, the timer
    stays, and the next choice writes them all there, where another process reads them untimed."""
    timer = FakeTimer(lambda c: float(c.block_m))
    previous = triton_configs.use(Chooser(timer=timer))
    try:
        before = triton_configs.chooser().choose(key(), launched)
        triton_configs.remember_in(tmp_path)
        assert triton_configs.chooser().timer is timer and triton_configs.chooser().folder == tmp_path
        assert triton_configs.chooser().choose(key(), launched) == before and timer.calls == len(
            candidates("forward", torch.bfloat16, 128)
        )
        after = triton_configs.chooser().choose(key(kernel="backward_kv"), launched)
        stored = json.loads((tmp_path / triton_configs.FILE).read_text())
        assert set(stored) == {key().name(), key(kernel="backward_kv").name()}

        def no_timing(run):
            raise AssertionError("timed again")

        elsewhere = Chooser(timer=no_timing, folder=tmp_path)
        assert (elsewhere.choose(key(), launched), elsewhere.choose(key(kernel="backward_kv"), launched)) == (
            before,
            after,
        )
    finally:
        triton_configs.use(previous)


@pytest.mark.parametrize(
    "text", ["{not json", "[1, 2]", '{"x": {"config": [64]}}', '{"x": {"config": ["a", 1, 1, 1]}}']
)
def test_a_damaged_file_is_measured_again_and_rewritten(tmp_path, text):
    (tmp_path / triton_configs.FILE).write_text(text)
    timer = FakeTimer(lambda c: float(c.block_m))
    chosen = Chooser(timer=timer, folder=tmp_path).choose(key(), launched)
    assert timer.calls == len(candidates("forward", torch.bfloat16, 128)) and chosen.block_m == min(
        c.block_m for c in candidates("forward", torch.bfloat16, 128)
    )
    assert list(json.loads((tmp_path / triton_configs.FILE).read_text())) == [key().name()]


@pytest.mark.parametrize("kernel", triton_configs.KERNELS)
def test_two_warp_groups_only_for_products_of_128_rows(kernel):
    """16 bits, V up to 128: 8 warps where the kernel's products have 128 rows, 4 where they have 64 (a
    wgmma warp group covers 64 rows: 8 warps on a 64-row product compute it twice). The dK/dV kernel's
    products have the key block's rows (backward.py: S^T = K Q^T), the others the query tile's."""
    for config in candidates(kernel, torch.bfloat16, 128):
        rows = config.block_n if kernel == "backward_kv" else config.block_m
        assert rows in (64, 128) and config.num_warps == triton_configs.warps(rows), config
