import itertools

import pytest
import torch
from torch import nn

from vispos import NestedTensor, PositionEmbeddingSine, interpolate_mask, nested_tensor_from_tensor_list
from vispos.backbones import (
    FlatLevels, Joiner, TorchvisionBackbone, VolumeBackbone, flatten_levels, unflatten_levels,
)
from vispos.padding import mask_valid_ratios


# --------------------------------------------------------------- slow reference from the formulas
def _ref_flatten(srcs, masks, poss, level_embed):
    """Deformable-DETR's encoder input, cell by cell (deformable_transformer.py, N-D)."""
    b = srcs[0].shape[0]
    src_rows, pos_rows, mask_rows, shapes = [[] for _ in range(b)], [[] for _ in range(b)], [[] for _ in range(b)], []
    ratios = torch.zeros(b, len(srcs), srcs[0].dim() - 2)
    for lvl, (src, mask, pos) in enumerate(zip(srcs, masks, poss)):
        spatial = tuple(src.shape[2:])
        shapes.append(spatial)
        for i in range(b):
            for cell in itertools.product(*(range(s) for s in spatial)):  # row-major
                src_rows[i].append(src[(i, slice(None), *cell)])
                pos_rows[i].append(pos[(i, slice(None), *cell)] + level_embed[lvl])
                mask_rows[i].append(mask[(i, *cell)])
            n = len(spatial)
            for axis in range(n):  # valid_H = sum(~mask[:, :, 0]) ... stacked (w, h[, d])
                line = [not bool(mask[(i, *(k if a == axis else 0 for a in range(n)))]) for k in range(spatial[axis])]
                ratios[i, lvl, n - 1 - axis] = sum(line) / spatial[axis]
    src = torch.stack([torch.stack(r) for r in src_rows])
    pos = torch.stack([torch.stack(r) for r in pos_rows])
    mask = torch.tensor([[bool(m) for m in r] for r in mask_rows])
    sizes = [int(torch.tensor(s).prod()) for s in shapes]
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return src, pos, mask, torch.tensor(shapes), torch.tensor(starts), ratios


