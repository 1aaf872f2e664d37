"""Helpers of the item-alone tests: an item's box in a padded batch, parameter gradients of a
model run on a padded batch against a twin run on the item alone, and a backbone's copies."""

import copy
import pickle

from torch.testing import assert_close


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
