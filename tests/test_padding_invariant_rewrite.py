"""The graph rewrite behind padding_invariant=True on the code that used to be accepted and then
gave wrong features: average pooling with ceil_mode, values read from a map's size, in-place writes
after a fill, batch norm without running statistics, and ConvNeXt (permuted axes, layer norm over
channels, global response norm). Each case: exact in float64 (outputs, running statistics,
parameter gradients, eval and train) or refused by name when the backbone is built."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from vispos import NestedTensor, Padding, nested_tensor_from_tensor_list
from vispos.backbones import TimmBackbone, TorchvisionBackbone
from vispos.invariance.rewrite._rewrite import make_padding_invariant
from vispos.invariance.tracing._trace import trace_dual
from trained_norms import trained_like as _trained_like

F64 = torch.float64


def _crop(t: torch.Tensor, index: int, shape) -> torch.Tensor:
    return t[(index, slice(None), *(slice(0, s) for s in shape))]


def assert_alone_equals_padded(bb: nn.Module, item_shape, canvas, train: bool, seed: int = 0) -> None:
    """One item alone and the same item on a larger canvas (padding full of 5.0): equal levels,
    equal running statistics after the step and equal parameter gradients, in float64."""
    bb = bb.to(F64).train(train)
    twin = copy.deepcopy(bb).train(train)
    item = torch.randn(item_shape, generator=torch.Generator().manual_seed(seed), dtype=F64)
    padded = torch.full((1, item_shape[0], *canvas), 5.0, dtype=F64)
    padded[(0, slice(None), *(slice(0, s) for s in item_shape[1:]))] = item
    alone = bb(NestedTensor(item[None], None))
    in_batch = twin(NestedTensor(padded, Padding.from_sizes([item_shape[1:]], canvas)))
    assert len(alone) == len(in_batch) > 0
    for a, p in zip(alone, in_batch):
        shape = tuple(a.tensors.shape[2:])
        assert p.padding.sizes[0] == shape
        torch.testing.assert_close(_crop(p.tensors, 0, shape), a.tensors[0], rtol=1e-10, atol=1e-10)
    ours = twin.state_dict()
    for key, value in bb.state_dict().items():
        torch.testing.assert_close(ours[key], value, rtol=1e-10, atol=1e-10, msg=key)
    if not train:
        return
    sum(level.tensors.square().mean() for level in alone).backward()
    sum(_crop(p.tensors, 0, a.tensors.shape[2:]).square().mean() for a, p in zip(alone, in_batch)).backward()
    for (name, p1), p2 in zip(bb.named_parameters(), twin.parameters()):
        if p1.grad is not None:
            scale = float(p1.grad.abs().max()) or 1.0
            torch.testing.assert_close(p2.grad, p1.grad, rtol=1e-8, atol=1e-12 + 1e-9 * scale, msg=name)


class _Invariant(nn.Module):
    """A module traced as timm's backbones are (every node kept: torchvision's feature extraction
    drops an in-place call whose result is unused) and rewritten; its output is one level."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.body = trace_dual(module, 2)
        self.runner = make_padding_invariant(self.body, 2)

    def forward(self, x: NestedTensor) -> list[NestedTensor]:
        return self.runner(self.body, x)


def _backbone(body: nn.Module) -> _Invariant:
    torch.manual_seed(0)
    return _Invariant(_trained_like(body))


class _Net(nn.Module):
    """conv -> batch norm -> ``middle`` -> conv: a layer between two that read neighbours."""

    def __init__(self, middle):
        super().__init__()
        self.c1, self.bn, self.c2 = nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.Conv2d(4, 5, 3, padding=1)
        self.middle = middle

    def forward(self, x):
        return self.c2(self.middle(self.bn(self.c1(x))))


