import copy
import math
import pickle
import warnings

import numpy as np
import pytest
import torch
from monai.networks.blocks.pos_embed_utils import build_sincos_position_embedding
from timm.layers.pos_embed_sincos import build_sincos2d_pos_embed
from torch.testing import assert_close

from vispos.encodings.presets import (
    PositionEmbeddingSineDepthAdded,
    dino_sine,
    mae_sincos_2d,
    monai_sincos,
    timm_sincos_2d,
)
from vispos.nested_tensor import NestedTensor

EXACT = dict(rtol=0, atol=0)


def _tol(device):
    return EXACT if device.type == "cpu" else {}


# ----------------------------------------------------------------------------- timm
@pytest.mark.parametrize("feat_shape", [(14, 14), (7, 12), (1, 5)])
@pytest.mark.parametrize("dim", [64, 384, 1024])
@pytest.mark.parametrize("reverse_coord", [False, True])
@pytest.mark.parametrize("interleave_sin_cos", [False, True])
def test_timm_parity(feat_shape, dim, reverse_coord, interleave_sin_cos):
    expected = build_sincos2d_pos_embed(list(feat_shape), dim, 10000.0, reverse_coord, interleave_sin_cos)
    out = timm_sincos_2d(feat_shape, dim, 10000.0, reverse_coord, interleave_sin_cos)
    assert_close(out, expected, **EXACT)


def test_timm_parity_temperature_dtype_device(device):
    expected = build_sincos2d_pos_embed([9, 6], 128, temperature=100.0, dtype=torch.bfloat16)
    out = timm_sincos_2d((9, 6), 128, temperature=100.0, device=device, dtype=torch.bfloat16)
    assert out.dtype == torch.bfloat16 and out.device.type == device.type
    assert_close(out.cpu(), expected, **_tol(device))


def test_timm_layout_is_sin_y_sin_x_cos_y_cos_x():
    out = timm_sincos_2d((3, 4), 8)  # 2 frequencies per axis: [sin y (2), sin x (2), cos y (2), cos x (2)]
    y, x = torch.meshgrid(torch.arange(3.0), torch.arange(4.0), indexing="ij")
    w = torch.tensor([1.0, 0.01])
    ay, ax = y.reshape(-1, 1) * w, x.reshape(-1, 1) * w
    assert_close(out, torch.cat((ay.sin(), ax.sin(), ay.cos(), ax.cos()), dim=1))


