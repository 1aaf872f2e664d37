"""Windowed vision transformers on padded batches: timm's SAM / ViTDet ViT gives every item, on
its own tokens, what the invariant model gives it alone (windows aligned at the item's origin,
keys outside the item masked); Swin is refused by name where it is not exact; the simple feature
pyramid is exact through the rule book."""

import pytest
import torch

timm = pytest.importorskip("timm")


from vispos import NestedTensor, Padding, nested_tensor_from_tensor_list  # noqa: E402
from vispos.backbones import TimmBackbone  # noqa: E402
from vispos.invariance.tokens import _windowed as windowed  # noqa: E402  (after: the rule is registered on import of vispos)

SAM_TINY = dict(img_size=64, patch_size=8, embed_dim=32, depth=4, num_heads=2, global_attn_indexes=(1, 3),
                window_size=3, neck_chans=16)
# item sizes, multiples of the patch (8; timm's SAM ViT takes no other size alone): 5 x 7, 8 x 8 and
# 3 x 4 tokens, none a whole number of windows of 3
SIZES = ((40, 56), (64, 64), (24, 32))


def _randomise(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every parameter drawn at random (timm initialises the position tables and biases to zero,
    which would hide a wrong table or a leaking zero token)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.5)
    return model


def _backbone(out_indices=(1, 3), **kwargs):
    torch.manual_seed(0)
    bb = TimmBackbone("samvit_base_patch16", out_indices=out_indices, padding_invariant=True,
                      model_kwargs=dict(SAM_TINY, **kwargs))
    return _randomise(bb.double())


def _images(seed=1, sizes=SIZES):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(3, h, w, generator=g, dtype=torch.float64) for h, w in sizes]


def _alone(bb, image):
    return bb(NestedTensor(image[None], None))


def _stock(bb, image):
    """timm's own ``forward_intermediates`` alone (the token model's body is not rewritten)."""
    return bb.body(image[None])


@pytest.mark.parametrize("position", [0, 1, 2])
def test_sam_item_in_batch_equals_item_alone_eval(position):
    bb = _backbone().eval()
    images = _images()
    order = [images[(k - position) % 3] for k in range(3)]  # item 0 of `images` at `position`
    with torch.no_grad():
        levels = bb(nested_tensor_from_tensor_list(order, pad_value=3.0))
        alone = _alone(bb, images[0])
    assert len(levels) == 2 and bb.num_channels == [32, 32] and bb.strides == [8, 8]
    for level, ref in zip(levels, alone):
        assert ref.tensors.shape[2:] == (5, 7)
        assert level.padding.sizes[position] == (5, 7) and level.padding.kind == "rectangular"
        torch.testing.assert_close(level.tensors[position, :, :5, :7], ref.tensors[0], rtol=1e-10, atol=1e-10)
        assert not level.tensors[position][:, level.padding.mask[position]].any()  # zeros on padding


def test_sam_item_in_batch_equals_item_alone_training_outputs_and_gradients():
    bb = _backbone().train()
    images = _images()
    batch = nested_tensor_from_tensor_list(images, pad_value=3.0)
    g = torch.Generator().manual_seed(2)
    weights = torch.randn(32, 8, 8, generator=g, dtype=torch.float64)
    for index, image in enumerate(images):
        h, w = image.shape[1] // 8, image.shape[2] // 8
        bb.zero_grad()
        levels = bb(batch)
        sum((level.tensors[index, :, :h, :w] * weights[:, :h, :w]).sum() for level in levels).backward()
        grads = {n: p.grad.clone() for n, p in bb.named_parameters()}
        bb.zero_grad()
        alone = _alone(bb, image)
        for level, ref in zip(levels, alone):
            torch.testing.assert_close(level.tensors[index, :, :h, :w], ref.tensors[0], rtol=1e-10, atol=1e-10)
        sum((level.tensors[0] * weights[:, :h, :w]).sum() for level in alone).backward()
        assert any(g.abs().sum() > 0 for g in grads.values())
        for n, p in bb.named_parameters():
            torch.testing.assert_close(grads[n], p.grad, rtol=1e-9, atol=1e-9, msg=n)


def test_sam_whole_windows_equal_the_stock_model():
    """On a grid that is a whole number of windows nothing is masked alone: timm's own model."""
    bb = _backbone().eval()
    image = _images(sizes=((48, 72),))[0]  # 6 x 9 tokens, windows of 3
    with torch.no_grad():
        for ours, stock in zip(_alone(bb, image), _stock(bb, image)):
            torch.testing.assert_close(ours.tensors, stock, rtol=1e-10, atol=1e-10)


