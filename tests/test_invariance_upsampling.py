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
from item_alone import assert_alone_equals_in_batch

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
    (nn.Upsample(size=(12, 12)), "fixed size"),
    (_Lambda(lambda x: F.interpolate(x, size=(9, 9))), "fixed size"),
    (_Lambda(lambda x: F.interpolate(x, size=(2 * x.shape[2], 2 * x.shape[3]), mode="bilinear")), "computed in"),
    (_Lambda(lambda x: F.interpolate(x, scale_factor=2, mode="bicubic", antialias=True)), "antialias=True"),
    (_Lambda(lambda x: F.interpolate(x, scale_factor=0.5, mode="bilinear", antialias=True)), "antialias=True"),
    (_Lambda(lambda x: F.interpolate(x, size=x.shape[-2:], mode="area", antialias=True)), "antialias=True"),
])
def test_inexact_upsampling_is_refused_by_name(layer, match):
    body = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), layer, nn.Conv2d(4, 2, 3, padding=1))
    with pytest.raises(ValueError, match=match) as info:
        _Invariant(body, 2)
    assert "padding_invariant=True cannot run" in str(info.value)
    assert "1 (" in str(info.value) or "interpolate" in str(info.value)


# ------------------------------------------------------------------ each item to its own size
class _Resize(nn.Module):
    """A convolution, a norm, a stride-2 convolution, then ``how(fine, coarse, input)`` (the call
    under test; a module: ``how(coarse)``) and a convolution that reads its neighbours."""

    def __init__(self, how, n: int, norm: str):
        super().__init__()
        self.how = how
        self.c1, self.c2 = CONVS[n](3, 4, 3, padding=1), CONVS[n](4, 4, 3, stride=2, padding=1)
        self.norm = nn.GroupNorm(2, 4) if norm == "group" else NORMS[n](4)
        self.c3 = CONVS[n](4, 2, 3, padding=1)

    def forward(self, x):
        fine = self.norm(self.c1(x))
        coarse = self.c2(fine)
        return self.c3(self.how(coarse) if isinstance(self.how, nn.Module) else self.how(fine, coarse, x))


#: how: (fine, coarse, input) -> a map; torchvision's FPN top-down path, its segmentation heads, ...
RESIZES = {
    "fpn_nearest": lambda a, b, x: a + F.interpolate(b, size=a.shape[-2:], mode="nearest"),
    "head_bilinear_to_input": lambda a, b, x: F.interpolate(b, size=x.shape[-2:], mode="bilinear",
                                                            align_corners=False),
    "sizes_by_axis": lambda a, b, x: a * F.interpolate(b, (a.shape[2], a.size(3)), mode="bilinear"),
    "size_method_slice_bicubic": lambda a, b, x: F.interpolate(b, size=a.size()[2:], mode="bicubic"),
    "align_corners_scale": lambda a, b, x: F.interpolate(b, scale_factor=2, mode="bilinear", align_corners=True),
    "align_corners_size": lambda a, b, x: F.interpolate(b, size=a.shape[2:], mode="bicubic", align_corners=True),
    "align_corners_module": nn.UpsamplingBilinear2d(scale_factor=2),
    "half_bilinear": lambda a, b, x: F.interpolate(a, scale_factor=0.5, mode="bilinear"),
    "half_nearest_module": nn.Upsample(scale_factor=0.5),
    "1.5_nearest": lambda a, b, x: F.interpolate(b, scale_factor=1.5, mode="nearest"),
    "per_axis_nearest_exact": lambda a, b, x: F.interpolate(b, scale_factor=(1.7, 2.3), mode="nearest-exact"),
    "0.6_recomputed": lambda a, b, x: F.interpolate(a, scale_factor=0.6, mode="bilinear",
                                                    recompute_scale_factor=True),
    "area_0.6": lambda a, b, x: F.interpolate(a, scale_factor=0.6, mode="area"),
    "area_to_a_map": lambda a, b, x: a - F.interpolate(b, size=a.shape[-2:], mode="area"),
}


#: one of each kind in the default run (to a map's size, align_corners, a non-integer factor)
_DEFAULT_RESIZES = {"fpn_nearest", "head_bilinear_to_input", "align_corners_module", "half_bilinear", "area_0.6"}


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("case", [c if c in _DEFAULT_RESIZES else pytest.param(c, marks=pytest.mark.exhaustive)
                                  for c in RESIZES])
def test_each_item_resized_to_its_own_size_item_alone(case, train):
    """An item at the origin and one further in (a multiple of the stride), a partner and garbage
    in the padding: each item is resized from its own size to its own output size, so its cells
    equal the item alone (outputs, parameter and input gradients); batch norm in eval, group norm
    in training (batch statistics would mix the partner in)."""
    body = _Resize(RESIZES[case], 2, "group" if train else "batch")
    for start in [(0, 0), (2, 4)]:
        assert_alone_equals_in_batch(copy.deepcopy(body), 2, (9, 11), (15, 16), start, train)


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("n,how", [
    pytest.param(1, lambda a, b, x: F.interpolate(b, size=a.shape[-1:], mode="linear", align_corners=True),
                 marks=pytest.mark.exhaustive),
    (3, lambda a, b, x: a + F.interpolate(b, size=a.shape[2:], mode="trilinear")),
    pytest.param(3, lambda a, b, x: F.interpolate(a, scale_factor=(0.5, 0.75, 1.5), mode="nearest"),
                 marks=pytest.mark.exhaustive),
], ids=["1d_linear_align_corners", "3d_trilinear_to_a_map", "3d_nearest_per_axis_factors"])
def test_each_item_resized_in_1d_and_3d_with_batch_norm_running_statistics(n, how, train):
    """Alone on a larger canvas (no partner): batch norm in training takes the item's statistics and
    updates the running ones as alone."""
    assert_alone_equals_in_batch(_Resize(how, n, "batch"), n, (7, 5, 6)[:n], (10, 9, 8)[:n], (2, 4, 2)[:n], train,
                                 partner=False)