class _Lambda(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


# ------------------------------------------------------------------------- average pooling
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("padding", [0, 1])
@pytest.mark.parametrize("count_include_pad", [True, False])
@pytest.mark.parametrize("functional", [False, True], ids=["module", "functional"])
def test_avg_pool_ceil_mode_divides_by_the_items_own_window(train, padding, count_include_pad, functional):
    """torch shortens the last window's divisor at the input's edge with ceil_mode: alone that edge
    is the item's, on a canvas it is the canvas's. Odd item sizes put a window across the edge."""
    if functional:
        pool = _Lambda(lambda x: F.avg_pool2d(x, 3, 2, padding, True, count_include_pad))
    else:
        pool = nn.AvgPool2d(3, 2, padding, ceil_mode=True, count_include_pad=count_include_pad)
    body = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), pool, nn.Conv2d(4, 5, 3, padding=1))
    assert_alone_equals_padded(_backbone(body), (3, 13, 10), (18, 17), train)


# --------------------------------------------------------------- values read from a map's size
class _MeanBySize(nn.Module):
    """Squeeze-excitation whose mean is written as ``sum / (H * W)``."""

    def __init__(self, keepdim: bool, by_size: bool):
        super().__init__()
        self.keepdim, self.by_size = keepdim, by_size
        self.fc = nn.Conv2d(4, 4, 1)

    def forward(self, x):
        if self.by_size:
            area = x.size(2) * x.size(3)
        else:
            _, _, h, w = x.shape
            area = h * w
        s = x.sum((2, 3), keepdim=self.keepdim) / area
        if not self.keepdim:
            s = s[:, :, None, None]
        return x * self.fc(s).sigmoid()


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("keepdim", [True, False])
@pytest.mark.parametrize("by_size", [False, True], ids=["shape", "size"])
def test_mean_written_as_sum_over_height_times_width_is_each_items_mean(train, keepdim, by_size):
    assert_alone_equals_padded(_backbone(_Net(_MeanBySize(keepdim, by_size))), (3, 11, 9), (16, 14), train)


