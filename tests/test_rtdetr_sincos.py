"""RT-DETR / D-FINE's 2D sin-cos table (issue 33): ``rtdetr_sincos_2d`` against transformers'
RT-DETR, RT-DETRv2, D-FINE and DEIMv2 functions and the original RT-DETR code, on whole tensors;
the mask-aware form on padded batches."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close
from transformers.models.d_fine.modeling_d_fine import build_2d_sinusoidal_position_embedding as dfine
from transformers.models.deimv2.modeling_deimv2 import build_2d_sinusoidal_position_embedding as deimv2
from transformers.models.rt_detr.modeling_rt_detr import RTDetrSinePositionEmbedding
from transformers.models.rt_detr.modeling_rt_detr import build_2d_sinusoidal_position_embedding as rtdetr
from transformers.models.rt_detr_v2.modeling_rt_detr_v2 import build_2d_sinusoidal_position_embedding as rtdetr_v2

import vispos
from vispos import NestedTensor, Padding, rtdetr_sincos_2d

EXACT = dict(rtol=0, atol=0)
PEERS = {"rt_detr": rtdetr, "rt_detr_v2": rtdetr_v2, "d_fine": dfine, "deimv2": deimv2}


def original_rtdetr(w, h, embed_dim=256, temperature=10000.0):
    """``HybridEncoder.build_2d_sincos_position_embedding`` of the original RT-DETR code
    (lyuwenyu/RT-DETR, ``rtdetr_pytorch/src/zoo/rtdetr/hybrid_encoder.py``), verbatim."""
    grid_w = torch.arange(int(w), dtype=torch.float32)
    grid_h = torch.arange(int(h), dtype=torch.float32)
    grid_w, grid_h = torch.meshgrid(grid_w, grid_h, indexing="ij")
    assert embed_dim % 4 == 0, "Embed dimension must be divisible by 4 for 2D sin-cos position embedding"
    pos_dim = embed_dim // 4
    omega = torch.arange(pos_dim, dtype=torch.float32) / pos_dim
    omega = 1.0 / (temperature**omega)
    out_w = grid_w.flatten()[..., None] @ omega[None]
    out_h = grid_h.flatten()[..., None] @ omega[None]
    return torch.concat([out_w.sin(), out_w.cos(), out_h.sin(), out_h.cos()], dim=1)[None, :, :]


def _reference(starts, spatial, embed_dim, temperature=10000.0, original=False):
    """The formula in float64, item by item: positions ``i - start`` along each axis."""
    pos_dim = embed_dim // 4
    omega = 1.0 / temperature ** (torch.arange(pos_dim, dtype=torch.float64) / pos_dim)
    out = []
    for start in starts:
        h = torch.arange(spatial[0], dtype=torch.float64) - start[0]
        w = torch.arange(spatial[1], dtype=torch.float64) - start[1]
        gh, gw = torch.meshgrid(h, w, indexing="ij")
        eh, ew = gh.reshape(-1, 1) * omega, gw.reshape(-1, 1) * omega
        blocks = [ew.sin(), ew.cos(), eh.sin(), eh.cos()] if original else [eh.sin(), eh.cos(), ew.sin(), ew.cos()]
        table = torch.cat(blocks, 1)
        if original:  # tokens column-major
            table = table.view(*spatial, embed_dim).transpose(0, 1).reshape(-1, embed_dim)
        out.append(table)
    return torch.stack(out).float()


@pytest.mark.parametrize("peer", sorted(PEERS))
@pytest.mark.parametrize(
    "height, width, embed_dim, temperature, cls_token",
    [(20, 20, 256, 10000.0, False), (40, 40, 256, 10000.0, False), (13, 17, 64, 20.0, True), (1, 5, 8, 10000.0, False),
     (25, 38, 384, 10000.0, False)],
)
def test_equals_transformers(peer, height, width, embed_dim, temperature, cls_token):
    expected = PEERS[peer](height, width, embed_dim, temperature, cls_token)
    assert_close(rtdetr_sincos_2d(height, width, embed_dim, temperature, cls_token), expected, **EXACT)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_equals_transformers_module_in_any_dtype(dtype, device):
    module = RTDetrSinePositionEmbedding(256, 10000)
    expected = module(width=24, height=18, device=device, dtype=dtype)[0]
    got = rtdetr_sincos_2d(18, 24, 256, 10000.0, device=device, dtype=dtype)
    assert got.dtype == dtype and got.device.type == device.type
    assert_close(got, expected, **EXACT)


@pytest.mark.parametrize("height, width", [(20, 20), (13, 17), (17, 13), (1, 6)])
@pytest.mark.parametrize("embed_dim, temperature", [(256, 10000.0), (32, 100.0)])
def test_original_layout_equals_the_original_code(height, width, embed_dim, temperature):
    expected = original_rtdetr(width, height, embed_dim, temperature)[0]
    assert_close(rtdetr_sincos_2d(height, width, embed_dim, temperature, original=True), expected, **EXACT)


def test_original_differs_from_transformers_on_non_square_maps_only():
    square = rtdetr_sincos_2d(16, 16, 64, original=True)
    assert_close(square, rtdetr_sincos_2d(16, 16, 64))  # float32 vs float64 math: rounding only
    wide = rtdetr_sincos_2d(12, 16, 64, original=True)
    assert (wide - rtdetr_sincos_2d(12, 16, 64)).abs().max() > 0.5


# ------------------------------------------------------------------------------ padded batches
def _batch():
    spatial = (10, 14)
    sizes = [(10, 14), (7, 11), (4, 14), (10, 3)]
    return spatial, sizes


@pytest.mark.parametrize("starts", [None, "symmetric"])
@pytest.mark.parametrize("form", ["padding", "mask", "nested"])
@pytest.mark.parametrize("original", [False, True])
def test_each_item_gets_its_own_table(starts, form, original):
    spatial, sizes = _batch()
    padding = Padding.from_sizes(sizes, spatial, starts=starts)
    x = {"padding": padding, "mask": padding.mask, "nested": NestedTensor(torch.zeros(4, 3, *spatial), padding.mask)}[form]
    out = rtdetr_sincos_2d(*spatial, 32, padding=x, original=original)
    assert out.shape == (4, 140, 32)
    grid = out.view(4, spatial[1], spatial[0], 32).transpose(1, 2) if original else out.view(4, *spatial, 32)
    for b, size in enumerate(sizes):
        alone = rtdetr_sincos_2d(*size, 32, original=original)
        alone = alone.view(size[1], size[0], 32).transpose(0, 1) if original else alone.view(*size, 32)
        assert_close(grid[(b, *padding.region(b))], alone, **EXACT)
    # padded cells continue each item's positions past its box
    assert_close(out, _reference(padding.starts, spatial, 32, original=original), rtol=0, atol=1e-6)


def test_mask_with_holes_takes_the_bounding_box():
    mask = torch.ones(2, 8, 9, dtype=torch.bool)
    mask[0, 2:7, 1:8] = False
    mask[0, 4, 4] = True  # a hole
    mask[1] = False
    out = rtdetr_sincos_2d(8, 9, 16, padding=mask)
    assert_close(out, _reference([(2, 1), (0, 0)], (8, 9), 16), rtol=0, atol=1e-6)
    assert_close(out[1], rtdetr_sincos_2d(8, 9, 16), **EXACT)


def test_device_path_equals_host_path(monkeypatch):
    spatial, sizes = _batch()
    padding = Padding.from_sizes(sizes, spatial, starts="symmetric")
    expected = rtdetr_sincos_2d(*spatial, 32, padding=padding)
    monkeypatch.setattr(vispos._tracing, "host_side", lambda device: False)
    assert_close(rtdetr_sincos_2d(*spatial, 32, padding=padding.mask), expected, **EXACT)
    monkeypatch.setattr(vispos._tracing, "host_facts", lambda device: False)
    assert_close(rtdetr_sincos_2d(*spatial, 32, padding=padding), expected, **EXACT)


def test_feature_map_and_cls_token_with_a_batch():
    features = torch.zeros(3, 8, 5, 6)
    out = rtdetr_sincos_2d(5, 6, 16, cls_token=True, padding=features)
    assert out.shape == (3, 31, 16)
    assert_close(out, rtdetr_sincos_2d(5, 6, 16, cls_token=True).expand(3, -1, -1), **EXACT)
    out[0].fill_(1.0)  # the items do not share storage
    assert_close(out[1], rtdetr_sincos_2d(5, 6, 16, cls_token=True), **EXACT)


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda: rtdetr_sincos_2d(4, 4, 30), ValueError, "embed_dim must be a positive multiple of 4"),
        (lambda: rtdetr_sincos_2d(4, 4, 32.0), TypeError, "embed_dim must be a positive int"),
        (lambda: rtdetr_sincos_2d(0, 4, 32), ValueError, r"\(height, width\) must hold positive ints"),
        (lambda: rtdetr_sincos_2d(4.0, 4, 32), TypeError, r"\(height, width\) must hold ints"),
        (lambda: rtdetr_sincos_2d(4, 4, 32, 0.0), ValueError, "temperature must be a finite number > 0"),
        (lambda: rtdetr_sincos_2d(4, 4, 32, cls_token=1), TypeError, "cls_token must be a bool"),
        (lambda: rtdetr_sincos_2d(4, 4, 32, original=None), TypeError, "original must be a bool"),
        (lambda: rtdetr_sincos_2d(4, 4, 32, dtype=torch.int64), TypeError, "floating torch.dtype"),
        (lambda: rtdetr_sincos_2d(4, 4, 32, padding=torch.zeros(1, 4, 5, dtype=torch.bool)), ValueError,
         r"padding has spatial shape \(4, 5\), expected \(height, width\) = \(4, 4\)"),
        (lambda: rtdetr_sincos_2d(4, 4, 32, padding=torch.zeros(1, 4, 4, dtype=torch.uint8)), TypeError,
         "dtype torch.bool"),
        (lambda: rtdetr_sincos_2d(4, 4, 32, padding=[[True]]), TypeError, "padding must be a NestedTensor"),
    ],
)
def test_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call()