class _Segmenter(nn.Module):
    """torchvision's FCN (its ``_SimpleSegmentationModel``: ``size=input_shape`` read from the input,
    a bilinear resize of the head's logits to it) on a small backbone."""

    def __init__(self):
        super().__init__()
        from torchvision.models._utils import IntermediateLayerGetter
        from torchvision.models.segmentation.fcn import FCN, FCNHead

        body = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                             nn.Conv2d(4, 8, 3, stride=2, padding=1))
        head = FCNHead(8, 3)
        head[3].p = 0.0  # its dropout would draw differently alone and in a batch
        self.model = FCN(IntermediateLayerGetter(body, {"3": "out"}), head)

    def forward(self, x):
        return self.model(x)["out"]


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_torchvision_segmentation_model_item_alone(train):
    """The whole model (batch norms in the backbone and the head): in eval beside a partner, in
    training alone on a larger canvas (batch statistics, running statistics as alone)."""
    pytest.importorskip("torchvision")
    assert_alone_equals_in_batch(_Segmenter(), 2, (9, 11), (15, 16), (2, 4), train, partner=not train)


class _PyramidPooling(nn.Module):
    """PSPNet's pyramid pooling: adaptive pools to 1, 2 and 3 bins (each item's own), a 1x1
    convolution each, resized back to the map's own size and added."""

    def __init__(self):
        super().__init__()
        self.convs = nn.ModuleList([nn.Conv2d(4, 4, 1) for _ in range(3)])

    def forward(self, x):
        out = x
        for bins, conv in zip((1, 2, 3), self.convs):
            pooled = conv(F.adaptive_avg_pool2d(x, bins))
            out = out + F.interpolate(pooled, size=x.shape[-2:], mode="bilinear", align_corners=True)
        return out


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_pooled_grid_resized_to_a_map_item_alone(train):
    """A grid every item fills alike (an adaptive pool) resized to a map's size: each item from the
    whole grid to its own cells."""
    body = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.GroupNorm(2, 4) if train else nn.BatchNorm2d(4),
                         _PyramidPooling(), nn.Conv2d(4, 2, 3, padding=1))
    assert_alone_equals_in_batch(body, 2, (9, 11), (15, 16), (2, 4), train)


def test_resized_padding_never_reaches_the_item():
    """NaN in every padded cell of the input: every resized output cell (the padding's too) reads
    the item's own cells only."""
    torch.manual_seed(0)
    body = _Resize(RESIZES["head_bilinear_to_input"], 2, "batch").to(F64).eval()
    net = _Invariant(body, 2).eval()
    images = torch.full((2, 3, 12, 13), float("nan"), dtype=F64)
    images[0, :, :9, :11] = torch.randn(3, 9, 11, dtype=F64)
    images[1, :, :12, :13] = torch.randn(3, 12, 13, dtype=F64)
    images[0, :, 9:, :] = float("nan")
    padding = Padding.from_sizes([(9, 11), (12, 13)], (12, 13))
    with torch.no_grad():
        (out,) = net(NestedTensor(images, padding))
        alone = body(images[:1, :, :9, :11])
    torch.testing.assert_close(out.tensors[0, :, :9, :11], alone[0])
    assert out.tensors[0, :, :9, :11].isfinite().all()


@pytest.mark.parametrize("case", ["head_bilinear_to_input", "integer_bilinear"])
def test_resize_under_torch_compile_reads_each_box_from_its_mask(case):
    """Under ``torch.compile`` the graph gets each map's box as its mask alone: the per-item resize
    and the linear up-sampling's edge fill read the boxes from the masks (no refusal as an
    arbitrary mask), and give what eager gives."""
    how = RESIZES.get(case, lambda a, b, x: F.interpolate(b, scale_factor=2, mode="bilinear"))
    torch.manual_seed(0)
    net = _Invariant(_Resize(how, 2, "batch").to(F64), 2).eval()
    torch._dynamo.reset()
    compiled = torch.compile(net, backend="eager")
    g = torch.Generator().manual_seed(0)
    images = torch.randn(3, 3, 12, 14, generator=g, dtype=F64)
    padding = Padding.from_sizes([(12, 14), (6, 10), (10, 4)], (12, 14))
    with torch.no_grad():
        (want,) = net(NestedTensor(images, padding))
        (got,) = compiled(NestedTensor(images, padding))
    torch._dynamo.reset()
    assert got.padding == want.padding
    torch.testing.assert_close(got.tensors, want.tensors)


def test_item_too_small_for_a_downsampling_is_refused_for_that_batch_only():
    """An item of 1 cell halved has no cell: refused when the batch is run, naming the layer; a
    batch of larger items runs."""
    body = _Resize(RESIZES["half_bilinear"], 2, "batch").to(F64).eval()
    net = _Invariant(body, 2).eval()
    ok = Padding.from_sizes([(8, 8), (4, 6)], (8, 8))
    net(NestedTensor(torch.randn(2, 3, 8, 8, dtype=F64), ok))
    small = Padding.from_sizes([(8, 8), (1, 6)], (8, 8))
    with pytest.raises(ValueError, match="interpolate.*too small"):
        net(NestedTensor(torch.randn(2, 3, 8, 8, dtype=F64), small))


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