class _CoordConv(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(5, 4, 1)

    def forward(self, x):
        ramp = torch.linspace(-1, 1, x.shape[3], dtype=x.dtype, device=x.device)
        return self.conv(torch.cat([x, ramp.expand(x.shape[0], 1, x.shape[2], -1)], 1))


class _Scaled(nn.Module):
    def forward(self, x):
        return x * x.shape[-1] ** -0.5


class _Ramp(nn.Module):
    def forward(self, x):
        return x + torch.arange(x.size(2), dtype=x.dtype)[:, None]


class _Numel(nn.Module):
    def forward(self, x):
        return x.sum((2, 3), keepdim=True) / (x.numel() / (x.shape[0] * x.shape[1])) + x


class _SumOverOneAxis(nn.Module):
    def forward(self, x):
        return x.sum((2, 3), keepdim=True) / x.shape[3] + x


@pytest.mark.parametrize("middle", [_CoordConv(), _Scaled(), _Ramp(), _Numel(), _SumOverOneAxis()],
                         ids=["coordconv", "scale", "ramp", "numel", "one_axis"])
def test_values_read_from_a_maps_size_are_refused_by_name(middle):
    with pytest.raises(ValueError, match=r"padding_invariant=True cannot run .* in middle .*size of a feature map"):
        _backbone(_Net(middle))


class _BatchAndChannels(nn.Module):
    """The batch and channel sizes, the rank and dtype are the same alone and in a batch."""

    def forward(self, x):
        b, c = x.shape[0], x.size(1)
        return x * (c / 4) * x.dim() + x.new_zeros(b, c, 1, 1, dtype=x.dtype)


def test_batch_and_channel_sizes_are_not_canvas_sizes():
    assert_alone_equals_padded(_backbone(_Net(_BatchAndChannels())), (3, 9, 11), (12, 15), True)


def test_norm_with_activation_is_not_filled_in_place_in_training():
    """timm's BatchNormAct2d ends in an activation whose backward may read its output: a fill in
    place there would fail autograd's version check; the fill goes to the reader instead."""
    torch.manual_seed(0)
    bb = _trained_like(TimmBackbone("regnetx_002", out_indices=(1, 2), padding_invariant=True))  # ReLU
    assert_alone_equals_padded(bb, (3, 45, 37), (64, 52), True)


# ---------------------------------------------------------------------------- in-place writes
class _WriteAfterFill(nn.Module):
    """``a`` feeds a convolution through a ReLU (its padding is zero-filled where the convolution
    that made it wrote it: the ReLU keeps zeros zero), then is written in place, then feeds another
    convolution, which must see zeros outside the item again. (The ReLU keeps its output, not
    ``a``, for the backward pass, so autograd allows the write.)"""

    def __init__(self, op: str):
        super().__init__()
        self.c1, self.c2, self.c3 = (nn.Conv2d(3 if i == 0 else 4, 4, 3, padding=1) for i in range(3))
        self.op = op

    def forward(self, x):
        a = self.c1(x)
        b = self.c2(F.relu(a))
        if self.op == "add_":
            a.add_(1)
        elif self.op == "mul_":
            a.mul_(0.5).add_(0.25)
        elif self.op == "sigmoid_":
            a.sigmoid_()
        elif self.op == "out":
            torch.add(a, 1.0, out=a)
        elif self.op == "view":
            a[:, 1:3].add_(1)
        else:
            F.hardsigmoid(a, inplace=True)
        return b + self.c3(a)


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("op", ["add_", "mul_", "sigmoid_", "hardsigmoid", "view"])
def test_in_place_write_after_a_fill_is_filled_again(train, op):
    assert_alone_equals_padded(_backbone(_WriteAfterFill(op)), (3, 9, 10), (13, 15), train)


def test_write_through_out_argument_is_filled_again():
    """``torch.add(a, 1, out=a)`` (no autograd: ``out=`` does not take part in it)."""
    bb = _backbone(_WriteAfterFill("out")).to(F64).eval()
    item = torch.randn(3, 9, 10, dtype=F64)
    with torch.no_grad():
        alone = bb(NestedTensor(item[None], None))[0].tensors[0]
        got = bb(nested_tensor_from_tensor_list([item, torch.randn(3, 13, 15, dtype=F64)], pad_value=5.0))
    torch.testing.assert_close(got[0].tensors[0, :, :9, :10], alone, rtol=1e-10, atol=1e-10)


# -------------------------------------------------------------- batch norm without running stats
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_batch_norm_without_running_statistics_uses_valid_cells_in_eval_too(train):
    """``track_running_stats=False``: batch statistics in eval as in training, over the valid
    cells of every item of the batch (so an item's features depend on its partners, as the stock
    layer's do, but never on padding)."""
    body = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4, track_running_stats=False),
                         nn.Conv2d(4, 4, 3, padding=1))
    bb = _backbone(body)
    assert_alone_equals_padded(bb, (3, 9, 7), (12, 13), train)
    bb.to(F64).train(train)
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(3, 7, 5, generator=g, dtype=F64), torch.randn(3, 4, 9, generator=g, dtype=F64)
    with torch.no_grad():
        got = bb(nested_tensor_from_tensor_list([a, b], pad_value=100.0))[0].tensors
        conv1, bn, conv2 = (bb.body.get_submodule(name) for name in ("0", "1", "2"))
        cells = torch.cat([conv1(a[None]).flatten(2), conv1(b[None]).flatten(2)], 2)
        mean, var = cells.mean((0, 2)), cells.var((0, 2), unbiased=False)

        def norm(t):
            return (t - mean[:, None, None]) / (var[:, None, None] + bn.eps).sqrt() * bn.weight[:, None, None] \
                + bn.bias[:, None, None]

        ref_a, ref_b = conv2(norm(conv1(a[None])[0])[None])[0], conv2(norm(conv1(b[None])[0])[None])[0]
    torch.testing.assert_close(got[0, :, :7, :5], ref_a)
    torch.testing.assert_close(got[1, :, :4, :9], ref_b)


