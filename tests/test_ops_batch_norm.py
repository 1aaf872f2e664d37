"""The masked batch norm's edge cases, on the torch path and on the Triton path (Triton's interpreter on
the CPU): one valid value per channel in training is refused as torch refuses it, and the running
statistics of ``momentum=None`` follow torch's to float64 round-off."""

import contextlib

import pytest
import torch
import torchvision
from torch import nn

import vispos
from vispos import NestedTensor, Padding
from vispos.invariance.cells import _norms as norms
from trained_norms import trained_like

triton = pytest.importorskip("triton")
from vispos.ops import _triton  # noqa: E402

PATHS = ["torch", "triton"]


def _path(path: str):
    return _triton.interpreted() if path == "triton" else contextlib.nullcontext()


def test_one_valid_value_per_channel_in_training_is_refused_as_torch_refuses():
    """resnet18 in training on one 24x24 item padded to 64x64: layer4's maps hold one valid cell, so
    one value per channel. Stock torch raises on the item alone; the wrapper raises the same error and
    leaves the running statistics as they were (no update from a variance of 0)."""
    torch.manual_seed(0)
    net = trained_like(torchvision.models.resnet18(num_classes=5)).double().train()
    item = torch.randn(1, 3, 24, 24, dtype=torch.float64)
    with pytest.raises(ValueError, match="Expected more than 1 value per channel when training"):
        net(item)
    inv = vispos.make_padding_invariant(net)
    x = torch.zeros(1, 3, 64, 64, dtype=torch.float64)
    x[..., :24, :24] = item
    mask = torch.ones(1, 64, 64, dtype=torch.bool)
    mask[:, :24, :24] = False
    before = {k: v.clone() for k, v in net.state_dict().items() if "layer4" in k and "running" in k}
    with pytest.raises(ValueError, match="Expected more than 1 value per channel when training, got 1 valid value"):
        inv(NestedTensor(x, mask))
    after = net.state_dict()
    for k, v in before.items():
        torch.testing.assert_close(after[k], v, rtol=0, atol=0, msg=k)


@pytest.mark.parametrize("path", PATHS)
def test_one_valid_value_per_channel_is_refused_on_both_paths(path):
    """The maths call with a box of one cell per channel (and a batch of one item) raises on either
    path; two valid cells are accepted."""
    x = torch.randn(1, 2, 3, 3, dtype=torch.float64)
    one = Padding.from_sizes([(1, 1)], (3, 3))
    two = Padding.from_sizes([(1, 2)], (3, 3))
    rm, rv = torch.zeros(2, dtype=torch.float64), torch.ones(2, dtype=torch.float64)
    with _path(path):
        with pytest.raises(ValueError, match="more than 1 value per channel"):
            norms.batch_norm(x, one, rm, rv, None, None, True, 0.1, 1e-5)
        torch.testing.assert_close(rv, torch.ones(2, dtype=torch.float64), rtol=0, atol=0)
        norms.batch_norm(x, two, rm, rv, None, None, True, 0.1, 1e-5)


@pytest.mark.parametrize("path", PATHS)
def test_cumulative_average_running_statistics_match_torch_in_float64(path):
    """``momentum=None``: the factor ``1 / num_batches_tracked`` is computed in the running
    statistics' dtype, so float64 running statistics match ``nn.BatchNorm2d``'s to 1e-12 over five
    steps (a float32 factor drifts by about 1e-8 from the third)."""
    torch.manual_seed(1)
    stock = trained_like(nn.BatchNorm2d(3, momentum=None)).double().train()
    ours = trained_like(nn.BatchNorm2d(3, momentum=None)).double().train()
    padding = Padding.from_sizes([(4, 5), (4, 5)], (6, 7))
    for _ in range(5):
        x = torch.randn(2, 3, 6, 7, dtype=torch.float64) * 3 + 2
        stock(x[..., :4, :5])
        with _path(path):
            norms.batch_norm_module(x, padding, ours)
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        torch.testing.assert_close(getattr(ours, name), getattr(stock, name), rtol=0, atol=1e-12, msg=name)
