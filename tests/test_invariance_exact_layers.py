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


def check(how, train: bool, n: int = 2, starts=((2, 3),), **kwargs) -> None:
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


# ------------------------------------------------------------ channel axis, element-wise
def _cbam(x):
    """CBAM's spatial attention: the channel mean and max (``torch.max(..., 1, keepdim=True)[0]``
    and ``.values``) as a two-channel map."""
    pair = torch.min(x, dim=1, keepdim=True)
    return torch.cat([torch.mean(x, dim=1, keepdim=True), torch.max(x, 1, keepdim=True)[0], pair.values], dim=1)


#: how: map -> map; each reads a cell's channels alone, or each item's own pooled value
CHANNELS = {
    "softmax_log_softmax": lambda x: F.softmax(x, 1) + torch.log_softmax(x, dim=1) + x.softmax(-3),
    "argmax_argmin": lambda x: x * x.argmax(1, keepdim=True).to(x.dtype) + torch.argmin(x, 1, True).double(),
    "sum_mean_amax_amin": lambda x: x * x.sum(1, keepdim=True) - torch.mean(x, dim=1, keepdim=True)
    + x.amax(1, keepdim=True) * torch.amin(x, (1,), keepdim=True),
    "comparisons": lambda x: x * (x > 0).to(x.dtype) + x * torch.le(x, 0.2).double() + x * x.ne(0).double()
    + x * ((x >= -0.5) & (x < 0.5)).double(),
    "masked_fill_where": lambda x: x.masked_fill(x > 0.5, 0.25) + torch.where(x > 0, x, 0.1 * x)
    + x.where(x < 1, torch.zeros_like(x)),
    "likes_clamp": lambda x: torch.ones_like(x) * x + torch.full_like(x, 2.0) + x.clamp(min=-0.5, max=0.7)
    + torch.clamp_max(x, 0.3),
    "senet_expand_as": lambda x: x * torch.sigmoid(x.mean((2, 3)).view(x.size()[0], x.size()[1], 1, 1)).expand_as(x),
    "expand_to_sizes_read_from_the_map": lambda x: x * x.amax((2, 3), keepdim=True).expand(
        x.size(0), -1, x.shape[2], x.size(3)),
}


@TRAIN
@pytest.mark.parametrize("case", list(CHANNELS))
def test_channel_axis_and_element_wise_operations_item_alone(case, train):
    check(Fn(CHANNELS[case]), train)


@TRAIN
def test_cbam_channel_mean_and_max_item_alone(train):
    """The channel mean, max and min (keepdim) of CBAM's spatial attention, then its 7x7 convolution."""
    check(Fn(_cbam), train, out_channels=3)


@pytest.mark.parametrize("how,match", [
    (lambda x: x * x.sum(1)[:, None], "without keepdim=True"),
    (lambda x: x * x.argmax(1)[:, None], "without keepdim=True"),
    (lambda x: F.softmax(x, dim=2), "along dim=2"),
    (lambda x: x * torch.max(x, 2, keepdim=True)[0], "along dim=2"),
    (lambda x: x * x.mean((2,), keepdim=True), r"over dims \(2,\)"),
    (lambda x: x * x.mean((2, 3), keepdim=True).expand(x.size(0), x.size(1), x.size(2), 5), "not one feature map's"),
])
def test_channel_operations_that_cannot_be_exact_are_refused_by_name(how, match):
    from item_alone import _InvariantN

    with pytest.raises(ValueError, match=match):
        _InvariantN(Between(Fn(how)), 2)


# ---------------------------------------------------------------------- per-item statistics
STATISTICS = {
    "std_var": lambda x: x * x.std((2, 3), keepdim=True) + torch.var(x, dim=(-2, -1), keepdim=True, correction=0),
    "std_unbiased_positional": lambda x: x / (1 + x.std((2, 3), True, True)),
    "amin": lambda x: x - torch.amin(x, (2, 3), keepdim=True) + x.amin((-1, -2), True),
    "norms_p1_p2_pinf": lambda x: x / (1 + x.norm(p=1, dim=(2, 3), keepdim=True)) + x * torch.norm(
        x, 2, (2, 3), True) + x * x.norm(float("inf"), (2, 3), keepdim=True)
    + x * torch.linalg.vector_norm(x, 1, (-2, -1), True) + x * torch.linalg.vector_norm(x, dim=1, keepdim=True),
    "per_item_vector": lambda x: x * x.std((2, 3))[:, :, None, None],
}


@TRAIN
@pytest.mark.parametrize("case", list(STATISTICS))
def test_statistics_over_space_item_alone(case, train):
    """Each item's statistics over its own cells (Bessel's correction from its own cell count)."""
    check(Fn(STATISTICS[case]), train)


