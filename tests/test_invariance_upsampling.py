"""The rule book's rules for layers that make a map larger: transposed convolutions (any kernel,
stride, padding, output padding, dilation, groups; 1D, 2D, 3D; module and functional) and integer
up-sampling (nn.Upsample, F.interpolate). Each: an item inside a padded batch (a partner beside
it, garbage in the padding, the item at the origin or further in) against the item alone, in
float64, eval and train: outputs, running statistics, parameter and input gradients. What is not
exact is refused by name."""

import copy
import pickle

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from vispos import NestedTensor, Padding
from vispos.invariance.tracing._trace import trace_dual
from vispos.invariance.geometry._geometry import TransposedWindow
from vispos.invariance.rewrite._rewrite import make_padding_invariant
from trained_norms import trained_like as _trained_like

F64 = torch.float64
NORMS = {1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}
CONVS = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}
TRANSPOSED = {1: nn.ConvTranspose1d, 2: nn.ConvTranspose2d, 3: nn.ConvTranspose3d}


class _Invariant(nn.Module):
    def __init__(self, module: nn.Module, n: int):
        super().__init__()
        self.body = trace_dual(module, n)
        self.runner = make_padding_invariant(self.body, n)

    def forward(self, x: NestedTensor) -> list[NestedTensor]:
        return self.runner(self.body, x)


