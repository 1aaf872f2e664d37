"""Layers the rule book makes exact that real models use: zero padding written as a function,
channel-axis and element-wise operations, per-item statistics over space, fixed-size adaptive
pools and ShuffleNet's channel shuffle. Each: an item inside a padded batch (a partner beside it,
garbage in the padding, the item at the origin or further in) against the item alone, in float64,
eval and train: outputs, running statistics, parameter and input gradients (trained-like norm
statistics). What cannot be exact is refused by name, for the input that needs it only."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from item_alone import assert_alone_equals_in_batch

F64 = torch.float64
CONVS = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}
NORMS = {1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}


class Between(nn.Module):
    """A convolution and a norm, ``how(x)`` (the call under test; a module is registered as a
    submodule), then a convolution that reads its neighbours. Group norm (training with a partner)
    or batch norm (eval; training alone on a larger canvas)."""

    def __init__(self, how, n: int = 2, norm: str = "batch", channels: int = 4, out_channels: int | None = None):
        super().__init__()
        self.c1 = CONVS[n](3, channels, 3, padding=1)
        self.norm = nn.GroupNorm(2, channels) if norm == "group" else NORMS[n](channels)
        self.how = how
        self.c2 = CONVS[n](out_channels or channels, 2, 3, padding=1)

    def forward(self, x):
        return self.c2(self.how(self.norm(self.c1(x))))


def check(how, train: bool, n: int = 2, starts=((0, 0), (2, 3)), **kwargs) -> None:
    """:func:`assert_alone_equals_in_batch` of :class:`Between` for every start: in eval beside a
    partner with batch norm, in training beside a partner with group norm."""
    body = Between(how, n, "group" if train else "batch", **kwargs)
    for start in starts:
        assert_alone_equals_in_batch(copy.deepcopy(body), n, (7, 9, 5)[:n], (11, 12, 8)[:n], start[:n], train)


class Fn(nn.Module):
    """A function of the map as a module (so that ``how`` is traced inside the body)."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


TRAIN = pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])


# ------------------------------------------------------------------------------ F.pad
@TRAIN
@pytest.mark.parametrize("how", [
    lambda x: F.max_pool2d(F.pad(x, (0, 1, 0, 1)), 2, stride=1),  # timm hgnetv2's stem
    lambda x: F.pad(x, [1, 2, 0, 3], value=0.0),
    lambda x: F.avg_pool2d(F.pad(x, (1, 1, 1, 1), mode="replicate"), 3, stride=1),
], ids=["hgnetv2_stem", "asymmetric_value_0", "replicate"])
def test_functional_pad_item_alone(how, train):
    """Zeros (or the item's edge values) around each item, wherever it lies on the canvas."""
    check(Fn(how), train)


@TRAIN
def test_functional_pad_3d_with_batch_norm_running_statistics(train):
    """MedNeXt-style 3D zero padding before a convolution without padding; alone on a larger canvas,
    batch norm in training."""
    how = Fn(lambda x: F.pad(x, (1, 1, 0, 2, 1, 0)))
    body = Between(how, 3, "batch")
    assert_alone_equals_in_batch(body, 3, (4, 5, 3), (7, 6, 5), (2, 1, 1), train, partner=False)


@pytest.mark.parametrize("how,match", [
    (lambda x: F.pad(x, (1, 1, 1, 1), value=1.0), "value=1.0"),
    (lambda x: F.pad(x, (1, 1, 1, 1), mode="reflect"), "mode='reflect'"),
    (lambda x: F.pad(x, (-1, 0, 0, 0)), "crops"),
    (lambda x: F.pad(x, (0, 0, 0, 0, 1, 1)), "channel or batch axis"),
    (lambda x: F.pad(x, (0, x.shape[-1] % 2, 0, 0)), "size of a feature map"),
])
def test_functional_pad_that_cannot_be_exact_is_refused_by_name(how, match):
    from item_alone import _InvariantN

    with pytest.raises(ValueError, match=match):
        _InvariantN(Between(Fn(how), out_channels=6 if "channel" in match else None), 2)
