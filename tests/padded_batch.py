"""Helpers of the whole-network item-alone tests (``vispos.make_padding_invariant``): an item put
in a padded batch beside a partner, its part of each output, the comparison of every output with
the item alone, and the training-mode check (outputs, running statistics, gradients)."""

import copy

import torch
from torch.testing import assert_close

from vispos import NestedTensor, Padding

from item_alone import assert_same_gradients, region


def padded_batch(item: torch.Tensor, other_size, fill=5.0, multiple=16):
    """``item`` (C, *S) at the origin of a canvas larger than both items (a multiple of
    ``multiple``, as BasicUNet needs 16), a random partner of ``other_size`` beside it, ``fill`` in
    the padding."""
    size = tuple(item.shape[1:])
    canvas = tuple((max(a, b) + multiple + 7) // multiple * multiple for a, b in zip(size, other_size))
    x = torch.full((2, item.shape[0], *canvas), fill, dtype=item.dtype)
    x[(0, slice(None), *region((0,) * len(size), size))] = item
    x[(1, slice(None), *region((0,) * len(size), other_size))] = torch.randn(item.shape[0], *other_size,
                                                                            dtype=item.dtype)
    return NestedTensor(x, Padding.from_sizes([size, tuple(other_size)], canvas))


def item_part(got, want):
    """Item 0's part of an output leaf of the batch, with the shape of the item's own ``want``."""
    if isinstance(got, NestedTensor):
        assert got.mask is None or not got.mask[(0, *region((0,) * (want.dim() - 2), want.shape[2:]))].any()
        return got.tensors[(slice(0, 1), slice(None), *region((0,) * (want.dim() - 2), want.shape[2:]))]
    return got[:1]


def assert_item_alone(alone, batched, rtol=1e-9):
    """Every output leaf of ``batched`` holds, on item 0's cells, the matching leaf of ``alone``
    (float64 rounding relative to its largest value)."""
    want, _ = torch.utils._pytree.tree_flatten(alone)
    got, _ = torch.utils._pytree.tree_flatten(batched)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        w = w.tensors if isinstance(w, NestedTensor) else w
        assert_close(item_part(g, w), w, rtol=rtol, atol=rtol * float(w.detach().abs().max()))


def assert_training_is_the_item_alone(net, make_invariant, item_size, seed=1, multiple=16):
    """``net`` in training mode on one item alone against a twin made invariant by
    ``make_invariant`` on the item padded into a larger canvas: the same outputs (batch statistics
    over the item's cells), the same running statistics and batch counts, the same parameter
    gradients (the canvas: the next multiple of ``multiple`` beyond the item). ``net`` is left
    trained one step."""
    net.train()
    twin = copy.deepcopy(net)
    inv = make_invariant(twin)
    assert inv.training and all(m.training for m in inv.modules())
    item = torch.randn(inv.in_channels, *item_size, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    canvas = tuple((s + multiple) // multiple * multiple for s in item_size)
    x = torch.full((1, inv.in_channels, *canvas), -3.0, dtype=torch.float64)
    x[(0, slice(None), *region((0,) * len(item_size), item_size))] = item
    torch.manual_seed(seed)  # dropout / drop-connect draws alike on both sides
    stock = net(item[None])
    torch.manual_seed(seed)
    batched = inv(x, Padding.from_sizes([item_size], canvas).mask)
    assert_item_alone(stock, batched)
    for key, value in net.state_dict().items():  # running statistics and batch counts
        assert_close(twin.state_dict()[key], value, rtol=1e-9, atol=1e-12, msg=key)
    want, _ = torch.utils._pytree.tree_flatten(stock)
    got, _ = torch.utils._pytree.tree_flatten(batched)
    sum(w.square().mean() for w in want).backward()
    sum(item_part(g, w).square().mean() for g, w in zip(got, want)).backward()
    assert_same_gradients(twin, net)