class _Lambda(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def assert_alone_equals_in_batch(body: nn.Module, n: int, item_size, canvas, start, train: bool,
                                 partner: bool = True) -> None:
    """``body`` run on one item alone and on a padded batch (the item at ``start``, a partner item
    at the origin when ``partner``, 5.0 in every padded cell): equal outputs on the item's cells,
    an output padding that marks exactly them, equal running statistics and, in training, equal
    parameter and input gradients. float64."""
    torch.manual_seed(0)
    body = _trained_like(body).to(F64)
    alone_net = _Invariant(body, n).train(train)
    batch_net = _Invariant(copy.deepcopy(body), n).train(train)
    g = torch.Generator().manual_seed(2)
    channels = next(m for m in body.modules() if isinstance(m, nn.modules.conv._ConvNd)).in_channels
    item = torch.randn((1, channels, *item_size), generator=g, dtype=F64, requires_grad=True)
    other_size = tuple(max(c - 1, 1) for c in canvas)
    images = torch.full((1 + partner, channels, *canvas), 5.0, dtype=F64)
    if partner:
        images[(0, slice(None), *(slice(0, s) for s in other_size))] = torch.randn(
            (channels, *other_size), generator=g, dtype=F64)
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
    weights = torch.randn(alone.tensors.shape[1:], generator=g, dtype=F64)
    (alone.tensors[0] * weights).sum().backward()
    (got * weights).sum().backward()
    for (name, p1), p2 in zip(alone_net.named_parameters(), batch_net.parameters()):
        scale = float(p1.grad.abs().max()) or 1.0
        torch.testing.assert_close(p2.grad, p1.grad, rtol=1e-9, atol=1e-12 + 1e-9 * scale, msg=name)
    torch.testing.assert_close(images.grad[(int(partner), slice(None), *region)], item.grad[0], rtol=1e-9,
                               atol=1e-12)


# ------------------------------------------------------------------ transposed convolutions
#: (kernel, stride, padding, output_padding, dilation, groups)
CASES = [
    (3, 2, 1, 1, 1, 1),   # the classic decoder up-convolution
    (2, 2, 0, 0, 1, 1),   # UNETR's: taps never meet, nothing to fill
    (4, 2, 1, 0, 1, 2),   # DCGAN's, grouped
    (3, 3, 0, 2, 1, 1),   # taps meet only through the output padding
    (3, 1, 1, 0, 2, 1),   # stride 1, dilated
    (1, 2, 0, 1, 1, 1),   # 1x1 with output padding
    (2, 3, 1, 2, 2, 4),   # output padding up to the dilation, depthwise-like groups
]


def _transposed_net(n: int, case, norm: str) -> nn.Sequential:
    k, s, p, op, d, groups = case
    layers = [TRANSPOSED[n](4, 4, k, stride=s, padding=p, output_padding=op, dilation=d, groups=groups)]
    layers.append(nn.GroupNorm(2, 4) if norm == "group" else NORMS[n](4))
    layers += [nn.ReLU(), CONVS[n](4, 3, 3, padding=1)]
    return nn.Sequential(*layers)


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "k{}s{}p{}op{}d{}g{}".format(*c))
@pytest.mark.parametrize("n", [1, 2])
def test_conv_transpose_item_alone(n, case, train):
    """An item at the origin and one further in (any start: a transposed convolution puts it at
    start * stride), with a partner and garbage in the padding; group norm in training (batch
    statistics would mix the partner in), batch norm in eval."""
    body = _transposed_net(n, case, "group" if train else "batch")
    canvas, item = (9, 12)[:n], (5, 7)[:n]
    for start in [(0,) * n, (3, 4)[:n]]:
        assert_alone_equals_in_batch(copy.deepcopy(body), n, item, canvas, start, train)


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("case", [CASES[0], CASES[1], CASES[6]], ids=["k3s2p1op1", "k2s2", "k2s3p1op2d2g4"])
def test_conv_transpose_3d_item_alone_batch_norm_running_statistics(case, train):
    """3D, alone on a larger canvas (no partner): batch norm in training takes the item's own
    statistics and updates the running ones as alone."""
    assert_alone_equals_in_batch(_transposed_net(3, case, "batch"), 3, (3, 4, 2), (5, 6, 4), (2, 1, 2), train,
                                 partner=False)


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_conv_transpose_per_axis_arguments_and_functional(train):
    """Per-axis kernel, stride, padding, output padding and dilation; F.conv_transpose2d with a
    weight of the model."""
    layer = nn.ConvTranspose2d(4, 4, (3, 2), stride=(2, 3), padding=(1, 0), output_padding=(1, 2), dilation=(1, 2))

    class Net(nn.Sequential):
        def forward(self, x):
            x = self[0](x)
            x = F.conv_transpose2d(x, self.w, None, 2, 1, 1, 2)  # groups=2
            return self[2](self[1](x))

    net = Net(layer, nn.GroupNorm(2, 4), nn.Conv2d(4, 3, 3, padding=1))
    net.register_parameter("w", nn.Parameter(torch.randn(4, 2, 3, 3) * 0.3))
    assert_alone_equals_in_batch(net, 2, (4, 5), (6, 8), (1, 3), train)


def test_transposed_window_reads_neighbours_only_where_taps_meet():
    """UNETR's 2x2 stride-2 up-convolution and a nearest up-sampling read one input cell per output
    cell: no fill before them; a 3x3 stride-2 one reads two."""
    assert not TransposedWindow((2, 2), (2, 2), (0, 0), (0, 0), (1, 1)).reads_neighbours
    assert not TransposedWindow((2,), (2,), (1,), (0,), (1,)).reads_neighbours
    assert TransposedWindow((3,), (2,), (1,), (1,), (1,)).reads_neighbours
    assert TransposedWindow((2,), (2,), (0,), (1,), (1,)).reads_neighbours  # the output padding reads the next
    assert TransposedWindow((2,), (3,), (0,), (1,), (1,)).out_size(5, 0) == F.conv_transpose1d(
        torch.zeros(1, 1, 5), torch.zeros(1, 1, 2), stride=3, output_padding=1).shape[-1]


