"""Vision RoPE in real timm models: drop-in equality, and padded batches that equal each item alone.

The padded-batch recipe is the one docs/encoders/rotary.md shows: the token mask turned into an
attention mask (``attn_mask_from_padding``) and the rope module serving the batch
(``rope.padded(mask)``) around an unmodified ``forward_features``.
"""

import pytest
import torch
from torch.testing import assert_close

import vispos
from vispos import DinoV3RotaryEmbedding, MixedRotaryEmbedding

timm = pytest.importorskip("timm")
eva = pytest.importorskip("timm.models.eva")

SMALL = dict(pretrained=False, embed_dim=64, depth=2, num_heads=4)


def _dinov3(**kw):
    torch.manual_seed(0)
    return timm.create_model("vit_small_patch16_dinov3", **SMALL, **kw).eval()


def _mixed(**kw):
    torch.manual_seed(0)
    return timm.create_model("vit_small_patch16_rope_mixed_224", **SMALL, dynamic_img_size=True, **kw).eval()


def _fixed(name):  # a fixed input size: timm precomputes the grid (feat_shape) and calls get_embed()
    def make():
        torch.manual_seed(0)
        return timm.create_model(name, **SMALL, img_size=48, dynamic_img_size=False).eval()
    return make


@pytest.mark.parametrize("make, twin", [
    (_dinov3, DinoV3RotaryEmbedding), (_mixed, MixedRotaryEmbedding),
    (_fixed("vit_small_patch16_dinov3"), DinoV3RotaryEmbedding),
    (_fixed("vit_small_patch16_rope_mixed_224"), MixedRotaryEmbedding),
])
def test_replaced_rope_gives_identical_outputs(make, twin):
    model = make()
    fixed = model.rope.feat_shape is not None
    images = [torch.randn(2, 3, 48, 48)] if fixed else [torch.randn(2, 3, 64, 96), torch.randn(1, 3, 32, 16)]
    with torch.no_grad():
        before = [model(x) for x in images] + [model.forward_features(images[0])]
        model.rope = twin.from_timm(model.rope)
        after = [model(x) for x in images] + [model.forward_features(images[0])]
    for a, b in zip(before, after):
        assert torch.equal(a, b)


def test_replaced_rope_trains_identically_under_one_seed():
    """Augmentation draws inside a model's forward: the same stream as timm's."""
    model = _dinov3(rope_shift_coords=0.1, rope_jitter_coords=1.2, rope_rescale_coords=1.5).train()
    x = torch.randn(2, 3, 48, 64)
    torch.manual_seed(5)
    a = model.forward_features(x)
    model.rope = DinoV3RotaryEmbedding.from_timm(model.rope)
    torch.manual_seed(5)
    assert torch.equal(model.forward_features(x), a)


def test_mixed_model_gradients_equal():
    model = _mixed()
    twin = _mixed()
    twin.rope = MixedRotaryEmbedding.from_timm(twin.rope)
    x = torch.randn(2, 3, 32, 48)
    model.forward_features(x).square().sum().backward()
    twin.forward_features(x).square().sum().backward()
    assert_close(twin.rope.freqs.grad, model.rope.freqs.grad)


