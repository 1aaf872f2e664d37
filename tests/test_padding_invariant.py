"""padding_invariant=True: an item of a padded batch gets, on its own cells, the features it gets
alone, on every level, in eval and training mode (issue 31)."""

import copy
import pickle

import pytest
import torch
import torchvision
from torch import nn

from vispos import NestedTensor, Padding, PositionEmbeddingSine, nested_tensor_from_tensor_list
from vispos.backbones import Joiner, TimmBackbone, TorchvisionBackbone, VolumeBackbone, freeze_batch_norm
from trained_norms import trained_like as _trained_like


def _monai_resnet():
    from monai.networks.nets import ResNet

    return ResNet("basic", layers=[1, 1, 1, 1], block_inplanes=[8, 16, 32, 64], spatial_dims=3,
                  n_input_channels=1, conv1_t_size=7, conv1_t_stride=2, num_classes=1)


# name -> (builder(padding_invariant), item shape (C, *S), partner's shape (C, *S))
BACKBONES = {
    "timm_resnet50": (lambda pi: TimmBackbone("resnet50", out_indices=(2, 3, 4), padding_invariant=pi),
                      (3, 93, 75), (3, 130, 116)),
    "torchvision_resnet50_dc5": (
        lambda pi: TorchvisionBackbone("resnet50", dilation=True, return_interm_layers=True, padding_invariant=pi),
        (3, 97, 75), (3, 128, 120)),
    "r3d_18": (lambda pi: VolumeBackbone("r3d_18", padding_invariant=pi), (1, 11, 19, 17), (1, 14, 24, 22)),
    "monai_resnet3d": (
        lambda pi: VolumeBackbone(_monai_resnet(), return_nodes=["layer1", "layer2", "layer3"], padding_invariant=pi),
        (1, 17, 19, 21), (1, 22, 24, 26)),
}


def _build(name, padding_invariant=True, dtype=torch.float64):
    builder, item_shape, other_shape = BACKBONES[name]
    torch.manual_seed(0)
    return _trained_like(builder(padding_invariant)).to(dtype), item_shape, other_shape


def _crop(level: NestedTensor, index: int, shape) -> torch.Tensor:
    return level.tensors[(index, slice(None), *(slice(0, s) for s in shape))]


@pytest.mark.parametrize("name", list(BACKBONES))
def test_item_alone_equals_item_in_batch_eval(name):
    bb, item_shape, other_shape = _build(name)
    bb.eval()
    g = torch.Generator().manual_seed(1)
    item = torch.randn(item_shape, generator=g, dtype=torch.float64)
    other = torch.randn(other_shape, generator=g, dtype=torch.float64)
    with torch.no_grad():
        alone = bb(NestedTensor(item[None], None))
        batch = bb(nested_tensor_from_tensor_list([other, item], pad_value=3.0))
    for a, p in zip(alone, batch):
        shape = tuple(a.tensors.shape[2:])
        torch.testing.assert_close(_crop(p, 1, shape), a.tensors[0], rtol=1e-9, atol=1e-9)
        # the level's padding marks exactly the cells outside the item's own feature map
        assert p.padding.kind == "rectangular" and p.padding.sizes[1] == shape
        assert p.padding.starts[1] == (0,) * len(shape)


#: training mode runs on one 2D and one 3D backbone by default; the others under ``exhaustive``
_TRAINING = [n if n in ("timm_resnet50", "monai_resnet3d") else pytest.param(n, marks=pytest.mark.exhaustive)
             for n in BACKBONES]


