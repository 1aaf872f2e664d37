"""vispos.padding: every padding-mask fact, against slow references written from the definitions."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.testing import assert_close

from vispos import nested_tensor_from_tensor_list
from vispos.nested_tensor import NestedTensor, parse_spatial_input
from vispos.padding import (
    SpatialInput,
    check_mask,
    interpolate_mask,
    is_rectangular,
    mask_sizes,
    rectangular_sizes,
    resize_image_sizes,
    valid_ratios,
)


def _slow_extent(mask):
    """One past the last valid index along every axis, cell by cell."""
    out = []
    for item in mask:
        size = [0] * item.dim()
        for idx in itertools.product(*(range(s) for s in item.shape)):
            if not item[idx]:
                size = [max(a, i + 1) for a, i in zip(size, idx)]
        out.append(tuple(size))
    return out


def _rect_mask(sizes, spatial):
    mask = torch.ones(len(sizes), *spatial, dtype=torch.bool)
    for b, size in enumerate(sizes):
        mask[(b, *(slice(0, s) for s in size))] = False
    return mask


@pytest.mark.parametrize("spatial", [(7,), (5, 6), (3, 4, 5)])
def test_mask_sizes_equal_the_cell_by_cell_extent(spatial):
    g = torch.Generator().manual_seed(len(spatial))
    mask = torch.rand(3, *spatial, generator=g) > 0.4  # not rectangular
    mask[2] = True  # a fully padded item
    assert mask_sizes(mask) == _slow_extent(mask)


@pytest.mark.parametrize("spatial", [(7,), (5, 6), (3, 4, 5)])
def test_rectangular_sizes_and_is_rectangular(spatial):
    sizes = [tuple(max(1, s - k) for s in spatial) for k in range(3)] + [tuple(0 for _ in spatial)]
    mask = _rect_mask(sizes, spatial)
    assert rectangular_sizes(mask).tolist() == [list(s) for s in sizes]
    assert is_rectangular(mask)
    holed = mask.clone()
    holed[(0, *(0 for _ in spatial))] = True  # a hole at the origin of item 0
    assert not is_rectangular(holed)


@pytest.mark.parametrize("spatial", [(9, 7), (5, 6, 4)])
def test_valid_ratios_equal_deformable_detr(spatial):
    """Deformable-DETR's get_valid_ratio: valid count of the line through the origin / size,
    last axis first."""
    mask = _rect_mask([tuple(max(1, s - 2) for s in spatial), spatial], spatial)
    n = len(spatial)
    expected = []
    for axis in reversed(range(n)):
        line = (~mask)[(slice(None), *(slice(None) if a == axis else 0 for a in range(n)))]
        expected.append(line.sum(1).float() / spatial[axis])
    assert_close(valid_ratios(mask), torch.stack(expected, -1), rtol=0, atol=0)


@pytest.mark.parametrize("old, new", [((20, 17), (5, 5)), ((20, 17), (40, 9)), ((9, 10, 11), (3, 4, 6))])
def test_resize_image_sizes_equals_the_resized_mask(old, new):
    sizes = [tuple(max(1, s - 3 * k) for s in old) for k in range(3)]
    mask = _rect_mask(sizes, old)
    resized = interpolate_mask(mask, new)
    assert resize_image_sizes(sizes, old, new) == mask_sizes(resized)
    assert is_rectangular(resized)


def test_interpolate_mask_is_detr_nearest():
    g = torch.Generator().manual_seed(0)
    mask = torch.rand(2, 13, 11, generator=g) > 0.5
    ref = torch.nn.functional.interpolate(mask[None].float(), size=(4, 6)).to(torch.bool)[0]
    assert torch.equal(interpolate_mask(mask, (4, 6)), ref)


def test_parse_spatial_input_record():
    nt = nested_tensor_from_tensor_list([torch.zeros(3, 4, 5), torch.zeros(3, 2, 6)])
    rec = parse_spatial_input(nt)
    assert isinstance(rec, SpatialInput)
    assert rec.mask is nt.mask and rec.spatial == (4, 6) and rec.batch == 2
    assert rec.host_sizes == ((4, 5), (2, 6)) and rec.rectangular
    # a batch read from a mask: no host sizes known, not promised rectangular
    plain = parse_spatial_input(NestedTensor(nt.tensors, nt.mask))
    assert plain.host_sizes is None and not plain.rectangular
    feat = parse_spatial_input(torch.zeros(2, 8, 3, 5))
    assert feat.mask is None and feat.spatial == (3, 5) and feat.host_sizes is None


def test_check_mask_hint_names_the_peer_convention():
    with pytest.raises(TypeError, match=r"`~attention_mask.bool\(\)` for a transformers-style attention_mask where 1 marks valid tokens"):
        check_mask(torch.zeros(2, 3, dtype=torch.long), "key_padding_mask", peer="attention_mask", cells="tokens")
    with pytest.raises(TypeError, match=r"mask must be a torch.Tensor of dtype torch.bool, got list"):
        check_mask([True])


def test_with_features_at_the_same_size_shares_the_mask():
    """The Joiner's 1x1 projection keeps the level's size: the mask and sizes are reused, not
    copied or recomputed."""
    nt = nested_tensor_from_tensor_list([torch.zeros(3, 4, 5), torch.zeros(3, 2, 6)])
    same = nt.with_features(torch.zeros(2, 8, 4, 6))
    assert same.mask is nt.mask and same.rectangular and same.image_sizes == nt.image_sizes
    half = nt.with_features(torch.zeros(2, 8, 2, 3))
    assert half.mask is not nt.mask and half.image_sizes == mask_sizes(half.mask)
