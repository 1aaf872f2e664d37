"""Windowed vision transformers on padded batches: timm's SAM / ViTDet ViT gives every item, on
its own tokens, what the invariant model gives it alone (windows aligned at the item's origin,
keys outside the item masked); Swin is refused by name where it is not exact; the simple feature
pyramid is exact through the rule book."""

import pytest
import torch

timm = pytest.importorskip("timm")

from vispos.invariance import _windowed as windowed  # noqa: E402

from vispos import NestedTensor, Padding, nested_tensor_from_tensor_list  # noqa: E402
from vispos.backbones import TimmBackbone  # noqa: E402

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