# ------------------------------------------------------------------------------------ ConvNeXt
CONVNEXTS = {
    "timm_convnext_atto": lambda: TimmBackbone("convnext_atto", out_indices=(1, 2), padding_invariant=True),
    "timm_convnextv2_atto": lambda: TimmBackbone("convnextv2_atto", out_indices=(1, 2), padding_invariant=True),
}


def _torchvision_convnext(stochastic_depth_prob: float = 0.0) -> TorchvisionBackbone:
    import torchvision

    model = torchvision.models.convnext_tiny(stochastic_depth_prob=stochastic_depth_prob)
    model.features[0] = nn.Sequential(*model.features[0])  # the stem's conv and LayerNorm2d, same keys
    return TorchvisionBackbone(model, return_nodes=["features.1", "features.3"], padding_invariant=True)


def _timm_convnext_channels_last() -> nn.Module:
    """convnext_atto with the channels-last MLP of convnext_tiny and larger (timm's LayerNorm and
    Linear layers between two permutes)."""
    import timm

    return _Invariant(timm.create_model("convnext_atto", features_only=True, out_indices=(1, 2), conv_mlp=False))


CONVNEXTS["torchvision_convnext_tiny"] = _torchvision_convnext
CONVNEXTS["timm_convnext_atto_channels_last"] = _timm_convnext_channels_last


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("name", list(CONVNEXTS))
def test_convnext_exact(name, train):
    """Permute -> layer norm over channels -> permute back, timm's LayerNorm2d, depthwise 7x7
    convolutions, pointwise linears on channels-last maps, ConvNeXt V2's global response norm
    (over each item's own cells), layer scale."""
    torch.manual_seed(0)
    bb = _trained_like(CONVNEXTS[name]())
    assert_alone_equals_padded(bb, (3, 70, 58), (96, 84), train)


def test_convnext_v2_two_items_each_as_alone():
    torch.manual_seed(0)
    bb = _trained_like(CONVNEXTS["timm_convnextv2_atto"]()).to(F64).eval()
    g = torch.Generator().manual_seed(4)
    a, b = torch.randn(3, 70, 58, generator=g, dtype=F64), torch.randn(3, 50, 90, generator=g, dtype=F64)
    with torch.no_grad():
        batch = bb(nested_tensor_from_tensor_list([a, b]))
        for index, item in enumerate((a, b)):
            for alone, level in zip(bb(NestedTensor(item[None], None)), batch):
                shape = tuple(alone.tensors.shape[2:])
                torch.testing.assert_close(_crop(level.tensors, index, shape), alone.tensors[0], rtol=1e-10, atol=1e-10)


def test_stochastic_depth_is_per_sample_and_accepted():
    """torchvision's stochastic depth multiplies each sample by one draw: it reads no neighbour.
    With it in training, the features of the item's cells are its own times its draw."""
    bb = _torchvision_convnext(stochastic_depth_prob=0.5).train()
    with torch.no_grad():
        levels = bb(nested_tensor_from_tensor_list([torch.randn(3, 64, 48), torch.randn(3, 40, 72)]))
    assert [tuple(level.padding.sizes[0]) for level in levels] == [(16, 12), (8, 6)]


class _Permuted(nn.Module):
    def __init__(self, what: str):
        super().__init__()
        self.what, self.norm, self.fc = what, nn.LayerNorm(4), nn.Linear(7, 7)

    def forward(self, x):
        if self.what == "norm_over_width":
            return self.fc(x.permute(0, 1, 3, 2)).permute(0, 1, 3, 2)
        if self.what == "conv_on_channels_last":
            return F.avg_pool2d(x.permute(0, 2, 3, 1), 2).permute(0, 3, 1, 2)
        return x.permute(1, 0, 2, 3)


@pytest.mark.parametrize("what, match", [
    ("norm_over_width", r"over an axis that is not the channels"),
    ("conv_on_channels_last", r"whose axes were permuted"),
    ("batch_moved", r"permutes a feature map with dims \(1, 0, 2, 3\)"),
])
def test_permuted_maps_refused_where_not_cell_wise(what, match):
    with pytest.raises(ValueError, match=match):
        _backbone(_Net(_Permuted(what)))