# ------------------------------------------------------------------------------ up-sampling
UPSAMPLING = [
    (1, "nearest", 3), (1, "linear", 2), (1, "nearest-exact", 3),
    (2, "nearest", 2), (2, "nearest", (2, 3)), (2, "bilinear", 2), (2, "bilinear", (3, 2)), (2, "bicubic", 2),
    (2, "area", 3), (2, "nearest-exact", 2),
    (3, "trilinear", 2), (3, "nearest", (1, 2, 3)),
]


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("functional", [False, True], ids=["module", "functional"])
@pytest.mark.parametrize("n,mode,scale", UPSAMPLING, ids=lambda v: str(v).replace(" ", ""))
def test_integer_upsampling_item_alone(n, mode, scale, functional, train):
    """nearest / area read one cell of the item per output cell; the linear modes read the item's
    edge values (what torch's clamp reads alone) where a batch would read the next cell."""
    if functional:  # bilinear with antialias: torch's renormalised taps average copies of the edge value
        up = _Lambda(lambda x: F.interpolate(x, scale_factor=scale, mode=mode, antialias=mode == "bilinear"))
    else:
        up = nn.Upsample(scale_factor=scale, mode=mode)
    body = nn.Sequential(CONVS[n](3, 4, 3, padding=1), nn.GroupNorm(2, 4), up, nn.ReLU(), CONVS[n](4, 3, 3, padding=1))
    canvas, item = (8, 10, 5)[:n], (5, 6, 3)[:n]
    for start in [(0,) * n, (2, 3, 1)[:n]]:
        assert_alone_equals_in_batch(copy.deepcopy(body), n, item, canvas, start, train)


def test_linear_upsampling_pickles_and_copies():
    """The edge fill is a module-level graph op: the rewritten graph pickles and deep-copies."""
    body = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.Upsample(scale_factor=2, mode="bilinear"),
                         nn.Conv2d(4, 2, 3, padding=1)).to(F64)
    net = _Invariant(body, 2).eval()
    x = NestedTensor(torch.randn(2, 3, 6, 7, dtype=F64), Padding.from_sizes([(6, 7), (4, 3)], (6, 7)))
    want = net(x)[0].tensors
    for twin in (copy.deepcopy(net), pickle.loads(pickle.dumps(net))):
        torch.testing.assert_close(twin(x)[0].tensors, want, rtol=0, atol=0)


@pytest.mark.parametrize("layer,match", [
    (nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True), "align_corners=True"),
    (nn.UpsamplingBilinear2d(scale_factor=2), "align_corners=True"),
    (nn.Upsample(size=(12, 12)), "fixed size"),
    (nn.Upsample(scale_factor=1.5), "scale_factor=1.5"),
    (_Lambda(lambda x: F.interpolate(x, scale_factor=2.5, mode="bilinear")), "scale_factor=2.5"),
    (_Lambda(lambda x: F.interpolate(x, size=(9, 9))), "fixed size"),
    (_Lambda(lambda x: F.interpolate(x, size=x.shape[-2:], mode="bilinear")), "size"),
    (_Lambda(lambda x: F.interpolate(x, scale_factor=2, mode="bicubic", antialias=True)), "antialias=True"),
])
def test_inexact_upsampling_is_refused_by_name(layer, match):
    body = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), layer, nn.Conv2d(4, 2, 3, padding=1))
    with pytest.raises(ValueError, match=match) as info:
        _Invariant(body, 2)
    assert "padding_invariant=True cannot run" in str(info.value)
    assert "1 (" in str(info.value) or "interpolate" in str(info.value)


@pytest.mark.parametrize("from_shape", [False, True], ids=["constant", "from_shape"])
def test_conv_transpose_with_output_size_is_refused_by_name(from_shape):
    """``output_size=`` picks the output padding from the canvas's size (read from the map, or a
    constant made for one input size)."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.up = nn.ConvTranspose2d(3, 3, 3, stride=2, padding=1)

        def forward(self, x):
            return self.up(x, output_size=[2 * x.shape[2], 2 * x.shape[3]] if from_shape else [12, 14])

    match = "size of a feature map" if from_shape else "output_size="
    with pytest.raises(ValueError, match=r"up \(ConvTranspose2d\).*" + match):
        _Invariant(Net(), 2)
