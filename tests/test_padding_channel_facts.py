"""``Padding._channel_facts``: the mask with a channel axis and the host count of valid cells that
every norm of a network reads, kept once per padding and mask version in plain eager mode only."""

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from vispos import Padding


class _Watch(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_counts_and_mask_match_the_padding():
    rect = Padding.from_sizes([(4, 5), (2, 3)], (4, 6))
    mask, count = rect._channel_facts()
    assert mask.shape == (2, 1, 4, 6) and mask.dtype == torch.bool
    assert torch.equal(mask[:, 0], rect.mask)
    assert count == 4 * 5 + 2 * 3 == int((~rect.mask).sum())
    none = Padding.none(3, (2, 5))
    assert none._channel_facts()[1] == 30 and not none._channel_facts()[0].any()
    arbitrary = torch.zeros(2, 4, 4, dtype=torch.bool)
    arbitrary[0, 1, 2] = arbitrary[1, 0, 0] = arbitrary[1, 3, 3] = True
    padding = Padding.from_mask(arbitrary, classify=True)
    assert padding.kind == "arbitrary" and padding._channel_facts()[1] == 0


def test_kept_in_eager_and_renewed_after_an_in_place_write():
    mask = torch.zeros(2, 4, 4, dtype=torch.bool)
    mask[1, :, 2:] = True
    padding = Padding.from_mask(mask)
    first = padding._channel_facts()
    assert padding._channel_facts()[0] is first[0] and first[1] == 16 + 8
    mask[1, 2:, :] = True  # the caller's mask is the truth: facts and boxes follow it
    second = padding._channel_facts()
    assert second[0] is not first[0] and second[1] == 16 + 4
    assert torch.equal(second[0][:, 0], mask)


def test_not_kept_or_served_under_a_dispatch_mode():
    padding = Padding.from_sizes([(3, 3), (1, 2)], (3, 3))
    with _Watch():
        watched = padding._channel_facts()
    assert padding._channel is None  # nothing built under the mode outlives it
    kept = padding._channel_facts()
    with _Watch():
        again = padding._channel_facts()
    assert again[0] is not kept[0] and again[1] == kept[1] == 11
    assert torch.equal(watched[0], kept[0])