def _padded(images, where):
    """A DETR-style padded batch (``where="end"``) or one centred as MONAI pads (``"center"``)."""
    canvas = [max(s) for s in zip(*[im.shape[1:] for im in images])]
    batch = torch.zeros(len(images), 3, *canvas)
    mask = torch.ones(len(images), *canvas, dtype=torch.bool)
    starts = []
    for i, im in enumerate(images):
        h, w = im.shape[1:]
        top, left = ((canvas[0] - h) // 32 * 16, (canvas[1] - w) // 32 * 16) if where == "center" else (0, 0)
        batch[i, :, top : top + h, left : left + w] = im
        mask[i, top : top + h, left : left + w] = False
        starts.append((top // 16, left // 16))
    return batch, mask, starts


@pytest.mark.parametrize("make, twin", [(_dinov3, DinoV3RotaryEmbedding), (_mixed, MixedRotaryEmbedding)])
@pytest.mark.parametrize("where", ["end", "center"])
def test_padded_batch_equals_each_item_alone_2d(make, twin, where):
    model = make()
    model.rope = twin.from_timm(model.rope)
    torch.manual_seed(1)
    images = [torch.randn(3, 64, 96), torch.randn(3, 32, 48), torch.randn(3, 64, 32), torch.randn(3, 16, 16)]
    batch, pixel_mask, starts = _padded(images, where)
    grid = (batch.shape[2] // 16, batch.shape[3] // 16)
    tokens = vispos.interpolate_mask(pixel_mask, grid)
    prefix = model.num_prefix_tokens
    with torch.no_grad():
        with model.rope.padded(tokens):
            feats = model.forward_features(batch, attn_mask=vispos.attn_mask_from_padding(tokens, prefix))
        for i, (im, (top, left)) in enumerate(zip(images, starts)):
            alone = model.forward_features(im[None])[0]
            h, w = im.shape[1] // 16, im.shape[2] // 16
            item = feats[i, prefix:].view(*grid, -1)[top : top + h, left : left + w].reshape(h * w, -1)
            assert_close(item, alone[prefix:])
            assert_close(feats[i, :prefix], alone[:prefix])


def _blocks(num_heads=4, dim=48, depth=2, rotate_half=True):
    torch.manual_seed(0)
    return torch.nn.ModuleList(
        eva.EvaBlock(dim, num_heads, qkv_fused=True, rotate_half=rotate_half, init_values=1e-5, num_prefix_tokens=0) for _ in range(depth)
    ).eval()


@pytest.mark.parametrize("kind", ["dinov3", "mixed"])
def test_padded_volumes_equal_each_volume_alone_3d(kind):
    """timm's Eva blocks on 3D token grids: symmetric padding (MONAI's), per-item equality."""
    dim, heads = 48, 4
    if kind == "dinov3":
        rope = DinoV3RotaryEmbedding(dim // heads, num_axes=3)
        blocks = _blocks(heads, dim, rotate_half=True)
    else:
        torch.manual_seed(0)
        rope = MixedRotaryEmbedding(dim, 2, heads, num_axes=3)
        blocks = _blocks(heads, dim, rotate_half=False)
    sizes = [(4, 5, 6), (2, 3, 4), (4, 2, 6)]
    canvas = (4, 5, 6)
    torch.manual_seed(2)
    volumes = [torch.randn(*s, dim) for s in sizes]
    x = torch.zeros(len(sizes), *canvas, dim)
    mask = torch.ones(len(sizes), *canvas, dtype=torch.bool)
    starts = []
    for i, (v, s) in enumerate(zip(volumes, sizes)):
        start = tuple((c - z) // 2 for c, z in zip(canvas, s))
        sl = tuple(slice(a, a + z) for a, z in zip(start, s))
        x[(i,) + sl] = v
        mask[(i,) + sl] = False
        starts.append(sl)

    def run(tokens, table, attn_mask=None):
        for i, blk in enumerate(blocks):
            rope_i = table[i] if kind == "mixed" else table
            tokens = blk(tokens, rope=rope_i, attn_mask=attn_mask)
        return tokens

    with torch.no_grad():
        table = rope.get_embed(mask=mask)
        table = table if kind == "mixed" else table[:, None]
        out = run(x.flatten(1, 3), table, vispos.attn_mask_from_padding(mask)).view(len(sizes), *canvas, dim)
        for i, (v, s, sl) in enumerate(zip(volumes, sizes, starts)):
            alone = run(v.reshape(1, -1, dim), rope.get_embed(list(s))).view(*s, dim)
            assert_close(out[(i,) + sl], alone)


def test_attn_mask_from_padding():
    mask = torch.tensor([[[False, True], [False, True]], [[False, False], [False, False]]])
    keep = vispos.attn_mask_from_padding(mask, num_prefix_tokens=2)
    assert keep.shape == (2, 1, 1, 6) and keep.dtype == torch.bool
    assert keep[0, 0, 0].tolist() == [True, True, True, False, True, False]
    assert keep[1].all()
    with pytest.raises(TypeError, match="bool"):
        vispos.attn_mask_from_padding(mask.long())
    with pytest.raises(ValueError, match="num_prefix_tokens"):
        vispos.attn_mask_from_padding(mask, -1)
    with pytest.raises(ValueError, match="spatial axis"):
        vispos.attn_mask_from_padding(torch.zeros(3, dtype=torch.bool))