@pytest.mark.parametrize("name", _TRAINING)
def test_item_alone_equals_padded_item_training(name):
    """Training mode: batch statistics over the valid cells, running statistics updated from them."""
    bb, item_shape, other_shape = _build(name)
    bb.train()
    item = torch.randn(item_shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    canvas = tuple(max(a, b) + 5 for a, b in zip(item_shape[1:], other_shape[1:]))
    padded = torch.full((1, item_shape[0], *canvas), -4.0, dtype=torch.float64)
    padded[(0, slice(None), *(slice(0, s) for s in item_shape[1:]))] = item
    batch = NestedTensor(padded, Padding.from_sizes([item_shape[1:]], canvas))
    twin = copy.deepcopy(bb)
    alone = bb(NestedTensor(item[None], None))
    in_batch = twin(batch)
    for a, p in zip(alone, in_batch):
        torch.testing.assert_close(_crop(p, 0, a.tensors.shape[2:]), a.tensors[0], rtol=1e-9, atol=1e-9)
    stock, ours = bb.state_dict(), twin.state_dict()
    for key in stock:
        torch.testing.assert_close(ours[key], stock[key], rtol=1e-9, atol=1e-9, msg=key)
    # gradients of a loss on the item's cells: the same parameters' gradients
    sum(level.tensors.square().mean() for level in alone).backward()
    sum(_crop(p, 0, a.tensors.shape[2:]).square().mean() for a, p in zip(alone, in_batch)).backward()
    for (n, p1), p2 in zip(bb.named_parameters(), twin.parameters()):
        if p1.grad is not None:
            scale = float(p1.grad.abs().max()) or 1.0
            torch.testing.assert_close(p2.grad, p1.grad, rtol=1e-7, atol=1e-12 + 1e-8 * scale, msg=n)


def test_training_statistics_over_valid_cells_of_every_item():
    """Two items in a training batch: the statistics are those of both items' valid cells, as
    the two items cropped to their own sizes and concatenated along a spatial axis would give
    for a 1x1 network (no neighbours), and nothing from the padding reaches them."""
    bb = TorchvisionBackbone(nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4)), return_nodes=["1"],
                             padding_invariant=True).double().train()
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(3, 7, 5, generator=g, dtype=torch.float64), torch.randn(3, 4, 9, generator=g, dtype=torch.float64)
    out = bb(nested_tensor_from_tensor_list([a, b], pad_value=100.0))[0].tensors
    conv, bn = bb.body.get_submodule("0"), nn.BatchNorm2d(4).double().train()
    bn.load_state_dict(bb.body.get_submodule("1").state_dict() | {"running_mean": torch.zeros(4, dtype=torch.float64),
                                                                  "running_var": torch.ones(4, dtype=torch.float64),
                                                                  "num_batches_tracked": torch.tensor(0)})
    cells = torch.cat([conv(a[None]).flatten(2), conv(b[None]).flatten(2)], 2)[..., None]  # (1, 4, 35 + 36, 1)
    ref = bn(cells)[0, :, :, 0]
    torch.testing.assert_close(out[0, :, :7, :5].flatten(1), ref[:, :35])
    torch.testing.assert_close(out[1, :, :4, :9].flatten(1), ref[:, 35:])


