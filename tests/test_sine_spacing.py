"""Positions in physical units: ``spacing`` (mm per cell, per item and axis) and ``extent``.

DESIGN.md, "Physical units": a spacing is given per item and per axis, ``(B, num_axes)``, in
millimetres, in the tensor's spatial axis order; spacing 1 gives exactly the voxel-index numbers.
"""

import math

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from vispos import NestedTensor, PositionEmbeddingSine, PositionEmbeddingSineDepthAdded, nested_tensor_from_tensor_list


def _boxes_mask(spatial, boxes):
    """``(B, *S)`` bool: item ``b`` valid on ``[start, stop)`` along every axis (True = padding)."""
    mask = torch.ones((len(boxes), *spatial), dtype=torch.bool)
    for b, (start, stop) in enumerate(boxes):
        mask[(b, *(slice(a, e) for a, e in zip(start, stop)))] = False
    return mask


def _inputs(n):
    """Every kind of padding: none, at the origin (a NestedTensor), boxes away from it, any mask."""
    g = torch.Generator().manual_seed(n)
    spatial = (5, 7, 6)[:n] if n > 1 else (9,)
    sizes = [spatial, tuple(s - 2 for s in spatial), tuple(max(1, s - 4) for s in spatial)]
    nested = nested_tensor_from_tensor_list([torch.zeros(1, *s) for s in sizes])
    boxes = _boxes_mask(spatial, [((1,) * n, tuple(s - 1 for s in spatial)), ((0,) * n, spatial), ((2,) * n, tuple(s - 2 for s in spatial))])
    arbitrary = torch.rand((3, *spatial), generator=g) > 0.7
    arbitrary[:, (0,) * n] = False
    features = torch.zeros((3, 4, *spatial))
    if n == 1:  # a bare (B, C, L) map could be a float mask: a 1D map goes in as a NestedTensor
        features = NestedTensor(features, None)
    return {"none": features, "origin": nested, "boxes": boxes, "arbitrary": arbitrary}