def _levels(sizes_per_item, channels=8, n_levels=2, seed=0):
    """Random padded levels: item i's level l has spatial size sizes_per_item[i] // 2**l."""
    g = torch.Generator().manual_seed(seed)
    feats, poss = [], []
    pe = PositionEmbeddingSine(channels // len(sizes_per_item[0]), normalize=True, offset=-0.5)
    for lvl in range(n_levels):
        items = [torch.randn(channels, *[max(1, s // 2 ** lvl) for s in size], generator=g) for size in sizes_per_item]
        nt = nested_tensor_from_tensor_list(items)
        feats.append(nt)
        poss.append(pe(nt))
    return feats, poss


@pytest.mark.parametrize("sizes", [[(6, 7), (4, 9), (5, 5)], [(4, 5, 6), (3, 6, 2)]], ids=["2d", "3d"])
def test_flatten_matches_deformable_detr_formulas(sizes):
    feats, poss = _levels(sizes, channels=12 if len(sizes[0]) == 3 else 8)
    level_embed = torch.randn(2, feats[0].tensors.shape[1])
    flat = flatten_levels(feats, poss, level_embed)
    ref = _ref_flatten([f.tensors for f in feats], [f.mask for f in feats], poss, level_embed)
    assert isinstance(flat, FlatLevels)
    torch.testing.assert_close(flat.src, ref[0], rtol=0, atol=0)
    torch.testing.assert_close(flat.pos, ref[1], rtol=0, atol=0)
    assert torch.equal(flat.key_padding_mask, ref[2]) and flat.key_padding_mask.dtype == torch.bool
    assert torch.equal(flat.spatial_shapes, ref[3]) and flat.spatial_shapes.dtype == torch.long
    assert torch.equal(flat.level_start_index, ref[4]) and flat.level_start_index.dtype == torch.long
    torch.testing.assert_close(flat.valid_ratios, ref[5])
    assert flat.spatial_shapes_list == [tuple(s) for s in ref[3].tolist()]
    back = unflatten_levels(flat.src, flat.spatial_shapes_list)
    for f, b in zip(feats, back):
        assert torch.equal(f.tensors, b)


def test_valid_ratios_match_transformers():
    from transformers.models.deformable_detr.modeling_deformable_detr import DeformableDetrModel

    nt = nested_tensor_from_tensor_list([torch.zeros(1, 5, 9), torch.zeros(1, 7, 3), torch.zeros(1, 2, 2)])
    # transformers' masks are pixel masks (True = valid)
    ref = DeformableDetrModel.get_valid_ratio(None, ~nt.mask, dtype=torch.float32)
    torch.testing.assert_close(mask_valid_ratios(nt.mask), ref, rtol=0, atol=0)


def test_no_mask_and_plain_tensors():
    feats = [torch.randn(2, 4, 3, 3), NestedTensor(torch.randn(2, 4, 2, 2), None)]
    pos = [torch.randn(2, 4, 3, 3), torch.randn(2, 4, 2, 2)]
    flat = flatten_levels(feats, pos)
    assert not flat.key_padding_mask.any() and torch.equal(flat.valid_ratios, torch.ones(2, 2, 2))
    torch.testing.assert_close(flat.pos[:, :9], pos[0].flatten(2).transpose(1, 2))


@pytest.mark.parametrize(
    "feats, pos, embed, exc, match",
    [
        ([], [], None, ValueError, "at least one level"),
        ([torch.zeros(1, 4, 2, 2)], [], None, ValueError, "same length"),
        ([torch.zeros(1, 4, 2, 2), torch.zeros(1, 8, 2, 2)], [torch.zeros(1, 4, 2, 2), torch.zeros(1, 8, 2, 2)], None,
         ValueError, "need the same batch size, channels and rank .*hidden_dim"),
        ([torch.zeros(1, 4, 2, 2)], [torch.zeros(1, 4, 3, 2)], None, ValueError, r"pos\[0\] must have its level's shape"),
        ([torch.zeros(1, 4, 2, 2)], [torch.zeros(1, 4, 2, 2)], torch.zeros(2, 4), ValueError, r"level_embed must have shape \(L, C\) = \(1, 4\)"),
        (["x"], [torch.zeros(1)], None, TypeError, r"features\[0\] must be a NestedTensor or a Tensor"),
    ],
)
def test_flatten_errors(feats, pos, embed, exc, match):
    with pytest.raises(exc, match=match):
        flatten_levels(feats, pos, embed)


@pytest.fixture(scope="module")
def r18_three_levels():
    torch.manual_seed(0)
    return TorchvisionBackbone("resnet18", return_nodes=["layer2", "layer3", "layer4"]).eval()


def test_multiscale_joiner_is_deformable_detr(r18_three_levels):
    torch.manual_seed(0)
    pe = PositionEmbeddingSine(32, normalize=True, offset=-0.5)
    joiner = Joiner(r18_three_levels, pe, hidden_dim=64, num_feature_levels=5).eval()
    assert joiner.num_channels == [64] * 5 and joiner.strides == [8, 16, 32, 64, 128]
    assert joiner.level_embed.shape == (5, 64)
    assert [type(m).__name__ for m in joiner.input_proj[0]] == ["Conv2d", "GroupNorm"]
    assert joiner.input_proj[0][1].num_groups == 32 and joiner.input_proj[3][0].stride == (2, 2)
    batch = nested_tensor_from_tensor_list([torch.randn(3, 64, 96), torch.randn(3, 80, 48)])
    with torch.no_grad():
        features, pos = joiner(batch)
        raw = r18_three_levels(batch)
        # Deformable-DETR: projections of the backbone levels, then 3x3/2 convs on the last raw level
        ref = [proj(r.tensors) for proj, r in zip(joiner.input_proj, raw)]
        ref.append(joiner.input_proj[3](raw[-1].tensors))
        ref.append(joiner.input_proj[4](ref[-1]))
    for lvl, (f, r) in enumerate(zip(features, ref)):
        torch.testing.assert_close(f.tensors, r)
        want = raw[lvl].mask if lvl < 3 else interpolate_mask(batch.mask, tuple(r.shape[2:]))
        assert torch.equal(f.mask, want)
        torch.testing.assert_close(pos[lvl], pe(want), rtol=0, atol=0)
    flat = joiner.flatten(features, pos)
    assert flat.src.shape == (2, sum(f.tensors.shape[2:].numel() for f in features), 64)
    torch.testing.assert_close(flat.pos[:, :1], (pos[0][:, :, 0, 0] + joiner.level_embed[0])[:, None])


def test_joiner_3d_projections_and_flatten():
    bb = VolumeBackbone("r3d_18", return_nodes=["layer3", "layer4"], stem_stride=2)
    joiner = Joiner(bb, PositionEmbeddingSine(16, normalize=True), hidden_dim=48, num_feature_levels=3, num_groups=8).eval()
    assert isinstance(joiner.input_proj[0][0], nn.Conv3d) and joiner.strides == [8, 16, 32]
    batch = nested_tensor_from_tensor_list([torch.randn(1, 40, 32, 24), torch.randn(1, 24, 40, 32)])
    with torch.no_grad():
        features, pos = joiner(batch)
        flat = joiner.flatten(features, pos)
    assert [tuple(f.tensors.shape) for f in features] == [(2, 48, 5, 5, 4), (2, 48, 3, 3, 2), (2, 48, 2, 2, 1)]
    assert flat.spatial_shapes.tolist() == [[5, 5, 4], [3, 3, 2], [2, 2, 1]]
    assert flat.level_start_index.tolist() == [0, 100, 118]
    assert flat.valid_ratios.shape == (2, 3, 3)


def test_detr_mode_unchanged_and_state_dict(r18_three_levels):
    joiner = Joiner(r18_three_levels, PositionEmbeddingSine(16))
    assert joiner.input_proj is None and joiner.level_embed is None
    assert joiner.num_channels == [128, 256, 512]
    proj = Joiner(r18_three_levels, PositionEmbeddingSine(32), hidden_dim=64)
    keys = [k for k in proj.state_dict() if not k.startswith("backbone.")]
    assert "level_embed" in keys and "input_proj.0.0.weight" in keys and "input_proj.2.1.weight" in keys
    assert "hidden_dim=64, num_feature_levels=3, level_embed=True, input_proj=True, num_groups=32" in repr(proj)
    no_proj = Joiner(r18_three_levels, PositionEmbeddingSine(32), hidden_dim=64, input_proj=False)
    assert no_proj.num_channels == [128, 256, 512] and no_proj.level_embed.shape == (3, 64)


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(num_feature_levels=4), ValueError, "num_feature_levels=4 needs hidden_dim"),
        (dict(level_embed=True), ValueError, "level_embed=True needs hidden_dim"),
        (dict(hidden_dim=64, num_feature_levels=2), ValueError, "fewer than the backbone's 3 levels"),
        (dict(hidden_dim=64, num_feature_levels=4, input_proj=False), ValueError, "needs input_proj=True"),
        (dict(hidden_dim=48), ValueError, "hidden_dim=48 must be divisible by num_groups=32"),
        (dict(hidden_dim=128), ValueError, r"must equal the position embedding's channels \(PositionEmbeddingSine.out_channels\(2\) = 64\)"),
        (dict(hidden_dim=0), ValueError, "hidden_dim must be a positive int"),
        (dict(hidden_dim=64, input_proj="no"), TypeError, "input_proj must be a bool"),
    ],
)
def test_joiner_errors(r18_three_levels, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        Joiner(r18_three_levels, PositionEmbeddingSine(32), **kwargs)


def test_joiner_accepts_depth_added_embedding():
    """Issue 10 defect: hidden_dim is checked against the embedding's own out_channels, so
    DepthAdded (2 * num_pos_feats channels on a 3D backbone) is accepted, and its levels'
    embeddings equal the module applied to each level."""
    from vispos import PositionEmbeddingSineDepthAdded

    pe = PositionEmbeddingSineDepthAdded(32, normalize=True)
    bb = VolumeBackbone("r3d_18", return_nodes=["layer4"], stem_stride=2)
    joiner = Joiner(bb, pe, hidden_dim=64, num_groups=8).eval()
    batch = nested_tensor_from_tensor_list([torch.randn(1, 24, 32, 24), torch.randn(1, 16, 24, 32)])
    with torch.no_grad():
        features, pos = joiner(batch)
    for f, p in zip(features, pos):
        assert p.shape == (2, 64, *f.tensors.shape[2:])
        torch.testing.assert_close(p, pe(f.mask), rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"hidden_dim=96 must equal .*PositionEmbeddingSineDepthAdded.out_channels\(3\) = 64"):
        Joiner(bb, pe, hidden_dim=96, num_groups=8)


# ------------------------------------------------ issue 26 item 10: image dtypes, grid encodings
@pytest.fixture(scope="module")
def r18_last():
    torch.manual_seed(0)
    return TorchvisionBackbone("resnet18", return_nodes=["layer4"]).eval()


@pytest.mark.parametrize(
    "dtype, match",
    [
        (torch.uint8, r"x.tensors has dtype torch.uint8 but the backbone's weights are torch.float32; "
                      r"convert the images to float and normalize them first, e.g. torchvision.transforms.v2.ToDtype"),
        (torch.float16, r"x.tensors has dtype torch.float16 but the backbone's weights are torch.float32; "
                        r"cast the batch with x.to\(torch.float32\) or the model with .to\(torch.float16\), or run under torch.autocast"),
        (torch.bfloat16, r"dtype torch.bfloat16 but the backbone's weights are torch.float32"),
        (torch.float64, r"dtype torch.float64 but the backbone's weights are torch.float32"),
    ],
)
def test_joiner_refuses_image_dtypes_the_backbone_cannot_take(r18_last, dtype, match):
    joiner = Joiner(r18_last, PositionEmbeddingSine(256, normalize=True))
    batch = nested_tensor_from_tensor_list([torch.zeros(3, 32, 48, dtype=dtype), torch.zeros(3, 40, 32, dtype=dtype)])
    with pytest.raises(TypeError, match=match):
        joiner(batch)


def test_joiner_dtypes_that_work(r18_last):
    joiner = Joiner(r18_last, PositionEmbeddingSine(256, normalize=True))
    batch = nested_tensor_from_tensor_list([torch.rand(3, 32, 48), torch.rand(3, 40, 32)])
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        features, pos = joiner(batch)  # autocast casts float32 images for the convolutions
        features16, _ = joiner(batch.to(torch.bfloat16))
    assert features[0].tensors.dtype == pos[0].dtype == torch.bfloat16
    torch.testing.assert_close(features16[0].tensors, features[0].tensors)
    with pytest.raises(TypeError, match=r"dtype torch.float64 .* torch.autocast\('cpu'\)"):
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            joiner(batch.to(torch.float64))  # autocast does not cast float64


def test_joiner_with_channels_first_grid_encodings(r18_last, r18_three_levels):
    """``Joiner(backbone, PositionalEncodingPermute2D(512))`` failed at forward with "unexpected
    keyword argument 'dtype'" (the positional_encodings package's class too); both now work."""
    import positional_encodings.torch_encodings as peer

    from vispos import PositionalEncodingPermute2D

    batch = nested_tensor_from_tensor_list([torch.rand(3, 64, 96), torch.rand(3, 80, 48)])
    for pe in (PositionalEncodingPermute2D(512), peer.PositionalEncodingPermute2D(512)):
        with torch.no_grad():
            features, pos = Joiner(r18_last, pe)(batch)
        level = features[0].tensors
        assert pos[0].shape == level.shape and pos[0].dtype == level.dtype
        torch.testing.assert_close(pos[0], peer.PositionalEncodingPermute2D(512)(level), rtol=0, atol=1e-6)
    projected = Joiner(r18_three_levels, PositionalEncodingPermute2D(64), hidden_dim=64, num_feature_levels=4).eval()
    with torch.no_grad():
        features, pos = projected(batch)
    assert [p.shape[1:] for p in pos] == [f.tensors.shape[1:] for f in features]
    torch.testing.assert_close(pos[3], peer.PositionalEncodingPermute2D(64)(features[3].tensors), rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "make, kwargs, exc, match",
    [
        (lambda: __import__("vispos").PositionalEncoding2D(512), {}, TypeError,
         r"position_embedding=PositionalEncoding2D\(...\) takes channel-last input .* use PositionalEncodingPermute2D\(512\)"),
        (lambda: __import__("positional_encodings.torch_encodings").torch_encodings.PositionalEncoding2D(512), {},
         TypeError, "takes channel-last input"),
        (lambda: __import__("vispos").PositionalEncodingPermute3D(512), {}, ValueError,
         r"encodes 3 spatial axes, but the backbone's levels have 2; use PositionalEncodingPermute2D"),
        (lambda: __import__("vispos").PositionalEncodingPermute2D(256), {}, ValueError,
         r"PositionalEncodingPermute2D\(256\) must have the levels' channels, but they have \[512\]"),
        (lambda: __import__("vispos").PositionalEncodingPermute2D(256), dict(hidden_dim=128), ValueError,
         r"PositionalEncodingPermute2D\(256\) must have the levels' channels, but they have \[128\]"),
    ],
)
def test_joiner_refuses_grid_encodings_that_cannot_fit_at_construction(r18_last, make, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        Joiner(r18_last, make(), **kwargs)


def test_joiner_takes_detr_style_embedding_without_dtype(r18_last):
    """DETR's own ``PositionEmbeddingSine.forward(tensor_list)`` has no ``dtype`` keyword: it is
    called without one, and its output cast to the level's dtype."""
    inner = PositionEmbeddingSine(256, normalize=True)

    class DetrStyle(nn.Module):
        def forward(self, tensor_list):
            return inner(tensor_list).double()

    batch = nested_tensor_from_tensor_list([torch.rand(3, 64, 96), torch.rand(3, 80, 48)])
    with torch.no_grad():
        features, pos = Joiner(r18_last, DetrStyle())(batch)
    assert pos[0].dtype == torch.float32
    torch.testing.assert_close(pos[0], inner(features[0]), rtol=0, atol=0)


# ------------------------------------------ invariant projections: the rule book = the hand-written code
class _FixedLevels(nn.Module):
    """A backbone stub returning fixed float64 levels with given paddings (any input)."""

    def __init__(self, levels):
        super().__init__()
        self.levels, self.num_axes = levels, levels[0].tensors.dim() - 2
        self.num_channels = [lv.tensors.shape[1] for lv in levels]
        self.strides = [2 ** (k + 3) for k in range(len(levels))]
        self.padding_invariant = True

    def forward(self, x):
        return [NestedTensor(lv.tensors.clone(), lv.padding) for lv in self.levels]


def _window_padding(padding, conv):
    """The padding of an extra level's convolution output on each item's box (None: no box)."""
    from vispos.invariance.rules._functions import window_of
    from vispos.invariance.geometry._geometry import Geometry
    from vispos.padding import Padding

    if padding.kind == "arbitrary":
        return None
    n = padding.num_axes
    window = window_of(n, conv.kernel_size, conv.stride, conv.padding, conv.dilation)
    if padding.kind == "none":
        return Padding.none(padding.batch, tuple(window.out_size(c, a) for a, c in enumerate(padding.spatial)))
    geometry = Geometry(n)
    geometry_id = geometry.child(0, window, "extra")
    starts, sizes, canvas = geometry.boxes(padding.starts, padding.sizes, padding.spatial)[geometry_id]
    return Padding.from_sizes(sizes, canvas, starts=starts)


def _hand_written_projections(joiner, levels):
    """The Joiner's invariant projections as they were written by hand before going through the
    rule book: GroupNorm over valid cells, extra levels on filled input with box paddings, DETR's
    nearest rule for an arbitrary mask."""
    from vispos.invariance.cells._norms import group_norm
    from vispos.invariance.cells._pools import filled

    features, projs = [], list(joiner.input_proj)
    for (conv, norm), level in zip(projs, levels):
        y = conv(level.tensors)
        features.append(NestedTensor(group_norm(y, level.padding, norm.num_groups, norm.weight, norm.bias,
                                                norm.eps), level.padding))
    source = levels[-1]
    for conv, norm in projs[len(levels):]:
        padding = _window_padding(source.padding, conv)
        y = conv(filled(source.tensors, source.padding, 0.0))
        if padding is None:
            padding = source.with_features(y).padding
        source = NestedTensor(group_norm(y, padding, norm.num_groups, norm.weight, norm.bias, norm.eps), padding)
        features.append(source)
    return features


def _padded_levels(kind, n_spatial, seed=0):
    from vispos.padding import Padding

    g = torch.Generator().manual_seed(seed)
    canvases = [(13, 11, 9)[:n_spatial], (7, 6, 5)[:n_spatial]]
    levels = []
    for k, canvas in enumerate(canvases):
        t = torch.randn(3, 6 + 2 * k, *canvas, generator=g, dtype=torch.float64)
        if kind == "none":
            padding = Padding.none(3, canvas)
        elif kind == "box":
            sizes = [canvas, tuple(c - 3 - k for c in canvas), tuple(max(2, c // 2 - k) for c in canvas)]
            padding = Padding.from_sizes(sizes, canvas)
        elif kind == "offset":  # symmetric padding: boxes that start at multiples of 4
            sizes = [canvas, tuple(c - 4 for c in canvas), tuple(c - 4 for c in canvas)]
            starts = [(0,) * n_spatial, (4,) * n_spatial, (0,) + (4,) * (n_spatial - 1)]
            padding = Padding.from_sizes(sizes, canvas, starts=starts)
        else:
            mask = torch.rand(3, *canvas, generator=g) > 0.6
            padding = Padding.from_mask(mask, classify=False)
        levels.append(NestedTensor(t, padding))
    return levels


@pytest.mark.parametrize("n_spatial", [2, 3])
@pytest.mark.parametrize("kind", ["none", "box", "offset", "arbitrary"])
@pytest.mark.parametrize("training", [False, True])
def test_invariant_projections_equal_the_hand_written_ones(kind, n_spatial, training):
    """float64, eval and train, extra levels included: outputs, paddings and parameter gradients
    equal those of the hand-written projections exactly."""
    import copy

    torch.manual_seed(0)
    levels = _padded_levels(kind, n_spatial)
    joiner = Joiner(_FixedLevels(levels), PositionEmbeddingSine(24 // n_spatial, normalize=True), hidden_dim=24,
                    num_feature_levels=4, num_groups=4, padding_invariant=True).double().train(training)
    for proj in joiner.input_proj:  # a GroupNorm affine map that is not the identity
        nn.init.normal_(proj[1].weight)
        nn.init.normal_(proj[1].bias)
    reference = copy.deepcopy(joiner)
    x = NestedTensor(torch.zeros(3, 1, *levels[0].tensors.shape[2:], dtype=torch.float64), levels[0].padding)
    got, pos = joiner(x)
    want = _hand_written_projections(reference, reference.backbone(x))
    assert len(got) == len(want) == 4
    for a, b in zip(got, want):
        assert torch.equal(a.tensors, b.tensors)
        assert a.padding == b.padding and a.padding.kind == b.padding.kind
    for p, f in zip(pos, got):
        assert p.shape[2:] == f.tensors.shape[2:]
    weights = [torch.randn(f.tensors.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(k))
               for k, f in enumerate(got)]
    sum((f.tensors * w).sum() for f, w in zip(got, weights)).backward()
    sum((f.tensors * w).sum() for f, w in zip(want, weights)).backward()
    for (name, p), q in zip(joiner.input_proj.named_parameters(), reference.input_proj.parameters()):
        assert torch.equal(p.grad, q.grad), name


def test_invariant_projections_follow_the_rule_book_through_copies_and_replaced_layers():
    """The graphs are no submodules, survive deep copies and pickles, and a replaced layer is run by
    its own rule (a batch norm in eval: its affine map) or refused by name (a layer norm)."""
    import copy
    import pickle

    from vispos.invariance.cells._pools import filled

    levels = _padded_levels("box", 2)
    joiner = Joiner(_FixedLevels(levels), PositionEmbeddingSine(12, normalize=True), hidden_dim=24,
                    num_feature_levels=3, num_groups=4, padding_invariant=True).double().eval()
    keys = list(joiner.state_dict())
    x = NestedTensor(torch.zeros(3, 1, 13, 11, dtype=torch.float64), levels[0].padding)
    with torch.no_grad():
        ref, _ = joiner(x)
        for clone in (copy.deepcopy(joiner), pickle.loads(pickle.dumps(joiner))):
            for a, b in zip(clone(x)[0], ref):
                assert torch.equal(a.tensors, b.tensors) and a.padding == b.padding
    assert list(joiner.state_dict()) == keys and "padding_invariant=True" in repr(joiner)
    bn = nn.BatchNorm2d(24).double().eval()
    bn.running_mean.normal_()
    bn.running_var.uniform_(0.5, 2.0)
    joiner.input_proj[2][1] = bn
    with torch.no_grad():
        got, _ = joiner(x)
        conv = joiner.input_proj[2][0]
        want = bn(conv(filled(levels[-1].tensors, levels[-1].padding, 0.0)))
    assert torch.equal(got[2].tensors, want) and got[2].padding == ref[2].padding
    joiner.input_proj[0][1] = nn.LayerNorm(24).double()
    with pytest.raises(ValueError, match=r"input_proj\.0\.1 \(LayerNorm\).*layer norm over the trailing axes"):
        joiner(x)