def test_sam_global_blocks_equal_the_stock_model_at_any_size():
    """Global blocks (relative tables resampled to the item's grid) are timm's at any size."""
    bb = _backbone(global_attn_indexes=(0, 1, 2, 3)).eval()
    image = _images(sizes=((40, 56),))[0]
    with torch.no_grad():
        for ours, stock in zip(_alone(bb, image), _stock(bb, image)):
            torch.testing.assert_close(ours.tensors, stock, rtol=1e-10, atol=1e-10)


def test_sam_edge_windows_differ_from_the_stock_model_alone():
    """The documented difference: timm alone attends to the zero tokens that pad edge windows."""
    bb = _backbone().eval()
    image = _images(sizes=((40, 56),))[0]
    with torch.no_grad():
        ours, stock = _alone(bb, image)[0].tensors, _stock(bb, image)[0]
    assert (ours - stock).abs().max() > 1e-3


def test_sam_neck_is_exact():
    """timm's ``norm=True`` (the neck: 1x1 conv, channel norm, 3x3 conv, channel norm)."""
    torch.manual_seed(0)
    model = _randomise(timm.create_model("samvit_base_patch16", **SAM_TINY).double()).eval()
    images = _images()
    batch = nested_tensor_from_tensor_list(images, pad_value=3.0)
    whole = _images(sizes=((48, 72),))[0][None]
    none = Padding.none(1, (48, 72))
    with torch.no_grad():
        stock = model.forward_intermediates(whole, indices=[3], norm=True, intermediates_only=True)
        ours, _ = windowed.sam_forward_intermediates(model, whole, none, [3], norm=True)
        torch.testing.assert_close(ours[0], stock[0], rtol=1e-10, atol=1e-10)
        maps, padding = windowed.sam_forward_intermediates(model, batch.tensors, batch.padding, [3], norm=True)
        assert maps[0].shape[1] == 16
        for index, image in enumerate(images):
            alone, _ = windowed.sam_forward_intermediates(model, image[None], Padding.none(1, image.shape[1:]),
                                                          [3], norm=True)
            h, w = padding.sizes[index]
            torch.testing.assert_close(maps[0][index, :, :h, :w], alone[0][0], rtol=1e-10, atol=1e-10)


def test_sam_padding_values_do_not_matter():
    bb = _backbone().eval()
    images = _images()
    with torch.no_grad():
        a = bb(nested_tensor_from_tensor_list(images, pad_value=0.0))
        b = bb(nested_tensor_from_tensor_list(images, pad_value=float("nan")))
    for la, lb in zip(a, b):
        torch.testing.assert_close(la.tensors, lb.tensors, rtol=0, atol=0)


def test_sam_refuses_rope_and_token_dropout_by_name():
    with pytest.raises(ValueError, match=r"cannot run VisionTransformerSAM\.rope_global / rope_window .*use_rope"):
        TimmBackbone("samvit_base_patch16", padding_invariant=True,
                     model_kwargs=dict(SAM_TINY, use_rope=True, use_rel_pos=False))
    with pytest.raises(ValueError, match=r"cannot run VisionTransformerSAM\.patch_drop .*patch dropout"):
        TimmBackbone("samvit_base_patch16", padding_invariant=True,
                     model_kwargs=dict(SAM_TINY, patch_drop_rate=0.5))


def test_sam_item_not_a_whole_number_of_patches_is_refused():
    bb = _backbone().eval()
    with pytest.raises(ValueError, match=r"item 1 of size \(30, 30\) is not a multiple of the patch \(8, 8\)"):
        bb(nested_tensor_from_tensor_list(_images(sizes=((40, 56), (30, 30)))))


# ----------------------------------------------------------------------------------------- Swin
SWIN = "shifted|windows are laid out on the canvas"


SWIN_TINY = dict(depths=(2, 2, 2), num_heads=(2, 2, 2), embed_dim=16, window_size=3)
# 11 x 15, 16 x 13 and 5 x 7 tokens of 4 pixels: odd grids at every stage, none a whole number of windows
SWIN_SIZES = ((44, 60), (64, 52), (20, 28))


def _swin(**kwargs):
    torch.manual_seed(0)
    bb = TimmBackbone("swin_tiny_patch4_window7_224", out_indices=(0, 1, 2), padding_invariant=True,
                      model_kwargs=dict(SWIN_TINY, **kwargs))
    return _randomise(bb.double())


