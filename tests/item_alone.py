"""Helpers of the item-alone tests: an item's box in a padded batch, parameter gradients of a
model run on a padded batch against a twin run on the item alone, a backbone's copies, and a
traced 2D network made exact by the rule table with its output for one item alone and in a batch, and
the whole item-alone check of a traced N-D body (outputs, running statistics, gradients)."""

import copy
import pickle

import torch
from torch import nn
from torch.testing import assert_close

from vispos import NestedTensor, Padding, nested_tensor_from_tensor_list
from vispos.invariance.rewrite._rewrite import make_padding_invariant
from vispos.invariance.tracing._trace import trace_dual

from trained_norms import trained_like


def region(start, size):
    """The slices of a box of ``size`` cells starting at ``start``, one per spatial axis."""
    return tuple(slice(a, a + s) for a, s in zip(start, size))


def assert_same_gradients(net, twin):
    """Every parameter gradient of ``net`` (the padded batch) equals ``twin``'s (the item alone),
    to float64 rounding relative to each gradient's scale; a parameter without a gradient alone
    gets none, or zeros, in the batch."""
    for (name, p1), p2 in zip(twin.named_parameters(), net.parameters()):
        if p1.grad is None:
            assert p2.grad is None or not p2.grad.any(), name
            continue
        scale = float(p1.grad.abs().max()) or 1.0
        assert_close(p2.grad, p1.grad, rtol=1e-8, atol=1e-12 + 1e-9 * scale, msg=name)


def assert_copies_give(backbone, batch, want):
    """A deep copy and a pickle round trip of ``backbone`` give the levels ``want`` on ``batch``,
    bit for bit (call under ``torch.no_grad()``)."""
    for clone in (copy.deepcopy(backbone), pickle.loads(pickle.dumps(backbone))):
        for got, ref in zip(clone(batch), want):
            assert_close(got.tensors, ref.tensors, rtol=0, atol=0)


class Invariant(nn.Module):
    """A 2D ``module`` traced (``body``) and run padding-invariant by the rule table (``runner``):
    building it raises the rewriter's ValueError for an operation no rule makes exact."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.body = trace_dual(module, 2)
        self.runner = make_padding_invariant(self.body, 2)

    def forward(self, x):
        return self.runner(self.body, x)


def two_items():
    """``(item, other)``: float64 maps of 3 channels, 9 x 11 and 14 x 8 (seed 0)."""
    g = torch.Generator().manual_seed(0)
    return (torch.randn(3, 9, 11, generator=g, dtype=torch.float64),
            torch.randn(3, 14, 8, generator=g, dtype=torch.float64))


def alone_and_in_batch(bb: nn.Module):
    """``(alone, got)``: ``bb``'s first level for :func:`two_items`' item alone, and for the same
    item's cells when it follows the other in a batch padded with 7.0."""
    item, other = two_items()
    with torch.no_grad():
        alone = bb(NestedTensor(item[None], None))[0].tensors[0]
        got = bb(nested_tensor_from_tensor_list([other, item], pad_value=7.0))[0].tensors[1, :, :9, :11]
    return alone, got


class _InvariantN(nn.Module):
    """``module`` traced (``body``) and run padding-invariant by the rule table, ``n`` spatial axes."""

    def __init__(self, module: nn.Module, n: int):
        super().__init__()
        self.body = trace_dual(module, n)
        self.runner = make_padding_invariant(self.body, n)

    def forward(self, x):
        return self.runner(self.body, x)


def assert_alone_equals_in_batch(body: nn.Module, n: int, item_size, canvas, start, train: bool,
                                 partner: bool = True) -> None:
    """``body`` run on one item alone and on a padded batch (the item at ``start``, a partner item
    at the origin when ``partner``, 5.0 in every padded cell): equal outputs on the item's cells,
    an output padding that marks exactly them, equal running statistics and, in training, equal
    parameter and input gradients. float64."""
    torch.manual_seed(0)
    body = trained_like(body).to(torch.float64)
    alone_net = _InvariantN(body, n).train(train)
    batch_net = _InvariantN(copy.deepcopy(body), n).train(train)
    g = torch.Generator().manual_seed(2)
    channels = next(m for m in body.modules() if isinstance(m, nn.modules.conv._ConvNd)).in_channels
    item = torch.randn((1, channels, *item_size), generator=g, dtype=torch.float64, requires_grad=True)
    other_size = tuple(max(c - 1, 1) for c in canvas)
    images = torch.full((1 + partner, channels, *canvas), 5.0, dtype=torch.float64)
    if partner:
        images[(0, slice(None), *(slice(0, s) for s in other_size))] = torch.randn(
            (channels, *other_size), generator=g, dtype=torch.float64)
    region = tuple(slice(a, a + s) for a, s in zip(start, item_size))
    images[(int(partner), slice(None), *region)] = item[0].detach()
    images.requires_grad_(True)
    sizes = ([other_size] if partner else []) + [tuple(item_size)]
    starts = ([(0,) * n] if partner else []) + [tuple(start)]
    padding = Padding.from_sizes(sizes, canvas, starts=starts)
    (alone,) = alone_net(NestedTensor(item, None))
    (in_batch,) = batch_net(NestedTensor(images, padding))
    out_start, out_size = in_batch.padding.starts[int(partner)], in_batch.padding.sizes[int(partner)]
    assert out_size == tuple(alone.tensors.shape[2:])
    got = in_batch.tensors[(int(partner), slice(None), *(slice(a, a + s) for a, s in zip(out_start, out_size)))]
    torch.testing.assert_close(got, alone.tensors[0], rtol=1e-10, atol=1e-10)
    ours = batch_net.state_dict()
    for key, value in alone_net.state_dict().items():
        if not partner or "running" not in key and "num_batches" not in key:
            torch.testing.assert_close(ours[key], value, rtol=1e-10, atol=1e-10, msg=key)
    if not train:
        return
    weights = torch.randn(alone.tensors.shape[1:], generator=g, dtype=torch.float64)
    (alone.tensors[0] * weights).sum().backward()
    (got * weights).sum().backward()
    for (name, p1), p2 in zip(alone_net.named_parameters(), batch_net.parameters()):
        if p1.grad is None:  # a layer the output does not read
            assert p2.grad is None or not p2.grad.any(), name
            continue
        scale = float(p1.grad.abs().max()) or 1.0
        torch.testing.assert_close(p2.grad, p1.grad, rtol=1e-9, atol=1e-12 + 1e-9 * scale, msg=name)
    torch.testing.assert_close(images.grad[(int(partner), slice(None), *region)], item.grad[0], rtol=1e-9,
                               atol=1e-12)