@pytest.mark.parametrize("how,match", [
    (lambda x: x * x.norm(p=3, dim=(2, 3), keepdim=True), "p=3"),
    (lambda x: x * x.std((2, 3), keepdim=True, correction=x.shape[1]), "a constant number only"),
    (lambda x: x * x.sum((2, 3), keepdim=True, dtype=torch.float32), "dtype=torch.float32"),
])
def test_statistics_that_cannot_be_exact_are_refused_by_name(how, match):
    from item_alone import _InvariantN

    with pytest.raises(ValueError, match=match):
        _InvariantN(Between(Fn(how)), 2)


class FunctionalInstanceNorm(nn.InstanceNorm2d):
    """An instance norm that tracks running statistics, written with ``F.instance_norm``."""

    def forward(self, x):
        return F.instance_norm(x, self.running_mean, self.running_var, self.weight, self.bias, self.training, 0.2,
                               self.eps)


@TRAIN
@pytest.mark.parametrize("functional", [False, True], ids=["module", "functional"])
def test_instance_norm_tracking_running_statistics_item_alone(functional, train):
    """In training each item's statistics over its own cells, and the running ones updated from
    them as the item alone updates them (alone on a larger canvas); in eval the running statistics
    (each cell alone), beside a partner."""
    norm = (FunctionalInstanceNorm if functional else nn.InstanceNorm2d)(4, affine=True, track_running_stats=True)
    body = Between(norm, 2, "group")
    assert_alone_equals_in_batch(body, 2, (7, 9), (11, 12), (2, 3), train, partner=not train)


@TRAIN
def test_batch_norm_without_running_statistics_item_alone(train):
    """The batch's statistics in eval too (over valid cells): alone on a larger canvas."""
    body = Between(nn.BatchNorm2d(4, track_running_stats=False), 2, "group")
    assert_alone_equals_in_batch(body, 2, (7, 9), (11, 12), (2, 3), train, partner=False)


# ------------------------------------------------------------------ fixed-size adaptive pools
def assert_item_value_alone(body: nn.Module, item_size, canvas, start, train: bool, partner: bool = True) -> None:
    """``body`` (returning one value of each item's own, ``Tensor[B, ...]``) on one item alone and
    on a padded batch (the item at ``start``, a partner at the origin unless ``partner`` is False,
    5.0 in the padding): equal values, and in training equal parameter and input gradients.
    float64."""
    from item_alone import trained_like
    from vispos import NestedTensor, Padding
    from vispos.invariance.rewrite._rewrite import make_padding_invariant
    from vispos.invariance.tracing._trace import trace_dual

    torch.manual_seed(0)
    body = trained_like(body).to(F64).train(train)
    nets = []
    for copy_ in (body, copy.deepcopy(body)):
        graph = trace_dual(copy_, 2)
        nets.append((graph, make_padding_invariant(graph, 2, per_item=True)))
    g = torch.Generator().manual_seed(2)
    item = torch.randn((1, 3, *item_size), generator=g, dtype=F64, requires_grad=True)
    images = torch.full((2, 3, *canvas), 5.0, dtype=F64)
    images[0, :, : canvas[0] - 1, : canvas[1] - 1] = torch.randn((3, canvas[0] - 1, canvas[1] - 1), generator=g,
                                                                 dtype=F64)
    box = (slice(start[0], start[0] + item_size[0]), slice(start[1], start[1] + item_size[1]))
    images[(1, slice(None), *box)] = item[0].detach()
    images.requires_grad_(True)
    padding = Padding.from_sizes([(canvas[0] - 1, canvas[1] - 1), tuple(item_size)], canvas,
                                 starts=[(0, 0), tuple(start)])
    if not partner:
        images = images[1:].detach().requires_grad_(True)
        padding = Padding.from_sizes([tuple(item_size)], canvas, starts=[tuple(start)])
    (alone,) = nets[0][1](nets[0][0], NestedTensor(item, None))
    (batch,) = nets[1][1](nets[1][0], NestedTensor(images, padding))
    torch.testing.assert_close(batch[-1], alone[0], rtol=1e-10, atol=1e-10)
    if train:
        weights = torch.randn(alone.shape[1:], generator=g, dtype=F64)
        (alone[0] * weights).sum().backward()
        (batch[-1] * weights).sum().backward()
        # to float64 rounding relative to the largest gradient (a bias before a batch norm in training
        # has a gradient of zero up to rounding, alone and in a batch alike)
        pairs = [(name, p2.grad, p1.grad) for (name, p1), p2 in zip(nets[0][0].named_parameters(),
                                                                   nets[1][0].parameters())]
        scale = max(float(want.abs().max()) for _, _, want in pairs if want is not None)
        for name, got, want in pairs:
            if want is None:
                assert got is None or not got.any(), name
            else:
                torch.testing.assert_close(got, want, rtol=1e-8, atol=1e-9 * scale, msg=name)
        want = item.grad[0]
        torch.testing.assert_close(images.grad[(-1, slice(None), *box)], want, rtol=1e-8,
                                   atol=1e-9 * float(want.abs().max()))


