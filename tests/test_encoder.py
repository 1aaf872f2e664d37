import pytest
import torch
from torch import nn

from vispos import NestedTensor, PositionEmbeddingSine, nested_tensor_from_tensor_list
from vispos.backbones import TimmBackbone, VolumeBackbone, backbone_border_effect, flatten_levels, unflatten_levels
from vispos.transformer import DetrEncoder, DetrEncoderLayer
from trained_norms import trained_like


def _encode(encoder, pe, level_embed, items_per_level, garbage=True):
    """Pads each level's items into a batch (padding filled with garbage: it must not matter),
    embeds positions on the masks, flattens, encodes and splits the output back into levels."""
    feats, pos = [], []
    for items in items_per_level:
        nt = nested_tensor_from_tensor_list(items)
        tensors = nt.tensors.clone()
        if garbage:
            noise = torch.randn_like(tensors) * 100
            tensors = torch.where(nt.mask[:, None], noise, tensors)
        nt = NestedTensor(tensors, nt.mask)
        feats.append(nt)
        pos.append(pe(nt))
    flat = flatten_levels(feats, pos, level_embed)
    with torch.no_grad():
        out = encoder(flat)
    return unflatten_levels(out, flat.spatial_shapes_list)


@pytest.mark.parametrize(
    "alone, others",
    [
        ([(5, 7), (3, 4)], [[(9, 8), (5, 4)], [(6, 11), (3, 6)]]),
        ([(4, 5, 3), (2, 3, 2)], [[(6, 5, 7), (3, 3, 4)], [(5, 8, 4), (3, 4, 2)]]),
    ],
    ids=["2d", "3d"],
)
@pytest.mark.parametrize("normalize_before", [False, True])
def test_padding_invariance(alone, others, normalize_before, device):
    """An item's encoder output on its valid cells is the same alone or padded into a batch with
    larger items (features fed directly: the backbone's border effect is out of the comparison)."""
    torch.manual_seed(0)
    n_axes = len(alone[0])
    d = 24 if n_axes == 3 else 32
    encoder = DetrEncoder(d, nhead=4, num_layers=2, dim_feedforward=64, dropout=0.0,
                          normalize_before=normalize_before).to(device).eval()
    pe = PositionEmbeddingSine(d // n_axes, normalize=True, offset=-0.5)
    level_embed = torch.randn(2, d, device=device)
    item = [torch.randn(d, *s, device=device) for s in alone]
    rest = [[torch.randn(d, *s, device=device) for s in sizes] for sizes in others]
    solo = _encode(encoder, pe, level_embed, [[item[lvl]] for lvl in range(2)])
    batched = _encode(encoder, pe, level_embed, [[rest[0][lvl], item[lvl], rest[1][lvl]] for lvl in range(2)])
    worst = 0.0
    for lvl, size in enumerate(alone):
        region = (1, slice(None), *(slice(0, s) for s in size))
        got, want = batched[lvl][region], solo[lvl][0]
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        worst = max(worst, float((got - want).abs().max()))
    print(f"padding invariance {n_axes}D normalize_before={normalize_before}: max abs diff {worst:.2e}")


def test_without_key_padding_mask_padding_leaks():
    """The negative control: drop the mask and the padded item's output changes."""
    torch.manual_seed(0)
    encoder = DetrEncoder(16, nhead=2, num_layers=1, dim_feedforward=32, dropout=0.0).eval()
    pe = PositionEmbeddingSine(8, normalize=True)
    item, big = torch.randn(16, 3, 4), torch.randn(16, 6, 6)
    solo = nested_tensor_from_tensor_list([item])
    pair = nested_tensor_from_tensor_list([item, big])
    with torch.no_grad():
        a = encoder(flatten_levels([solo], [pe(solo)]))
        f = flatten_levels([pair], [pe(pair)])
        b = encoder(f.src, f.pos, None)
    got = unflatten_levels(b, f.spatial_shapes_list)[0][0, :, :3, :4]
    assert (got - a.reshape(1, 16, 3, 4)[0].reshape(16, 3, 4)).abs().max() > 1e-2


def test_layer_equals_torch_transformer_layer_without_pos():
    torch.manual_seed(0)
    ours = DetrEncoderLayer(32, nhead=4, dim_feedforward=64, dropout=0.0).eval()
    ref = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True).eval()
    ref.load_state_dict({k: v for k, v in ours.state_dict().items()})
    x = torch.randn(2, 10, 32)
    mask = torch.zeros(2, 10, dtype=torch.bool)
    mask[1, 6:] = True
    with torch.no_grad():
        torch.testing.assert_close(ours(x, None, mask)[0], ref(x, src_key_padding_mask=mask)[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ours(x, None, mask)[1, :6], ref(x, src_key_padding_mask=mask)[1, :6], rtol=1e-5, atol=1e-5)


def test_pos_goes_to_queries_and_keys_only():
    torch.manual_seed(0)
    layer = DetrEncoderLayer(8, nhead=2, dim_feedforward=16, dropout=0.0).eval()
    x, pos = torch.randn(1, 5, 8), torch.randn(1, 5, 8)
    with torch.no_grad():
        attn = layer.self_attn(x + pos, x + pos, x, need_weights=False)[0]
        ref = layer.norm1(x + attn)
        ref = layer.norm2(ref + layer.linear2(torch.relu(layer.linear1(ref))))
        torch.testing.assert_close(layer(x, pos), ref)


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda e: e(torch.randn(1, 4, 8)), ValueError, r"src must be a Tensor\[B, N, 16\]"),
        (lambda e: e(torch.randn(1, 4, 16), torch.randn(1, 3, 16)), ValueError, "pos must have src's shape"),
        (lambda e: e(torch.randn(1, 4, 16), None, torch.zeros(1, 4)), TypeError, "key_padding_mask must have dtype torch.bool"),
        (lambda e: e(torch.randn(1, 4, 16), None, torch.zeros(1, 5, dtype=torch.bool)), ValueError, r"key_padding_mask must have shape \(1, 4\)"),
    ],
)
def test_encoder_forward_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call(DetrEncoder(16, nhead=2, num_layers=1, dim_feedforward=8))