def test_float32_to_rounding():
    bb, item_shape, other_shape = _build("timm_resnet50", dtype=torch.float32)
    bb.eval()
    item = torch.randn(item_shape, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        alone = bb(NestedTensor(item[None], None))
        batch = bb(nested_tensor_from_tensor_list([item, torch.randn(other_shape)]))
    for a, p in zip(alone, batch):
        ref = a.tensors[0]
        torch.testing.assert_close(_crop(p, 0, ref.shape[1:]), ref, rtol=1e-4, atol=1e-4 * float(ref.abs().max()))


def test_stock_backbone_leaks_where_invariant_does_not():
    """The measurement of the issue: the stock backbone's C5 changes by a large multiple of its
    standard deviation when the item is padded; the invariant one does not change."""
    from vispos.backbones import backbone_border_effect

    torch.manual_seed(0)
    stock = _trained_like(TimmBackbone("resnet50", out_indices=(2, 3, 4))).eval()
    inv = TimmBackbone("resnet50", out_indices=(2, 3, 4), padding_invariant=True).eval()
    inv.load_state_dict(stock.state_dict())
    item = torch.randn(3, 109, 87)
    leak = backbone_border_effect(stock, item, (160, 144))
    none = backbone_border_effect(inv, item, (160, 144))
    assert leak[-1]["rel_max"] > 0.5 and leak[-1]["frac_cells"] > 0.5
    assert all(level["rel_max"] < 1e-4 for level in none)


def test_no_padding_is_the_stock_backbone_and_state_dict_keys_unchanged():
    torch.manual_seed(0)
    stock = _trained_like(TimmBackbone("resnet50", out_indices=(2, 3, 4)))
    inv = TimmBackbone("resnet50", out_indices=(2, 3, 4), padding_invariant=True)
    assert list(inv.state_dict()) == list(stock.state_dict())
    inv.load_state_dict(stock.state_dict())
    x = torch.randn(2, 3, 64, 96)
    for mode in (False, True):
        stock.train(mode), inv.train(mode)
        with torch.no_grad():
            for a, b in zip(stock(NestedTensor(x, None)), inv(NestedTensor(x, None))):
                torch.testing.assert_close(b.tensors, a.tensors, rtol=0, atol=0)
                assert b.padding.kind == "none"


def test_levels_mask_by_convolution_arithmetic_not_nearest_resize():
    """DETR's nearest resize counts a mostly-padded row as valid; the invariant levels do not."""
    stock = TimmBackbone("resnet18", out_indices=(4,)).eval()
    inv = TimmBackbone("resnet18", out_indices=(4,), padding_invariant=True).eval()
    batch = nested_tensor_from_tensor_list([torch.randn(3, 51, 65), torch.randn(3, 100, 100)])
    with torch.no_grad():
        s, i = stock(batch)[0], inv(batch)[0]
        alone = inv(NestedTensor(torch.randn(1, 3, 51, 65), None))[0]
    # 51 rows: 26, 13, 7, 4, 2 by convolution arithmetic; the nearest resize of the 100-row mask
    # to 4 rows also keeps row 2 (source row 50 < 51), which is mostly padding
    assert i.padding.sizes[0] == tuple(alone.tensors.shape[2:]) == (2, 3)
    assert s.padding.sizes[0] == (3, 3)


def test_symmetric_padding_exact_when_aligned_and_refused_otherwise():
    bb, _, _ = _build("r3d_18")
    bb.eval()
    item = torch.randn(1, 12, 16, 16, dtype=torch.float64)
    canvas = (28, 48, 48)  # offsets (8, 16, 16): multiples of r3d_18's strides (8, 16, 16)
    starts = [tuple((c - s) // 2 for c, s in zip(canvas, item.shape[1:]))]
    padded = torch.zeros(1, 1, *canvas, dtype=torch.float64)
    padded[(0, slice(None), *(slice(a, a + s) for a, s in zip(starts[0], item.shape[1:])))] = item
    batch = NestedTensor(padded, Padding.from_sizes([item.shape[1:]], canvas, starts=starts))
    with torch.no_grad():
        alone = bb(NestedTensor(item[None], None))
        got = bb(batch)
    for a, p, stride in zip(alone, got, bb.level_strides):
        start = tuple(o // s for o, s in zip(starts[0], stride))
        assert p.padding.starts[0] == start
        region = (0, slice(None), *(slice(o, o + n) for o, n in zip(start, a.tensors.shape[2:])))
        torch.testing.assert_close(p.tensors[region], a.tensors[0], rtol=1e-9, atol=1e-9)
    bad = Padding.from_sizes([item.shape[1:]], canvas, starts=[(3, 16, 16)])
    with pytest.raises(ValueError, match=r"item 0 starts at 3 on axis 0 .*multiple of every stride"):
        bb(NestedTensor(padded, bad))


def test_arbitrary_mask_and_too_small_items_refused():
    bb = TimmBackbone("resnet18", out_indices=(4,), padding_invariant=True).eval()
    mask = torch.zeros(1, 64, 64, dtype=torch.bool)
    mask[0, 10:20, 10:20] = True  # a hole: no box
    with pytest.raises(ValueError, match="needs each item's box .* arbitrary mask"):
        bb(NestedTensor(torch.randn(1, 3, 64, 64), Padding.from_mask(mask, classify=True)))
    valid = TorchvisionBackbone(nn.Sequential(nn.Conv2d(3, 4, 5)), return_nodes=["0"], padding_invariant=True)
    with pytest.raises(ValueError, match=r"item 1 is 3 cells long on axis 1 at 0 \(Conv2d\).* the item alone cannot run"):
        valid(nested_tensor_from_tensor_list([torch.randn(3, 64, 64), torch.randn(3, 64, 3)]))


class _Layer(nn.Module):
    def __init__(self, layer, first=False):
        super().__init__()
        self.conv, self.layer, self.first = nn.Conv2d(3, 8, 3, padding=1), layer, first

    def forward(self, x):
        out = self.layer(self.conv(x))
        return out[0] if self.first else out


class _Flatten(nn.Module):
    def forward(self, x):
        return x.flatten(2).softmax(-1).view_as(x)


@pytest.mark.parametrize("layer, match", [
    (nn.Upsample(size=(12, 12), mode="bilinear"), r"layer \(Upsample\) .* fixed size=\(12, 12\)"),
    (nn.LayerNorm(128), r"layer \(LayerNorm\) .* trailing axes"),
    (nn.AdaptiveAvgPool2d((4, None)), r"layer \(AdaptiveAvgPool2d\) .* output_size=\(4, None\)"),
    (nn.Conv2d(8, 8, 3, padding=1, padding_mode="reflect"), r"padding_mode='reflect'"),
    (_Flatten(), r"flatten .*graph node 'flatten'.* flattens the spatial axes"),
])
def test_layers_that_cannot_be_exact_are_refused_by_name(layer, match):
    with pytest.raises(ValueError, match=match):
        TorchvisionBackbone(_Layer(layer), return_nodes=["layer"], padding_invariant=True)
    TorchvisionBackbone(_Layer(layer), return_nodes=["conv"], padding_invariant=True)  # before it: fine


def test_max_pool_indices_refused():
    with pytest.raises(ValueError, match=r"layer \(MaxPool2d\) .* return_indices=True"):
        TorchvisionBackbone(_Layer(nn.MaxPool2d(2, return_indices=True), first=True), return_nodes=["getitem"],
                            padding_invariant=True)


@pytest.mark.parametrize("name, match", [
    ("tf_efficientnet_b0", r"conv_stem \(Conv2dSame\) .* 'same' padding computed from the input's size"),
])
def test_timm_models_that_cannot_be_exact_are_refused_by_name(name, match):
    with pytest.raises(ValueError, match=match):
        TimmBackbone(name, out_indices=(1,), padding_invariant=True)


@pytest.mark.parametrize("name", ["efficientnet_b0", "regnety_002", "resnet18d", "mobilenetv3_small_100"])
def test_squeeze_excitation_and_average_pool_shortcuts_are_exact(name):
    """Global pooling inside squeeze-excitation (EfficientNet, RegNetY, MobileNetV3) and ResNet-D's
    average-pool shortcut (``ceil_mode``, ``count_include_pad=False``)."""
    torch.manual_seed(0)
    bb = _trained_like(TimmBackbone(name, out_indices=(2, 3), padding_invariant=True)).double()
    g = torch.Generator().manual_seed(5)
    item = torch.randn(3, 97, 75, generator=g, dtype=torch.float64)
    other = torch.randn(3, 130, 120, generator=g, dtype=torch.float64)
    for mode in (False, True):
        bb.train(mode)
        with torch.no_grad():
            alone = bb(NestedTensor(item[None], None))
            got = bb(nested_tensor_from_tensor_list([item, item, other]) if not mode else nested_tensor_from_tensor_list(
                [item, item], size_divisibility=64))
        for a, p in zip(alone, got):
            torch.testing.assert_close(_crop(p, 1, a.tensors.shape[2:]), a.tensors[0], rtol=1e-9, atol=1e-9)


def test_frozen_batch_norm_after_construction_and_deepcopy_pickle():
    bb = TimmBackbone("resnet18", out_indices=(3, 4), padding_invariant=True)
    freeze_batch_norm(bb, num_axes=2)  # what the demos' --norm frozen does after building
    bb.train()
    batch = nested_tensor_from_tensor_list([torch.randn(3, 70, 50), torch.randn(3, 40, 90)])
    with torch.no_grad():
        ref = bb(batch)
        for clone in (copy.deepcopy(bb), pickle.loads(pickle.dumps(bb))):
            for a, b in zip(ref, clone(batch)):
                torch.testing.assert_close(b.tensors, a.tensors)
                assert b.padding == a.padding


def test_extra_repr_and_type_checks():
    bb = TimmBackbone("resnet18", out_indices=(4,), padding_invariant=True)
    assert bb.padding_invariant and "padding_invariant=True" in repr(bb)
    assert "padding_invariant=False" in repr(TorchvisionBackbone("resnet18"))
    with pytest.raises(TypeError, match="padding_invariant must be a bool"):
        TimmBackbone("resnet18", padding_invariant=1)
    with pytest.raises(TypeError, match="padding_invariant must be a bool"):
        VolumeBackbone("r3d_18", padding_invariant="yes")


@pytest.mark.parametrize("hidden, levels", [(64, 2), (64, 3)])
def test_joiner_projections_and_extra_levels_exact(hidden, levels):
    """Deformable-DETR's input projections (1x1 conv + GroupNorm) and an extra 3x3 stride-2 level."""
    torch.manual_seed(0)
    bb = _trained_like(TimmBackbone("resnet18", out_indices=(3, 4), padding_invariant=True)).eval()
    joiner = Joiner(bb, PositionEmbeddingSine(hidden // 2, normalize=True), hidden_dim=hidden,
                    num_feature_levels=levels, num_groups=8).eval()
    assert joiner.padding_invariant  # follows the backbone
    item, other = torch.randn(3, 101, 77), torch.randn(3, 150, 160)
    with torch.no_grad():
        fa, pa = joiner(nested_tensor_from_tensor_list([item]))
        fb, pb = joiner(nested_tensor_from_tensor_list([other, item]))
    for a, b, qa, qb in zip(fa, fb, pa, pb):
        shape = tuple(a.tensors.shape[2:])
        assert b.padding.sizes[1] == shape
        torch.testing.assert_close(_crop(b, 1, shape), a.tensors[0], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(qb[(1, slice(None), *(slice(0, s) for s in shape))], qa[0], rtol=1e-5, atol=1e-5)
    stock = Joiner(bb, PositionEmbeddingSine(hidden // 2, normalize=True), hidden_dim=hidden,
                   num_feature_levels=levels, num_groups=8, padding_invariant=False).eval()
    stock.load_state_dict(joiner.state_dict())
    with torch.no_grad():
        fs, _ = stock(nested_tensor_from_tensor_list([other, item]))
    drift = (_crop(fs[0], 1, fa[0].tensors.shape[2:]) - fa[0].tensors[0]).abs().max()
    assert drift > 1e-3  # GroupNorm over the padded canvas: what the option removes


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_equals_cpu_without_host_reads_of_the_masks():
    """On CUDA the masks are built from the boxes by slicing (no host-to-device copy of sizes) and
    every level equals the CPU result; synchronising calls would raise under sync debug mode."""
    bb = _trained_like(TimmBackbone("resnet18", out_indices=(3, 4), padding_invariant=True)).eval()
    batch = nested_tensor_from_tensor_list([torch.randn(3, 70, 50), torch.randn(3, 64, 96)])
    with torch.no_grad():
        ref = bb(batch)
        bb.cuda()
        cuda_batch = batch.to("cuda")
        torch.cuda.set_sync_debug_mode("error")
        try:
            got = bb(cuda_batch)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    for a, b in zip(ref, got):
        torch.testing.assert_close(b.tensors.cpu(), a.tensors, rtol=1e-4, atol=1e-4)
        assert b.padding.sizes == a.padding.sizes