def _spacing(batch, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return 0.5 + 4.5 * torch.rand((batch, n), generator=g)


def _reference(mask, spacing, num_pos_feats, temperature, normalize, scale, offset, eps, extent=None):
    """DETR's formula in float64, cell by cell: counts of valid cells along each axis, times the
    item's spacing, normalised by the line's physical length (or ``extent``), interleaved sin/cos."""
    mask = mask.double() > 0.5
    spacing = spacing.double()
    n = mask.dim() - 1
    k = torch.arange(0, num_pos_feats, 2, dtype=torch.float64)
    div = torch.tensor(float(temperature), dtype=torch.float64) ** (k / num_pos_feats)
    blocks = []
    for axis in range(n):
        count = (~mask).to(torch.float64).cumsum(axis + 1)
        s = spacing[:, axis].reshape(-1, *([1] * n))
        pos = (count + offset) * s
        if normalize:
            last = count.narrow(axis + 1, count.shape[axis + 1] - 1, 1)
            pos = pos / ((last * s + eps) if extent is None else extent) * scale
        angles = pos.unsqueeze(1) / div.reshape(1, -1, *([1] * n))
        blocks.append(torch.stack((angles.sin(), angles.cos()), dim=2).flatten(1, 2))
    return torch.cat(blocks, dim=1)


def _mask_of(x):
    if isinstance(x, NestedTensor):
        return x.padding.mask
    if x.dtype == torch.bool:
        return x
    return torch.zeros((x.shape[0], *x.shape[2:]), dtype=torch.bool)


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("kind", ["none", "origin", "boxes", "arbitrary"])
@pytest.mark.parametrize("normalize, offset", [(False, 0.0), (True, 0.0), (True, -0.5), (False, -0.5)])
def test_unit_spacing_is_the_voxel_embedding_bit_for_bit(n, kind, normalize, offset):
    x = _inputs(n)[kind]
    pos = PositionEmbeddingSine(8, normalize=normalize, offset=offset, extent=7.0 if normalize else None)
    batch = x.tensors.shape[0] if isinstance(x, NestedTensor) else x.shape[0]
    assert_close(pos(x, spacing=torch.ones(batch, n)), pos(x), rtol=0, atol=0)
    assert_close(pos(x, spacing=torch.ones(batch, n, dtype=torch.float64)), pos(x), rtol=0, atol=0)


def test_unit_spacing_depth_added_bit_for_bit():
    for x in _inputs(3).values():
        pos = PositionEmbeddingSineDepthAdded(8, normalize=True, offset=-0.5, extent=9.0)
        assert_close(pos(x, spacing=torch.ones(3, 3)), pos(x), rtol=0, atol=0)


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("kind", ["none", "origin", "boxes", "arbitrary"])
@pytest.mark.parametrize(
    "normalize, offset, extent", [(False, 0.0, None), (False, -0.5, None), (True, -0.5, 25.0), (True, 0.0, 40.0)]
)
def test_float64_reference(n, kind, normalize, offset, extent):
    x = _inputs(n)[kind]
    spacing = _spacing(3, n, seed=n)
    pos = PositionEmbeddingSine(16, temperature=100, normalize=normalize, offset=offset, extent=extent)
    got = pos(x, spacing=spacing)
    mask = _mask_of(x)
    want = _reference(mask, spacing, 16, 100, normalize, pos.scale, offset, pos.eps, extent)
    assert got.dtype == torch.float32
    if normalize and offset and extent is None:
        # a line with no valid cell sits at offset * s / eps * scale, an angle of ~1e6 whose
        # sin / cos are float32 rounding (documented; those cells are padding): valid cells only
        keep = (~mask).unsqueeze(1).expand_as(got)
        got, want = got[keep], want[keep]
    assert_close(got.double(), want, rtol=0, atol=2e-5)


@pytest.mark.parametrize("kind", ["none", "origin", "boxes", "arbitrary"])
def test_depth_added_float64_reference(kind):
    x = _inputs(3)[kind]
    spacing = _spacing(3, 3, seed=7)
    pos = PositionEmbeddingSineDepthAdded(8, normalize=False)
    mask = _mask_of(x)
    # cat(PE_y, PE_x) with 8 channels each, plus PE_z with 16
    want = _reference(mask, spacing, 8, 10000, False, 0, 0, 0)[:, 8:] + _reference(mask, spacing, 16, 10000, False, 0, 0, 0)[:, :16]
    assert_close(pos(x, spacing=spacing).double(), want, rtol=0, atol=2e-5)


def test_every_path_gives_the_same_numbers():
    # a rectangular NestedTensor (line tables), its mask (mask path) and the cumulative counts
    nested = _inputs(3)["origin"]
    spacing = _spacing(3, 3)
    for normalize in (False, True):
        pos = PositionEmbeddingSine(8, normalize=normalize, cache_size=0, extent=30.0 if normalize else None)
        assert_close(pos(nested, spacing=spacing), pos(nested.mask, spacing=spacing), rtol=0, atol=0)
        plain = NestedTensor(nested.tensors, nested.mask)  # no host sizes
        assert_close(pos(plain, spacing=spacing), pos(nested, spacing=spacing), rtol=0, atol=0)


def test_distance_in_millimetres_not_in_cells():
    # cells 0.7 mm wide along W and 5 mm deep along D: moving 5 mm along D (one cell) and 4.9 mm
    # along W (seven cells) change the embedding alike; without spacing, one cell along either
    pos = PositionEmbeddingSine(32, temperature=1000)
    mask = torch.zeros(1, 12, 4, 40, dtype=torch.bool)
    mm = pos(mask, spacing=torch.tensor([[5.0, 1.0, 0.7]]))[0]
    cells = pos(mask)[0]

    def sim(e, a, b):
        return torch.nn.functional.cosine_similarity(e[(slice(None), *a)], e[(slice(None), *b)], dim=0)

    q = (5, 2, 10)
    assert abs(sim(mm, q, (6, 2, 10)) - sim(mm, q, (5, 2, 17))) < 0.02  # 5 mm vs 4.9 mm
    assert abs(sim(cells, q, (6, 2, 10)) - sim(cells, q, (5, 2, 11))) < 1e-6  # one cell either way
    assert sim(cells, q, (5, 2, 17)) < sim(cells, q, (6, 2, 10)) - 0.1  # seven cells is far


def test_extent_keeps_normalised_positions_isotropic():
    pos = PositionEmbeddingSine(8, normalize=True, extent=100.0)
    mask = torch.zeros(1, 10, 20, dtype=torch.bool)
    out = pos(mask, spacing=torch.tensor([[2.0, 1.0]]))
    # the last cell is at 10 * 2 mm along H and 20 * 1 mm along W: the same angle, 2 pi * 0.2
    assert_close(out[0, :8, -1, 0], out[0, 8:, 0, -1], rtol=0, atol=0)
    angle = torch.tensor(20 / 100 * 2 * math.pi)
    assert_close(out[0, 0, -1, 0], angle.sin())


def test_cache_keys_on_the_spacing():
    pos = PositionEmbeddingSine(8)
    nested = _inputs(2)["origin"]
    a = pos(nested, spacing=torch.ones(3, 2))
    b = pos(nested, spacing=torch.full((3, 2), 2.0))
    assert not torch.equal(a, b)
    assert torch.equal(pos(nested, spacing=torch.ones(3, 2)), a)
    c = pos(nested, spacing=torch.full((3, 2), 2.0))
    assert torch.equal(b, c) and b.data_ptr() != c.data_ptr()


def test_spacing_keeps_the_callers_tensor():
    spacing = torch.tensor([[1.0, 2.0]])
    before = spacing.clone()
    PositionEmbeddingSine(8)(torch.zeros(1, 3, 4, dtype=torch.bool), spacing=spacing)
    assert torch.equal(spacing, before)


@pytest.mark.parametrize(
    "spacing, error, match",
    [
        ("1 mm", TypeError, r"spacing must be a floating tensor \(B, num_axes\) or a sequence of num_axes numbers"),
        ([True, False], TypeError, r"spacing must be a floating tensor .* got \[True, False\] \(list\)"),
        ([[1.0, 1.0]], ValueError, r"spacing must have shape \(B, num_axes\) = \(2, 2\) or \(num_axes,\) = \(2,\), got \(1, 2\)"),
        (torch.ones(2, 2, dtype=torch.int64), TypeError, r"spacing must be a floating tensor .* dtype torch.int64"),
        (torch.ones(3), ValueError, r"spacing must have shape \(B, num_axes\) = \(2, 2\) or \(num_axes,\) = \(2,\), got \(3,\)"),
        (torch.ones(2, 3), ValueError, r"spacing must have shape \(B, num_axes\) = \(2, 2\) .*got \(2, 3\)"),
        (torch.tensor([[1.0, 0.0], [1.0, 1.0]]), ValueError, "spacing must be finite and > 0"),
        (torch.tensor([[1.0, float("nan")], [1.0, 1.0]]), ValueError, "spacing must be finite and > 0"),
    ],
)
def test_spacing_errors(spacing, error, match):
    with pytest.raises(error, match=match):
        PositionEmbeddingSine(8)(torch.zeros(2, 3, 4, dtype=torch.bool), spacing=spacing)


def test_extent_errors():
    with pytest.raises(ValueError, match="extent needs normalize=True"):
        PositionEmbeddingSine(8, extent=10.0)
    with pytest.raises(ValueError, match="extent must be > 0"):
        PositionEmbeddingSine(8, normalize=True, extent=0.0)
    with pytest.raises(TypeError, match="extent"):
        PositionEmbeddingSine(8, normalize=True, extent="10")


@pytest.mark.parametrize(
    "given",
    [[0.8, 3.0], (0.8, 3.0), np.array([0.8, 3.0]), np.array([0.8, 3.0], dtype=np.float32), torch.tensor([0.8, 3.0]),
     [[0.8, 3.0], [0.8, 3.0]], np.array([[0.8, 3.0], [0.8, 3.0]])],
    ids=["list", "tuple", "array", "array32", "1-d tensor", "nested list", "2-d array"],
)
def test_spacing_as_a_sequence_is_every_items(given):
    """A list, tuple or array of n numbers (or B rows) is accepted wherever a spacing tensor is."""
    pos = PositionEmbeddingSine(8)
    mask = torch.zeros(2, 3, 4, dtype=torch.bool)
    assert_close(pos(mask, spacing=given), pos(mask, spacing=torch.tensor([[0.8, 3.0]] * 2)), rtol=0, atol=0)


@pytest.mark.parametrize("offset", [0.0, -0.5])
def test_spacing_under_per_line_normalisation_is_refused_naming_extent(offset):
    """normalize=True without extent divides each line by its own length in mm: the spacing would
    cancel (the result equalled the call without it to 5e-7). It is refused, naming extent=."""
    pos = PositionEmbeddingSine(8, normalize=True, offset=offset)
    nested = _inputs(3)["boxes"]
    with pytest.raises(ValueError, match=r"spacing has no effect with normalize=True and no extent.*extent="):
        pos(nested, spacing=_spacing(3, 3))
    with pytest.raises(ValueError, match="extent="):
        PositionEmbeddingSineDepthAdded(8, normalize=True)(nested, spacing=_spacing(3, 3))
    with_extent = PositionEmbeddingSine(8, normalize=True, offset=offset, extent=40.0)
    assert not torch.allclose(with_extent(nested, spacing=_spacing(3, 3)), with_extent(nested), atol=1e-3)