@pytest.mark.parametrize("position", [0, 1, 2])
def test_swin_timm_item_in_batch_equals_timm_alone(position):
    bb = _swin().eval()
    images = _images(sizes=SWIN_SIZES)
    order = [images[(k - position) % 3] for k in range(3)]
    with torch.no_grad():
        levels = bb(nested_tensor_from_tensor_list(order, pad_value=3.0))
        alone = _alone(bb, images[0])
        stock = _stock(bb, images[0])
    assert bb.strides == [4, 8, 16] and bb.num_channels == [16, 32, 64]
    for level, ref, theirs, size in zip(levels, alone, stock, [(11, 15), (6, 8), (3, 4)]):
        torch.testing.assert_close(ref.tensors, theirs, rtol=1e-10, atol=1e-10)  # alone: timm's own model
        h, w = size
        assert level.padding.sizes[position] == size == tuple(theirs.shape[2:])
        torch.testing.assert_close(level.tensors[position, :, :h, :w], ref.tensors[0], rtol=1e-10, atol=1e-10)
        assert not level.tensors[position][:, level.padding.mask[position]].any()


def test_swin_timm_training_outputs_and_gradients():
    bb = _swin(drop_path_rate=0.0).train()  # timm's default 0.1 draws per item: no two runs agree
    images = _images(sizes=SWIN_SIZES)
    batch = nested_tensor_from_tensor_list(images, pad_value=-1.0)
    for index, image in enumerate(images):
        bb.zero_grad()
        levels = bb(batch)
        sizes = [level.padding.sizes[index] for level in levels]
        sum(level.tensors[index, :, :h, :w].sin().sum() for level, (h, w) in zip(levels, sizes)).backward()
        grads = {n: p.grad.clone() for n, p in bb.named_parameters()}
        bb.zero_grad()
        alone = _alone(bb, image)
        for level, ref, (h, w) in zip(levels, alone, sizes):
            torch.testing.assert_close(level.tensors[index, :, :h, :w], ref.tensors[0], rtol=1e-10, atol=1e-10)
        sum(level.tensors[0].sin().sum() for level in alone).backward()
        for n, p in bb.named_parameters():
            torch.testing.assert_close(grads[n], p.grad, rtol=1e-9, atol=1e-9, msg=n)


def test_swin_timm_fixed_size_and_graph_backbones_are_refused_by_name():
    with pytest.raises(ValueError, match=r"SwinTransformer\.layers\.0\.blocks\.0 exactly .*strict_img_size=True"):
        _swin(dynamic_img_size=False, strict_img_size=True, img_size=64)
    from vispos.backbones import TorchvisionBackbone

    model = timm.create_model("swin_tiny_patch4_window7_224", **SWIN_TINY)
    with pytest.raises(ValueError, match=rf"cannot run layers\.0\.blocks\.0 \(SwinTransformerBlock\).*({SWIN})"):
        TorchvisionBackbone(model, return_nodes={"layers.1": "0"}, padding_invariant=True)


def test_swin_torchvision_is_refused_by_name():
    from torchvision.models.swin_transformer import SwinTransformer

    from vispos.backbones import TorchvisionBackbone

    model = SwinTransformer([4, 4], 16, [2, 2], [2, 2], [7, 7])
    with pytest.raises(ValueError, match=rf"cannot run features\.1\.0\.attn \(ShiftedWindowAttention\).*({SWIN})"
                                         r".*one window covers alone is shifted"):
        TorchvisionBackbone(model, return_nodes={"features.3": "0"}, padding_invariant=True)
    TorchvisionBackbone(model, return_nodes={"features.3": "0"})


def test_swin_unetr_encoder_is_refused_by_name():
    monai_nets = pytest.importorskip("monai.networks.nets")
    from vispos.backbones import VolumeBackbone

    net = monai_nets.SwinUNETR(in_channels=1, out_channels=2, feature_size=12, spatial_dims=3, depths=(1, 1, 1, 1))
    with pytest.raises(ValueError, match=rf"cannot run SwinTransformer exactly.*({SWIN}).*get_window_size"):
        VolumeBackbone(net.swinViT, return_nodes=["layers2"], padding_invariant=True)
    with pytest.raises(ValueError, match=rf"cannot run swinViT \(SwinTransformer\) exactly.*({SWIN})"):
        VolumeBackbone(net, return_nodes=["swinViT"], padding_invariant=True)


# ---------------------------------------------------------------------------- feature pyramid
def _pyramid(**kwargs):
    from vispos.backbones import SimpleFeaturePyramid

    torch.manual_seed(0)
    return _randomise(SimpleFeaturePyramid(16, 8, **kwargs).double())