# ----------------------------------------------------------------------------- MAE
def mae_reference(embed_dim, grid_size, cls_token=False):
    """MAE's util/pos_embed.py formula, written with numpy in float64."""
    gh, gw = (grid_size, grid_size) if isinstance(grid_size, int) else grid_size
    grid_w, grid_h = np.meshgrid(np.arange(gw, dtype=np.float32), np.arange(gh, dtype=np.float32))

    def one_axis(dim, pos):
        omega = np.arange(dim // 2, dtype=np.float64) / (dim / 2.0)
        omega = 1.0 / 10000**omega
        out = np.einsum("m,d->md", pos.reshape(-1), omega)
        return np.concatenate([np.sin(out), np.cos(out)], axis=1)

    emb = np.concatenate([one_axis(embed_dim // 2, grid_w), one_axis(embed_dim // 2, grid_h)], axis=1)
    if cls_token:
        emb = np.concatenate([np.zeros([1, embed_dim]), emb], axis=0)
    return torch.from_numpy(emb).float()


@pytest.mark.parametrize("embed_dim, grid_size", [(768, 14), (1024, 16), (64, (5, 9)), (16, 1)])
@pytest.mark.parametrize("cls_token", [False, True])
def test_mae_parity(embed_dim, grid_size, cls_token):
    out = mae_sincos_2d(embed_dim, grid_size, cls_token)
    assert_close(out, mae_reference(embed_dim, grid_size, cls_token), **EXACT)
    gh, gw = (grid_size, grid_size) if isinstance(grid_size, int) else grid_size
    assert out.shape == (int(cls_token) + gh * gw, embed_dim) and out.dtype == torch.float32


def test_mae_float64_output():
    out = mae_sincos_2d(32, 4, dtype=torch.float64)
    assert out.dtype == torch.float64
    assert_close(out.float(), mae_reference(32, 4), **EXACT)


# ----------------------------------------------------------------------------- MONAI
@pytest.mark.parametrize(
    "grid_size, embed_dim, spatial_dims",
    [(14, 768, 2), ((5, 9), 64, 2), (16, 768, 3), ((4, 6, 5), 96, 3), ((8, 8, 2), 48, 3)],
)
def test_monai_parity(grid_size, embed_dim, spatial_dims, device):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.meshgrid without indexing=
        expected = build_sincos_position_embedding(grid_size, embed_dim, spatial_dims).detach()
    out = monai_sincos(grid_size, embed_dim, spatial_dims, device=device)
    assert type(out) is torch.Tensor and not out.requires_grad
    assert_close(out.cpu(), expected, **_tol(device))


def test_monai_temperature():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = build_sincos_position_embedding((3, 4, 5), 36, 3, temperature=50.0).detach()
    assert_close(monai_sincos((3, 4, 5), 36, 3, temperature=50.0), expected, **EXACT)


# ----------------------------------------------------------------------------- DINO
def dino_sine_hw_reference(mask, num_pos_feats=128, temperature_h=20, temperature_w=20):
    """DINO's PositionEmbeddingSineHW(normalize=True) formula, float32 as DINO computes it."""
    not_mask = ~mask
    y_embed = not_mask.cumsum(1, dtype=torch.float32)
    x_embed = not_mask.cumsum(2, dtype=torch.float32)
    y_embed = y_embed / (y_embed[:, -1:, :] + 1e-6) * 2 * math.pi
    x_embed = x_embed / (x_embed[:, :, -1:] + 1e-6) * 2 * math.pi
    i = torch.arange(num_pos_feats, dtype=torch.float32)
    pos_x = x_embed[..., None] / temperature_w ** (2 * (i // 2) / num_pos_feats)
    pos_y = y_embed[..., None] / temperature_h ** (2 * (i // 2) / num_pos_feats)
    pos_x = torch.stack((pos_x[..., 0::2].sin(), pos_x[..., 1::2].cos()), dim=4).flatten(3)
    pos_y = torch.stack((pos_y[..., 0::2].sin(), pos_y[..., 1::2].cos()), dim=4).flatten(3)
    return torch.cat((pos_y, pos_x), dim=3).permute(0, 3, 1, 2)


def test_dino_sine_parity():
    mask = torch.ones(2, 13, 17, dtype=torch.bool)
    mask[0, :10, :17] = False
    mask[1, :13, :8] = False
    m = dino_sine()
    assert (m.num_pos_feats, m.temperature, m.normalize, m.offset) == (128, 20, True, 0.0)
    assert_close(m(mask), dino_sine_hw_reference(mask))
    assert_close(dino_sine(32, 10)(mask), dino_sine_hw_reference(mask, 32, 10, 10))


# ----------------------------------------------------------------------------- depth added
def depth_added_reference(mask, num_pos_feats, temperature, normalize, scale=2 * math.pi, offset=0.0, eps=1e-6):
    """Mask2Former video PositionEmbeddingSine3D / mmdet SinePositionalEncoding3D, (B, T, C, H, W)."""
    not_mask = ~mask
    z_embed = not_mask.cumsum(1, dtype=torch.float32)
    y_embed = not_mask.cumsum(2, dtype=torch.float32)
    x_embed = not_mask.cumsum(3, dtype=torch.float32)
    if normalize:
        z_embed = (z_embed + offset) / (z_embed[:, -1:, :, :] + eps) * scale
        y_embed = (y_embed + offset) / (y_embed[:, :, -1:, :] + eps) * scale
        x_embed = (x_embed + offset) / (x_embed[:, :, :, -1:] + eps) * scale
    i = torch.arange(num_pos_feats, dtype=torch.float32, device=mask.device)
    dim_t = temperature ** (2 * (i // 2) / num_pos_feats)
    iz = torch.arange(2 * num_pos_feats, dtype=torch.float32, device=mask.device)
    dim_t_z = temperature ** (2 * (iz // 2) / (2 * num_pos_feats))
    pos_x = x_embed[..., None] / dim_t
    pos_y = y_embed[..., None] / dim_t
    pos_z = z_embed[..., None] / dim_t_z
    pos_x = torch.stack((pos_x[..., 0::2].sin(), pos_x[..., 1::2].cos()), dim=5).flatten(4)
    pos_y = torch.stack((pos_y[..., 0::2].sin(), pos_y[..., 1::2].cos()), dim=5).flatten(4)
    pos_z = torch.stack((pos_z[..., 0::2].sin(), pos_z[..., 1::2].cos()), dim=5).flatten(4)
    return (torch.cat((pos_y, pos_x), dim=4) + pos_z).permute(0, 1, 4, 2, 3)


def _video_mask(device):
    mask = torch.ones(2, 4, 6, 7, dtype=torch.bool, device=device)
    mask[0, :3, :5, :7] = False
    mask[1, :4, :6, :4] = False
    return mask


@pytest.mark.parametrize(
    "kwargs",
    [dict(), dict(normalize=True), dict(normalize=True, offset=-0.5), dict(num_pos_feats=16, temperature=20)],
)
def test_depth_added_parity(kwargs, device):
    mask = _video_mask(device)
    feats = kwargs.get("num_pos_feats", 64)
    temperature = kwargs.get("temperature", 10000)
    m = PositionEmbeddingSineDepthAdded(**kwargs)
    out = m(mask)
    assert out.shape == (2, 2 * feats, 4, 6, 7)
    expected = depth_added_reference(
        mask, feats, temperature, kwargs.get("normalize", False), offset=kwargs.get("offset", 0.0)
    )
    # float32 tolerance: sin / cos of the same float32 angles may differ by 1 ulp between
    # PyTorch's contiguous (vectorised) and strided kernels
    assert_close(out.transpose(1, 2), expected, rtol=1.3e-6, atol=2.5e-7)


def test_depth_added_inputs(device):
    m = PositionEmbeddingSineDepthAdded(8)
    mask = _video_mask(device)
    feats = torch.randn(2, 3, 4, 6, 7, device=device)
    assert_close(m(NestedTensor(feats, mask)), m(mask), **EXACT)
    unmasked = m(feats)
    assert unmasked.shape == (2, 16, 4, 6, 7)
    assert_close(unmasked, m(torch.zeros(2, 4, 6, 7, dtype=torch.bool, device=device)), **EXACT)
    assert_close(m(NestedTensor(feats, None)), unmasked, **EXACT)
    assert m(mask, dtype=torch.float16).dtype == torch.float16
    before = mask.clone()
    m(mask)
    assert torch.equal(mask, before)


def test_depth_added_repr_state_pickle():
    m = PositionEmbeddingSineDepthAdded(32, 20, normalize=True, scale=3.0, offset=-0.5, eps=1e-4)
    assert m.extra_repr() == (
        "num_pos_feats=32, temperature=20, normalize=True, scale=3.0, offset=-0.5, eps=0.0001, cache_size=8"
    )
    assert PositionEmbeddingSineDepthAdded().extra_repr() == (
        f"num_pos_feats=64, temperature=10000, normalize=False, scale={2 * math.pi}, offset=0.0, eps=1e-06, cache_size=8"
    )
    assert m.state_dict() == {}
    mask = _video_mask(torch.device("cpu"))
    for clone in (pickle.loads(pickle.dumps(m)), copy.deepcopy(m)):
        assert_close(clone(mask), m(mask), **EXACT)


# ----------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda: timm_sincos_2d((4, 4), 30), ValueError, r"dim must be a positive multiple of 4 .*got 30"),
        (lambda: timm_sincos_2d((4, 4), 32.0), TypeError, r"dim must be a positive int, got 32.0 \(float\)"),
        (lambda: timm_sincos_2d((4,), 32), ValueError, r"feat_shape must be an int or a sequence of 2 ints, got \(4,\)"),
        (lambda: timm_sincos_2d((4, 0), 32), ValueError, r"feat_shape must hold positive ints, got \(4, 0\)"),
        (lambda: timm_sincos_2d((4, 2.0), 32), TypeError, r"feat_shape must hold ints, got \(4, 2.0\)"),
        (lambda: timm_sincos_2d((4, 4), 32, 0.0), ValueError, r"temperature must be a finite number > 0, got 0.0"),
        (lambda: timm_sincos_2d((4, 4), 32, reverse_coord=1), TypeError, r"reverse_coord must be a bool, got 1"),
        (lambda: mae_sincos_2d(30, 4), ValueError, r"embed_dim must be a positive multiple of 4 .*got 30"),
        (lambda: mae_sincos_2d(32, "14"), TypeError, r"grid_size must be an int or a sequence of 2 ints, got '14'"),
        (lambda: mae_sincos_2d(32, 4, cls_token=1), TypeError, r"cls_token must be a bool, got 1"),
        (lambda: monai_sincos(4, 64, 4), ValueError, r"spatial_dims must be one of \(2, 3\), got 4"),
        (lambda: monai_sincos(4, 64, 3), ValueError, r"embed_dim must be a positive multiple of 6 .*got 64"),
        (lambda: monai_sincos((4, 4), 96, 3), ValueError, r"grid_size must be an int or a sequence of 3 ints, got \(4, 4\)"),
        (lambda: dino_sine(7), ValueError, r"num_pos_feats must be a positive even int .*got 7"),
        (lambda: PositionEmbeddingSineDepthAdded(7), ValueError, r"num_pos_feats must be a positive even int .*got 7"),
        (lambda: PositionEmbeddingSineDepthAdded(8, scale=1.0), ValueError, r"normalize should be True if scale is passed"),
        (lambda: PositionEmbeddingSineDepthAdded(8, normalize=1), TypeError, r"normalize must be a bool, got 1"),
        (lambda: PositionEmbeddingSineDepthAdded(8, normalize=True, scale=-1.0), ValueError, r"scale must be > 0, got -1.0"),
        (lambda: PositionEmbeddingSineDepthAdded(8, eps=-1.0), ValueError, r"eps must be >= 0, got -1.0"),
        (lambda: PositionEmbeddingSineDepthAdded(8, offset="a"), TypeError, r"offset must be a finite number, got 'a'"),
        (lambda: PositionEmbeddingSineDepthAdded(8, temperature=0), ValueError, r"temperature must be a finite number > 0, got 0"),
        (lambda: PositionEmbeddingSineDepthAdded(8)(torch.zeros(2, 5, 5, dtype=torch.bool)), ValueError,
         r"embeds volumes.*got spatial shape \(5, 5\)"),
        (lambda: PositionEmbeddingSineDepthAdded(8)(torch.zeros(2, 3, 5, 5)), ValueError,
         r"embeds volumes.*got spatial shape \(5, 5\)"),
        (lambda: PositionEmbeddingSineDepthAdded(8)(torch.zeros(2, 4, 5, 5, dtype=torch.uint8)), TypeError,
         r"mask must have dtype torch.bool with True marking padding, got torch.uint8"),
        (lambda: PositionEmbeddingSineDepthAdded(8)([1]), TypeError, r"x must be a NestedTensor, a bool mask .*got list"),
        (lambda: PositionEmbeddingSineDepthAdded(8)(NestedTensor(torch.zeros(2, 3, 5, 5), None)), ValueError,
         r"embeds volumes.*got spatial shape \(5, 5\)"),
    ],
)
def test_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


# ------------------------------------------ issue 10: DepthAdded as a sibling over one base
def test_depth_added_rectangular_fast_path_equals_formula():
    """A padded batch (rectangular, host sizes known) takes the fast path; it equals the slow
    formula reference and the cumulative-sum path of the same mask bit for bit."""
    from vispos import Padding, nested_tensor_from_tensor_list

    items = [torch.rand(1, 3, 5, 7), torch.rand(1, 4, 6, 4), torch.rand(1, 1, 2, 3)]
    nt = nested_tensor_from_tensor_list(items)
    assert nt.rectangular
    for kwargs in (dict(), dict(normalize=True, offset=-0.5)):
        m = PositionEmbeddingSineDepthAdded(8, **kwargs)
        fast = m(nt)
        slow = m._embed_padding(Padding.from_mask(nt.mask, classify=False), torch.float32, True)
        assert_close(fast, slow, **EXACT)
        expected = depth_added_reference(nt.mask, 8, 10000, kwargs.get("normalize", False), offset=kwargs.get("offset", 0.0))
        assert_close(fast.transpose(1, 2), expected, rtol=1.3e-6, atol=2.5e-7)


def test_depth_added_uses_its_cache_and_hands_out_fresh_results():
    m = PositionEmbeddingSineDepthAdded(8, cache_size=2)
    mask = _video_mask("cpu")
    first = m(mask)
    assert len(m._cache) == 1
    first.zero_()  # the caller's result: writing into it does not reach the next call
    assert_close(m(mask), depth_added_reference(mask, 8, 10000, False).transpose(1, 2), rtol=1.3e-6, atol=2.5e-7)
    assert PositionEmbeddingSineDepthAdded(8, cache_size=0)(mask).shape == (2, 16, 4, 6, 7)


def test_depth_added_reports_its_channels():
    from vispos.backbones import SpatialPositionEmbedding
    from vispos import PositionEmbeddingSine

    m = PositionEmbeddingSineDepthAdded(32)
    assert isinstance(m, SpatialPositionEmbedding) and m.out_channels(3) == 64
    assert not isinstance(m, PositionEmbeddingSine)  # a sibling, not a subclass
    assert PositionEmbeddingSine(32).out_channels(3) == 96