class PoolHead(nn.Module):
    """A convolution, group norm, a fixed-size adaptive pool (``pool``), a convolution on the pooled
    grid, a flatten and a linear classifier."""

    def __init__(self, pool, size):
        super().__init__()
        self.c1, self.norm, self.pool = nn.Conv2d(3, 4, 3, padding=1), nn.GroupNorm(2, 4), pool
        self.c2, self.fc = nn.Conv2d(4, 4, 3, padding=1), nn.Linear(4 * size[0] * size[1], 3)

    def forward(self, x):
        return self.fc(torch.flatten(self.c2(self.pool(self.norm(self.c1(x)))), 1))


@TRAIN
@pytest.mark.parametrize("pool,size", [
    (nn.AdaptiveAvgPool2d((3, 4)), (3, 4)),
    (Fn(lambda x: F.adaptive_max_pool2d(x, (2, 5))), (2, 5)),
], ids=["avg_3x4", "max_2x5_functional"])
def test_fixed_size_adaptive_pool_item_alone(pool, size, train):
    """Each item's own bins, an item further in, on an axis shorter than the output too (bins that
    repeat its cells, as alone)."""
    for item_size in [(7, 9), (2, 9)]:
        assert_item_value_alone(PoolHead(copy.deepcopy(pool), size), item_size, (11, 12), (2, 3), train)


@TRAIN
def test_torchvision_vgg_head_item_alone(train):
    """torchvision's VGG forward (features, ``AdaptiveAvgPool2d((7, 7))``, ``torch.flatten``, the
    classifier) on small features and a small classifier."""
    vgg = pytest.importorskip("torchvision.models.vgg")
    model = vgg.VGG(vgg.make_layers([4, "M", 8]), init_weights=False)
    model.classifier = nn.Sequential(nn.Linear(8 * 7 * 7, 6), nn.ReLU(), nn.Dropout(0.0), nn.Linear(6, 3))
    assert_item_value_alone(model, (10, 12), (13, 16), (2, 4), train)


# ---------------------------------------------------------------------- channel shuffle
def _channel_shuffle(x, groups=2):
    """torchvision's ``channel_shuffle`` (ShuffleNet V2), as written there."""
    batchsize, num_channels, height, width = x.size()
    channels_per_group = num_channels // groups
    x = x.view(batchsize, groups, channels_per_group, height, width)
    x = torch.transpose(x, 1, 2).contiguous()
    x = x.view(batchsize, num_channels, height, width)
    return x


@TRAIN
@pytest.mark.parametrize("how", [
    _channel_shuffle,
    lambda x: x.reshape(x.shape[0], 2, 2, x.shape[2], x.shape[3]).transpose(1, 2).reshape(
        x.shape[0], -1, x.shape[2], x.shape[3]),
], ids=["torchvision", "reshape"])
def test_channel_shuffle_item_alone(how, train):
    """The channels viewed as groups, the groups swapped, viewed back: each cell's channels
    rearranged alone."""
    check(Fn(how), train)


@pytest.mark.parametrize("how,match", [
    (lambda x: x.view(x.shape[0], x.shape[1], -1, 1), "not the map's own"),
    (lambda x: x.view(x.shape[0], 2, 2, x.shape[2], x.shape[3]).mean((3, 4), keepdim=True).view(
        x.shape[0], 4, 1, 1) * x, r"over dims \(3, 4\)"),
    (lambda x: x.view(x.shape[0], 2, 2, x.shape[2], x.shape[3]).transpose(1, 3).reshape(x.shape), "moved"),
])
def test_reshapes_that_move_cells_are_refused_by_name(how, match):
    from item_alone import _InvariantN

    with pytest.raises(ValueError, match=match):
        _InvariantN(Between(Fn(how)), 2)


@pytest.mark.parametrize("train", [False, pytest.param(True, marks=pytest.mark.exhaustive)], ids=["eval", "train"])
def test_torchvision_shufflenet_item_alone(train):
    """The whole classifier (batch norms, channel shuffles, the global mean, the classifier): in eval
    beside a partner, in training alone on a larger canvas."""
    models = pytest.importorskip("torchvision.models")
    model = models.shufflenet_v2_x0_5(num_classes=5)
    assert_item_value_alone(model, (32, 40), (64, 64), (32, 0), train, partner=not train)


# ------------------------------------------------------------------------------ whole models
@pytest.mark.exhaustive
@pytest.mark.parametrize("name", ["ecaresnet26t", "seresnet18", "hgnetv2_b0"])
def test_timm_models_with_these_layers_item_alone(name):
    """timm's ECA and squeeze-excitation ResNets (a pooled gate expanded over the map) and hgnetv2
    (F.pad in its stem), whole, in eval beside a partner."""
    timm = pytest.importorskip("timm")
    model = timm.create_model(name, pretrained=False, num_classes=3)
    assert_item_value_alone(model, (64, 96), (96, 128), (32, 0), False)