def _maps(sizes=((5, 7), (9, 6), (4, 3)), channels=16, seed=3):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(channels, h, w, generator=g, dtype=torch.float64) for h, w in sizes]


@pytest.mark.parametrize("position", [0, 1, 2])
def test_pyramid_item_in_batch_equals_item_alone(position):
    pyramid = _pyramid(top_block=True).eval()
    maps = _maps()
    order = [maps[(k - position) % 3] for k in range(3)]
    with torch.no_grad():
        levels = pyramid(nested_tensor_from_tensor_list(order, pad_value=3.0))
        alone = pyramid(NestedTensor(maps[0][None], None))
    assert pyramid.strides == [4, 8, 16, 32, 64] and pyramid.num_channels == [8] * 5
    # 5 x 7 at stride 16: x4 and x2 up, itself, floor(/2) down, then the 1x1 stride-2 top block
    expected = [(20, 28), (10, 14), (5, 7), (2, 3), (1, 2)]
    assert [tuple(r.tensors.shape[2:]) for r in alone] == expected
    for level, ref, size in zip(levels, alone, expected):
        assert level.padding.sizes[position] == size and level.padding.starts[position] == (0, 0)
        h, w = size
        torch.testing.assert_close(level.tensors[position, :, :h, :w], ref.tensors[0], rtol=1e-10, atol=1e-10)


def test_pyramid_training_outputs_and_gradients():
    pyramid = _pyramid().train()
    maps = _maps()
    batch = nested_tensor_from_tensor_list(maps, pad_value=-2.0)
    for index, item in enumerate(maps):
        pyramid.zero_grad()
        levels = pyramid(batch)
        sizes = [level.padding.sizes[index] for level in levels]
        sum(level.tensors[index, :, :h, :w].sin().sum() for level, (h, w) in zip(levels, sizes)).backward()
        grads = {n: p.grad.clone() for n, p in pyramid.named_parameters()}
        pyramid.zero_grad()
        alone = pyramid(NestedTensor(item[None], None))
        for level, ref, (h, w) in zip(levels, alone, sizes):
            torch.testing.assert_close(level.tensors[index, :, :h, :w], ref.tensors[0], rtol=1e-10, atol=1e-10)
        sum(level.tensors[0].sin().sum() for level in alone).backward()
        for n, p in pyramid.named_parameters():
            torch.testing.assert_close(grads[n], p.grad, rtol=1e-9, atol=1e-9, msg=n)


def test_pyramid_alone_is_the_stock_pyramid_and_stock_leaks():
    """Alone, the rule book changes nothing; in a padded batch the stock pyramid reads the padding."""
    pyramid = _pyramid().eval()
    stock = _pyramid(padding_invariant=False).eval()
    maps = _maps()
    with torch.no_grad():
        for ours, theirs in zip(pyramid(NestedTensor(maps[0][None], None)), stock(NestedTensor(maps[0][None], None))):
            torch.testing.assert_close(ours.tensors, theirs.tensors, rtol=0, atol=0)
        batch = stock(nested_tensor_from_tensor_list(maps, pad_value=3.0))
        alone = stock(NestedTensor(maps[0][None], None))
    h, w = alone[0].tensors.shape[2:]
    assert (batch[0].tensors[0, :, :h, :w] - alone[0].tensors[0]).abs().max() > 1e-3


def test_pyramid_layers_and_channel_norm():
    from vispos.backbones import ChannelLayerNorm

    pyramid = _pyramid()
    assert all(key.startswith("stages.") for key in pyramid.state_dict())  # the traced graph is not a submodule
    assert pyramid.extra_repr() == ("in_channels=16, out_channels=8, scale_factors=(4.0, 2.0, 1.0, 0.5), "
                                    "top_block=False, in_stride=16, padding_invariant=True")
    up4 = pyramid.stages[0]
    assert [type(m).__name__ for m in up4[:4]] == ["ConvTranspose2d", "ChannelLayerNorm", "GELU", "ConvTranspose2d"]
    assert (up4[0].out_channels, up4[3].out_channels) == (8, 4)
    assert type(pyramid.stages[3][0]).__name__ == "MaxPool2d" and pyramid.stages[3][0].kernel_size == 2
    norm = _randomise(ChannelLayerNorm(6).double())
    x = torch.randn(2, 6, 3, 4, dtype=torch.float64)
    u = x.mean(1, keepdim=True)  # detectron2's LayerNorm, written out
    s = (x - u).pow(2).mean(1, keepdim=True)
    ref = norm.weight[:, None, None] * (x - u) / torch.sqrt(s + 1e-6) + norm.bias[:, None, None]
    torch.testing.assert_close(norm(x), ref, rtol=1e-12, atol=1e-12)


