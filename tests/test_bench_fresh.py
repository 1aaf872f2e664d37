"""The benchmark's "new sizes every call" batches (``benchmarks/_fresh.py``): every batch is new
to a cache (other per-item sizes, other holes) and does the same work as the first (the same
padded shape, the same padded axes per item), and none is built inside a call."""

import pytest
import torch

from benchmarks._fresh import FreshInputs, fresh_levels, shrink

IMAGES = [(800, 1066), (800, 1201), (736, 1333), (800, 1088)]


def _padded_axes(nt):
    spatial = nt.tensors.shape[2:]
    return [tuple(s < m for s, m in zip(size, spatial)) for size in nt.image_sizes]


def test_batches_are_new_and_alike():
    keep, width, height = range(0, 1), shrink(800, 32, 0, 16), shrink(736, 32, 0, 8)
    vary = [((0,), [keep, width]), ((1,), [keep, width]), ((3,), [keep, width]), ((2,), [height, keep])]
    batches = fresh_levels(IMAGES, [32], vary, "cpu", scale=32)
    nested, arbitrary = FreshInputs(batches, "nested"), FreshInputs(batches, "arbitrary")
    nested.prepare(40)
    arbitrary.prepare(40)
    seen, holes = set(), set()
    for _ in range(40):
        (nt,), (mask,) = nested(), arbitrary()
        assert nt.tensors.shape[2:] == (25, 42) and nt.rectangular
        assert _padded_axes(nt) == [(False, True), (False, True), (True, False), (False, True)]
        assert torch.equal(mask | nt.mask, mask) and not torch.equal(mask, nt.mask)
        seen.add(tuple(map(tuple, nt.image_sizes)))
        holes.add(mask.numpy().tobytes())
    assert len(seen) == len(holes) == 40


def test_a_batch_not_prepared_is_refused():
    batches = fresh_levels([(8,), (6,)], [1], [((1,), [range(0, 3)])], "cpu")
    cursor = FreshInputs(batches, "mask")
    cursor.prepare(3)
    for _ in range(3):
        cursor()
    with pytest.raises(RuntimeError, match="fresh batch 3 was not prepared"):
        cursor()
    with pytest.raises(RuntimeError, match="only 3 distinct size combinations"):
        cursor.prepare(1)


def test_a_long_cycle_starts_again():
    """A GPU runs more calls than a workload has size combinations: past the last, batch ``i`` is
    batch ``i % total``, a miss for any cache of fewer entries than the cycle."""
    batches = fresh_levels([(80,), (70,)], [1], [((1,), [range(0, 64)])], "cpu")
    cursor = FreshInputs(batches, "mask")
    cursor.prepare(66)
    first = [cursor() for _ in range(66)]
    assert torch.equal(first[64][0], first[0][0]) and not torch.equal(first[63][0], first[0][0])