@pytest.mark.parametrize(
    "kwargs, match",
    [(dict(d_model=10, nhead=4), "nhead=4 must divide d_model=10"), (dict(d_model=8, dropout=1.0), "dropout"),
     (dict(d_model=8, activation="tanh"), "activation must be one of"), (dict(d_model=8, num_layers=0), "num_layers")],
)
def test_encoder_init_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DetrEncoder(**kwargs)


def test_repr():
    assert "d_model=16, nhead=2, dim_feedforward=8, dropout=0.1, activation='relu', normalize_before=False" in repr(
        DetrEncoder(16, nhead=2, num_layers=1, dim_feedforward=8))


# ----------------------------------------------------------- the backbone's own border effect
def _trained_like(backbone):
    """Trained-like norms (timm zero-initialises the last norm of every residual block, which hides
    the border effect a trained network has), in eval mode."""
    return trained_like(backbone).eval()


def test_backbone_border_effect_2d_measured():
    """ResNet-18 (random weights, eval): features near the border see the padding."""
    from vispos.app.data import imagenet_normalize, sample_images

    torch.manual_seed(0)
    (_, img), = sample_images(["astronaut"], max_size=96)
    bb = _trained_like(TimmBackbone("resnet18", out_indices=(2, 3, 4)))
    stats = backbone_border_effect(bb, imagenet_normalize(img), (128, 160))
    for s, stride in zip(stats, bb.strides):
        print(f"2D border effect stride {stride}: max abs {s['max_abs']:.3g} ({s['rel_max']:.2f} x std), "
              f"mean abs {s['mean_abs']:.3g}, cells changed {s['frac_cells']:.0%}")
        assert s["max_abs"] > 0 and s["frac_cells"] > 0  # the effect exists; the encoder is not to blame


def test_backbone_border_effect_3d_measured():
    from vispos.app.data import mni152_template

    torch.manual_seed(0)
    vol = mni152_template(resolution=2, intensity="percentile", max_size=32)
    bb = _trained_like(VolumeBackbone("r3d_18", stem_stride=2))
    stats = backbone_border_effect(bb, vol, (40, 48, 40))
    for s, stride in zip(stats, bb.strides):
        print(f"3D border effect stride {stride}: max abs {s['max_abs']:.3g} ({s['rel_max']:.2f} x std), "
              f"mean abs {s['mean_abs']:.3g}, cells changed {s['frac_cells']:.0%}")
        assert s["max_abs"] > 0
    with pytest.raises(ValueError, match="spatial must have 3 entries"):
        backbone_border_effect(bb, vol, (8, 8, 8))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_flatten_levels_does_not_synchronise_on_cuda():
    """The level shapes travel to the device through pinned memory (no blocking copy)."""
    nt = nested_tensor_from_tensor_list([torch.zeros(3, 40, 56), torch.zeros(3, 64, 32)], size_divisibility=16)
    pe = PositionEmbeddingSine(16, normalize=True).cuda()
    levels = [NestedTensor(torch.randn(2, 32, *s), None).to("cuda") for s in ((8, 8), (4, 4))]
    levels = [nt.to("cuda").with_features(lv.tensors) for lv in levels]
    ref = flatten_levels([lv.to("cpu") for lv in levels], [pe(lv).cpu() for lv in levels])
    pos = [pe(lv) for lv in levels]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        flat = flatten_levels(levels, pos)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(flat.spatial_shapes.cpu(), ref.spatial_shapes)
    assert torch.equal(flat.level_start_index.cpu(), ref.level_start_index)
    torch.testing.assert_close(flat.src.cpu(), ref.src)