def test_pyramid_bad_arguments():
    from vispos.backbones import SimpleFeaturePyramid

    with pytest.raises(ValueError, match=r"scale_factors must be non-empty, each one of .* got \(3\.0,\)"):
        SimpleFeaturePyramid(16, 8, scale_factors=(3.0,))
    with pytest.raises(ValueError, match="in_channels must be divisible by 4"):
        SimpleFeaturePyramid(18, 8)
    with pytest.raises(TypeError, match="scale_factors must be a sequence of numbers"):
        SimpleFeaturePyramid(16, 8, scale_factors="4")
    with pytest.raises(ValueError, match=r"x.tensors must be \(B, 16, H, W\), got \(1, 8, 5, 5\)"):
        SimpleFeaturePyramid(16, 8)(NestedTensor(torch.zeros(1, 8, 5, 5), None))
    with pytest.raises(TypeError, match="x must be a NestedTensor"):
        SimpleFeaturePyramid(16, 8)(torch.zeros(1, 16, 5, 5))


def test_sam_backbone_with_pyramid_is_exact():
    """A ViTDet-style detector backbone: SAM ViT levels, then the pyramid on the last one."""
    bb = _backbone(out_indices=(3,)).eval()
    pyramid = _randomise(__import__("vispos.backbones", fromlist=["SimpleFeaturePyramid"]).SimpleFeaturePyramid(
        32, 8, in_stride=8).double()).eval()
    images = _images()
    with torch.no_grad():
        levels = pyramid(bb(nested_tensor_from_tensor_list(images, pad_value=3.0)))
        for index, image in enumerate(images):
            alone = pyramid(_alone(bb, image))
            for level, ref in zip(levels, alone):
                h, w = ref.tensors.shape[2:]
                assert level.padding.sizes[index] == (h, w)
                torch.testing.assert_close(level.tensors[index, :, :h, :w], ref.tensors[0], rtol=1e-10, atol=1e-10)


def test_sam_rule_is_registered_by_importing_vispos():
    """No test import may be what registers the rule: a fresh interpreter finds it."""
    import subprocess
    import sys

    code = ("import timm, vispos\nfrom vispos.invariance import rule_for\n"
            "m = timm.create_model('samvit_base_patch16', img_size=32, patch_size=8, embed_dim=16, depth=1, num_heads=1)\n"
            "print(type(rule_for(m)).__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "TokenModelRule"


@pytest.mark.parametrize("build", ["sam", "swin", "pyramid"])
def test_copies_pickles_modes_and_the_callers_input(build):
    import copy
    import pickle

    if build == "pyramid":
        module, items = _pyramid().eval(), _maps()
    else:
        module = (_backbone() if build == "sam" else _swin()).eval()
        items = _images(sizes=SIZES if build == "sam" else SWIN_SIZES)
    batch = nested_tensor_from_tensor_list(items, pad_value=3.0)
    before = batch.tensors.clone()
    with torch.no_grad():
        ref = module(batch)
        assert torch.equal(batch.tensors, before)  # nothing the caller passed is modified
        for clone in (copy.deepcopy(module), pickle.loads(pickle.dumps(module))):
            assert not clone.training and clone.padding_invariant
            for a, b in zip(clone(batch), ref):
                torch.testing.assert_close(a.tensors, b.tensors, rtol=0, atol=0)
                assert a.padding == b.padding
    trained = copy.deepcopy(module).train()
    assert trained.training and not module.training
    assert set(trained.state_dict()) == set(module.state_dict())


def test_a_subclass_with_its_own_intermediates_is_refused():
    from timm.models.swin_transformer import SwinTransformer
    from timm.models.vision_transformer_sam import VisionTransformerSAM

    from vispos.invariance.tokens import _swin_timm

    class MySwin(SwinTransformer):
        def forward_intermediates(self, x, **kwargs):
            return super().forward_intermediates(x, **kwargs)

    class MySam(VisionTransformerSAM):
        def forward_intermediates(self, x, **kwargs):
            return super().forward_intermediates(x, **kwargs)

    with pytest.raises(ValueError, match=r"cannot run MySwin\.forward_intermediates exactly"):
        _swin_timm.check_swin(MySwin(embed_dim=16, depths=(1,), num_heads=(1,), dynamic_img_size=True))
    with pytest.raises(ValueError, match=r"cannot run MySam\.forward_intermediates exactly"):
        windowed.check_sam(MySam(**SAM_TINY))
