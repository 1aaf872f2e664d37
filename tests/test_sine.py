import copy
import math
import pickle

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.models.deformable_detr.modeling_deformable_detr import DeformableDetrSinePositionEmbedding
from transformers.models.detr.modeling_detr import DetrSinePositionEmbedding

from vispos import NestedTensor, Padding, PositionEmbeddingSine, nested_tensor_from_tensor_list
from vispos._sincos import frequency_divisors


def assert_matches_reference(ours, ref):
    """Whole-tensor comparison; cells the reference marks NaN (see slow_reference) must be finite."""
    assert torch.isfinite(ours).all()
    ours = torch.where(torch.isnan(ref), torch.full_like(ours, float("nan")), ours)
    torch.testing.assert_close(ours, ref.float(), rtol=0, atol=2e-6, equal_nan=True)


def _rect_mask(sizes, padded):
    mask = torch.ones(len(sizes), *padded, dtype=torch.bool)
    for i, s in enumerate(sizes):
        mask[(i, *(slice(0, v) for v in s))] = False
    return mask


def _peer(cls, feats, temperature, normalize, mask):
    shape = (mask.shape[0], 1, *mask.shape[1:])
    return cls(feats, temperature, normalize)(shape, mask.device, torch.float32, (~mask).long())


def slow_reference(mask, num_pos_feats, temperature, normalize, scale=2 * math.pi, offset=0.0, eps=1e-6):
    """DETR's formula written cell by cell in float64 for any number of spatial axes."""
    b, *spatial = mask.shape
    n = len(spatial)
    out = torch.empty(b, n * num_pos_feats, *spatial, dtype=torch.float64)
    valid = (~mask).long()
    for axis in range(n):
        count = valid.cumsum(axis + 1).double()
        last = count.narrow(axis + 1, spatial[axis] - 1, 1).expand_as(count)
        for idx in torch.cartesian_prod(*[torch.arange(s) for s in (b, *spatial)]).reshape(-1, 1 + n).tolist():
            p = float(count[tuple(idx)])
            if normalize and offset and float(last[tuple(idx)]) == 0:
                # a line without valid cells: (offset / eps) * scale is ~1e6 rad, where float32
                # rounding decides the value; DETR-family models mask these cells. Not compared.
                c = axis * num_pos_feats
                out[(idx[0], slice(c, c + num_pos_feats), *idx[1:])] = float("nan")
                continue
            if normalize:
                p = (p + offset) / (float(last[tuple(idx)]) + eps) * scale
            else:
                p = p + offset
            for k in range(num_pos_feats // 2):
                angle = p / temperature ** (2 * k / num_pos_feats)
                c = axis * num_pos_feats + 2 * k
                out[(idx[0], c, *idx[1:])] = math.sin(angle)
                out[(idx[0], c + 1, *idx[1:])] = math.cos(angle)
    return out


MASKS = {
    "rectangular": lambda: _rect_mask([(20, 31), (13, 37), (23, 9)], (23, 37)),
    "arbitrary": lambda: torch.rand(3, 23, 37, generator=torch.Generator().manual_seed(1)) > 0.55,
    "none": lambda: torch.zeros(2, 17, 29, dtype=torch.bool),
    "fully_padded_item": lambda: _rect_mask([(0, 0), (5, 7)], (6, 8)),
}


@pytest.mark.parametrize("mask_kind", list(MASKS))
@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("feats, temperature", [(64, 10000), (128, 10000), (16, 20), (6, 1000)])
def test_detr_parity(mask_kind, normalize, feats, temperature):
    mask = MASKS[mask_kind]()
    ours = PositionEmbeddingSine(feats, temperature, normalize)(mask)
    ref = _peer(DetrSinePositionEmbedding, feats, temperature, normalize, mask)
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-6)


@pytest.mark.parametrize("mask_kind", list(MASKS))
@pytest.mark.parametrize("feats, temperature", [(64, 10000), (128, 10000), (32, 20)])
def test_deformable_detr_parity(mask_kind, feats, temperature):
    mask = MASKS[mask_kind]()
    ours = PositionEmbeddingSine(feats, temperature, normalize=True, offset=-0.5)(mask)
    ref = _peer(DeformableDetrSinePositionEmbedding, feats, temperature, True, mask)
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-6)


@pytest.mark.parametrize("normalize", [False, True])
def test_unmasked_feature_map_matches_detr(normalize):
    x = torch.randn(3, 5, 11, 14)
    ours = PositionEmbeddingSine(64, normalize=normalize)(x)
    ref = DetrSinePositionEmbedding(64, 10000, normalize)(x.shape, x.device, torch.float32, None)
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-6)
    with_mask = PositionEmbeddingSine(64, normalize=normalize)(torch.zeros(3, 11, 14, dtype=torch.bool))
    torch.testing.assert_close(ours, with_mask, rtol=0, atol=0)


@pytest.mark.parametrize(
    "mask",
    [
        _rect_mask([(7,), (4,), (1,)], (7,)),
        torch.tensor([[False, True, False, False, True, False]]),
        _rect_mask([(3, 4, 2), (2, 1, 5)], (3, 4, 5)),
        torch.rand(2, 3, 4, 3, generator=torch.Generator().manual_seed(2)) > 0.5,
    ],
    ids=["1d-rect", "1d-arbitrary", "3d-rect", "3d-arbitrary"],
)
@pytest.mark.parametrize("normalize, offset", [(False, 0.0), (True, 0.0), (True, -0.5), (False, -1.0)])
def test_1d_3d_against_formula(mask, normalize, offset):
    feats, temperature = 8, 50
    ours = PositionEmbeddingSine(feats, temperature, normalize, offset=offset)(mask)
    ref = slow_reference(mask, feats, temperature, normalize, offset=offset)
    assert ours.shape == (mask.shape[0], (mask.dim() - 1) * feats, *mask.shape[1:])
    assert_matches_reference(ours, ref)


def test_2d_against_formula_arbitrary_mask():
    mask = torch.rand(2, 5, 6, generator=torch.Generator().manual_seed(3)) > 0.4
    ours = PositionEmbeddingSine(8, 100, normalize=True, scale=3.0)(mask)
    torch.testing.assert_close(ours, slow_reference(mask, 8, 100, True, scale=3.0).float(), rtol=0, atol=2e-6)


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_property_equals_formula(data):
    n = data.draw(st.integers(1, 3))
    shape = [data.draw(st.integers(1, 2))] + [data.draw(st.integers(1, 4)) for _ in range(n)]
    flat = data.draw(st.lists(st.booleans(), min_size=math.prod(shape), max_size=math.prod(shape)))
    mask = torch.tensor(flat, dtype=torch.bool).view(shape)
    normalize = data.draw(st.booleans())
    offset = data.draw(st.sampled_from([0.0, -0.5])) if normalize else 0.0
    feats = data.draw(st.sampled_from([2, 4, 6]))
    temperature = data.draw(st.sampled_from([20, 10000]))
    ours = PositionEmbeddingSine(feats, temperature, normalize, offset=offset)(mask)
    ref = slow_reference(mask, feats, temperature, normalize, offset=offset)
    assert_matches_reference(ours, ref)


def test_nested_tensor_input_and_dtype(device):
    items = [torch.randn(3, 9, 12, device=device), torch.randn(3, 12, 7, device=device)]
    nt = nested_tensor_from_tensor_list(items)
    pe = PositionEmbeddingSine(32, normalize=True).to(device)
    a = pe(nt)
    b = pe(nt.mask)
    assert a.device.type == device.type and a.dtype == torch.float32
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    half = pe(nt, dtype=torch.float16)
    assert half.dtype == torch.float16
    torch.testing.assert_close(half, a.half(), rtol=0, atol=0)


def test_half_input_computes_angles_in_float32():
    x = torch.zeros(1, 1, 3000, dtype=torch.bfloat16)
    ours = PositionEmbeddingSine(64)(NestedTensor(x, None), dtype=torch.bfloat16)
    exact = PositionEmbeddingSine(64)(NestedTensor(x.float(), None)).to(torch.bfloat16)
    torch.testing.assert_close(ours, exact, rtol=0, atol=0)
    # what a bf16 computation would give: positions themselves are rounded
    naive = torch.arange(1, 3001, dtype=torch.bfloat16)
    assert (naive.float() - torch.arange(1, 3001).float()).abs().max() >= 8


def test_unmasked_output_is_owned_or_a_broadcast_view_on_request():
    x = torch.randn(4, 3, 5, 6)
    out = PositionEmbeddingSine(16)(x)
    assert out.shape == (4, 32, 5, 6) and out.is_contiguous()  # the caller's own tensor
    shared = PositionEmbeddingSine(16, zero_copy=True)(x)
    assert shared.stride(0) == 0  # zero_copy: one table broadcast over the batch
    with pytest.raises(RuntimeError):
        shared.add_(1)
    torch.testing.assert_close(out, shared, rtol=0, atol=0)


def test_does_not_modify_inputs():
    mask = torch.rand(2, 5, 5) > 0.5
    before = mask.clone()
    PositionEmbeddingSine(8, normalize=True)(mask)
    assert torch.equal(mask, before)


def test_repr_state_dict_pickle_deepcopy():
    pe = PositionEmbeddingSine(32, 20, normalize=True, offset=-0.5)
    assert repr(pe) == (
        "PositionEmbeddingSine(num_pos_feats=32, temperature=20, normalize=True, "
        f"scale={2 * math.pi}, offset=-0.5, eps=1e-06, cache_size=8)"
    )
    assert pe.state_dict() == {}
    mask = torch.rand(2, 4, 5) > 0.3
    for clone in (copy.deepcopy(pe), pickle.loads(pickle.dumps(pe))):
        torch.testing.assert_close(clone(mask), pe(mask), rtol=0, atol=0)
    assert pe.to(torch.float64)(mask).dtype == torch.float32


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(num_pos_feats=63), ValueError, "num_pos_feats must be a positive even int.*got 63"),
        (dict(num_pos_feats=0), ValueError, "num_pos_feats"),
        (dict(num_pos_feats=64.0), TypeError, "num_pos_feats"),
        (dict(scale=1.0), ValueError, "normalize should be True if scale is passed"),
        (dict(normalize=True, scale=-1.0), ValueError, "scale must be > 0"),
        (dict(temperature=-5), ValueError, "temperature must be a finite number > 0"),
        (dict(temperature="1e4"), TypeError, "temperature"),
        (dict(eps=-1.0), ValueError, "eps must be >= 0"),
        (dict(normalize=1), TypeError, "normalize must be a bool"),
        (dict(offset=float("nan")), ValueError, "offset must be a finite number"),
    ],
)
def test_constructor_errors(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        PositionEmbeddingSine(**kwargs)


@pytest.mark.parametrize(
    "x, exc, match",
    [
        (torch.zeros(2, 5, 5, dtype=torch.long), TypeError, "dtype torch.bool"),
        (torch.zeros(2, 5, 5, dtype=torch.uint8), TypeError, "pixel_mask"),
        (torch.zeros(2, 2, 2, 2, 2, dtype=torch.bool), ValueError, "1 to 3 spatial axes"),
        (torch.zeros(5, dtype=torch.bool), ValueError, "1 to 3 spatial axes"),
        (torch.zeros(2, 5), ValueError, r"feature map must have shape \(B, C, \*S\)"),
        (torch.zeros(1, 2, 3, 4, 5, 6), ValueError, "feature map"),
        ([[True]], TypeError, "NestedTensor, a bool mask"),
    ],
)
def test_forward_errors(x, exc, match):
    with pytest.raises(exc, match=match):
        PositionEmbeddingSine(8)(x)


def test_3d_nested_tensor_volume():
    vols = [torch.randn(1, 4, 6, 5), torch.randn(1, 3, 6, 2)]
    nt = nested_tensor_from_tensor_list(vols)
    out = PositionEmbeddingSine(8, normalize=True)(nt)
    assert out.shape == (2, 24, 4, 6, 5)
    torch.testing.assert_close(out, slow_reference(nt.mask, 8, 10000, True).float(), rtol=0, atol=2e-6)
    assert isinstance(nt, NestedTensor)


# ---------------------------------------------------------------- fast path and caching


def _general(pe, mask, dtype=torch.float32):
    """DETR's cumulative counts cell by cell (no gather, no line table)."""
    return pe._counts(mask, dtype, False, None)


@pytest.mark.parametrize(
    "sizes, padded",
    [
        ([(20, 31), (13, 37), (23, 9), (0, 0)], (23, 37)),
        ([(7,), (3,), (1,)], (9,)),
        ([(3, 4, 2), (2, 1, 5), (1, 1, 1)], (3, 4, 5)),
    ],
)
@pytest.mark.parametrize("normalize, offset", [(False, 0.0), (True, 0.0), (True, -0.5), (False, -1.0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fast_path_equals_general_path(sizes, padded, normalize, offset, dtype, device):
    pe = PositionEmbeddingSine(16, 20, normalize, offset=offset, cache_size=0).to(device)
    mask = _rect_mask(sizes, padded).to(device)
    padding = Padding.from_mask(mask, classify=True)
    assert padding.kind == "rectangular" and padding.at_origin
    general = _general(pe, mask, dtype)
    # sizes read from the mask on the device, one select per axis (traced / captured calls)
    torch.testing.assert_close(pe._embed_padding(padding, dtype, False), general, rtol=0, atol=0)
    # boxes from the host: slices on CPU, selects elsewhere
    torch.testing.assert_close(pe._embed_padding(padding, dtype, True), general, rtol=0, atol=0)
    from_sizes = Padding.from_sizes(sizes, padded, device=device)
    torch.testing.assert_close(pe._embed_padding(from_sizes, dtype, True), general, rtol=0, atol=0)


@pytest.mark.parametrize(
    "sizes, padded",
    [([(20, 31), (13, 37), (23, 9), (0, 0)], (23, 37)), ([(7,), (3,), (1,), (3,)], (9,)), ([(3, 4, 2), (2, 1, 5), (1, 1, 1)], (5, 6, 7))],
)
@pytest.mark.parametrize("normalize, offset", [(False, 0.0), (True, 0.0), (True, -0.5), (False, -1.0)])
def test_symmetric_boxes_take_the_line_path_and_equal_detr_counts(sizes, padded, normalize, offset, device):
    """Boxes away from the origin (MONAI's symmetric padding): the line table shifted by the
    box's start equals DETR's cumulative counts of the mask, bit for bit."""
    pe = PositionEmbeddingSine(16, 20, normalize, offset=offset, cache_size=0).to(device)
    padding = Padding.from_sizes(sizes, padded, starts="symmetric", device=device)
    assert padding.kind == "rectangular" and not padding.at_origin
    general = _general(pe, padding.mask)
    torch.testing.assert_close(pe._embed_padding(padding, torch.float32, True), general, rtol=0, atol=0)
    torch.testing.assert_close(pe(padding.mask), general, rtol=0, atol=0)  # found in the mask
    assert Padding.from_mask(padding.mask.cpu(), classify=True) == padding.to("cpu")
    nt = NestedTensor(torch.zeros(len(sizes), 1, *padded, device=device), padding)
    torch.testing.assert_close(pe(nt), general, rtol=0, atol=0)


def test_nested_tensor_takes_fast_path_without_reading_mask(monkeypatch):
    import vispos.padding._masks as masks
    import vispos._positions as positions

    nt = nested_tensor_from_tensor_list([torch.randn(3, 9, 12), torch.randn(3, 12, 7)])
    assert nt.rectangular
    pe = PositionEmbeddingSine(32, normalize=True, cache_size=0)
    expected = _general(pe, nt.mask)

    def fail(*args, **kwargs):
        pytest.fail("the mask was inspected")

    monkeypatch.setattr(masks, "find_boxes", fail)
    monkeypatch.setattr(positions, "rectangular_sizes", fail)
    monkeypatch.setattr(Padding, "mask", property(fail))
    torch.testing.assert_close(pe(nt), expected, rtol=0, atol=0)


def test_arbitrary_cpu_mask_takes_general_path():
    mask = MASKS["arbitrary"]()
    pe = PositionEmbeddingSine(16, normalize=True, cache_size=0)
    from vispos.encodings.sine import is_rectangular

    assert not is_rectangular(mask) and is_rectangular(MASKS["rectangular"]())
    assert Padding.from_mask(mask).kind == "arbitrary"
    assert Padding.from_mask(MASKS["rectangular"]()).kind == "rectangular"
    torch.testing.assert_close(pe(mask), _general(pe, mask), rtol=0, atol=0)


def test_with_features_keeps_rectangular_sizes():
    nt = nested_tensor_from_tensor_list([torch.randn(3, 37, 61), torch.randn(3, 50, 23), torch.randn(3, 1, 1)])
    for size in [(5, 8), (13, 16), (50, 61), (2, 2)]:
        level = nt.with_features(torch.randn(3, 4, *size))
        assert level.rectangular
        ref = _rect_mask(level.image_sizes, size)
        assert torch.equal(level.mask, ref), size


def test_cache_hits_and_invalidation():
    pe = PositionEmbeddingSine(16, normalize=True, zero_copy=True)
    mask = MASKS["arbitrary"]()
    pe(mask)  # a first sighting: not stored
    a = pe(mask)
    assert pe(mask) is a  # same content: served from the cache (shared, as opted in)
    other = mask.clone()
    other[0, 0, 0] = ~other[0, 0, 0]
    b = pe(other)
    assert b is not a
    torch.testing.assert_close(b, _general(pe, other), rtol=0, atol=0)
    a.add_(1)  # the caller modifies a shared result in place: the entry is dropped, not served
    c = pe(mask)
    assert c is not a
    torch.testing.assert_close(c, _general(pe, mask), rtol=0, atol=0)
    assert pe(mask, dtype=torch.float16).dtype == torch.float16  # dtype is part of the key
    pe.temperature = 20  # a changed parameter is part of the key too
    pe.dim_t = frequency_divisors(16, 20, repeat=2)
    torch.testing.assert_close(pe(mask), PositionEmbeddingSine(16, 20, normalize=True)(mask), rtol=0, atol=0)
    pe.clear_cache()
    assert len(pe._cache) == 0


def test_cache_for_grids_and_nested_tensors():
    pe = PositionEmbeddingSine(16, normalize=True, cache_size=2, zero_copy=True)
    x = torch.randn(1, 3, 5, 6)
    pe(x)  # a first sighting: not stored
    a = pe(x)
    a.mul_(0)  # zero_copy, batch of one: the cached table itself; the in-place write is detected
    torch.testing.assert_close(pe(x), PositionEmbeddingSine(16, normalize=True, cache_size=0)(x), rtol=0, atol=0)
    nt = nested_tensor_from_tensor_list([torch.randn(3, 9, 12), torch.randn(3, 12, 7)])
    pe(nt)
    assert pe(nt) is pe(nt)
    for size in (7, 7, 8, 8):
        pe(torch.randn(1, 3, size, size))
    assert len(pe._cache) == 2  # LRU bound


def test_cache_under_inference_mode_serves_autograd_later():
    pe = PositionEmbeddingSine(8)
    mask = MASKS["rectangular"]()
    with torch.inference_mode():
        first = pe(mask)
        pe(mask)  # the second sighting is stored
    w = torch.ones(1, requires_grad=True)
    later = pe(mask)
    (later * w).sum().backward()
    assert pe.cache_info().hits == 1  # served from the entry built under inference mode
    assert w.grad is not None and not later.is_inference()
    torch.testing.assert_close(later, first, rtol=0, atol=0)


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_property_rectangular_fast_path_equals_formula(data):
    n = data.draw(st.integers(1, 3))
    b = data.draw(st.integers(1, 3))
    sizes = [tuple(data.draw(st.integers(1, 4)) for _ in range(n)) for _ in range(b)]
    divisor = data.draw(st.integers(0, 3))
    nt = nested_tensor_from_tensor_list([torch.zeros(1, *s) for s in sizes], size_divisibility=divisor)
    normalize = data.draw(st.booleans())
    offset = data.draw(st.sampled_from([0.0, -0.5])) if normalize else 0.0
    feats = data.draw(st.sampled_from([2, 4, 6]))
    temperature = data.draw(st.sampled_from([20, 10000]))
    pe = PositionEmbeddingSine(feats, temperature, normalize, offset=offset, cache_size=0)
    assert nt.rectangular
    assert_matches_reference(pe(nt), slow_reference(nt.mask, feats, temperature, normalize, offset=offset))


# ---------------------------------------------------------------- fixed-cost paths (issue 14)


def _formula_path(pe, mask, dtype=torch.float32):
    """DETR's cumulative counts, cell by cell, through the validated core: the reference every
    faster path must equal bit for bit."""
    from vispos._sincos import sincos_embed
    from vispos.encodings.sine import cumulative_positions

    positions = cumulative_positions(mask, normalize=pe.normalize, scale=pe.scale, offset=pe.offset, eps=pe.eps)
    return sincos_embed(positions, pe.num_pos_feats, dtype=dtype, divisors=[pe.dim_t] * len(positions))


@pytest.mark.parametrize("shape, feats", [((2, 120, 151), 64), ((3, 9000), 128), ((2, 40, 40, 40), 32)])
@pytest.mark.parametrize("normalize, offset", [(True, 0.0), (True, -0.5), (False, 0.0), (False, -1.0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_large_arbitrary_mask_gather_path_is_bit_exact(shape, feats, normalize, offset, dtype):
    """Large blocks take the gather from the distinct (count, length) positions."""
    g = torch.Generator().manual_seed(0)
    mask = torch.rand(shape, generator=g) < 0.05
    mask[0, ..., -7:] = True  # some padding, and lines that are padding only
    pe = PositionEmbeddingSine(feats, 10000, normalize, offset=offset, cache_size=0)
    torch.testing.assert_close(pe(mask, dtype=dtype), _formula_path(pe, mask, dtype), rtol=0, atol=0)


@pytest.mark.parametrize("lengths", [[64, 40, 64, 17, 40, 64], [5, 5, 5, 7], [7, 5, 5, 5], [9, 9], [3, 8, 6]])
@pytest.mark.parametrize("normalize", [False, True])
def test_1d_items_sharing_a_length_share_a_row(normalize, lengths):
    nt = nested_tensor_from_tensor_list([torch.zeros(2, n) for n in lengths])
    pe = PositionEmbeddingSine(32, normalize=normalize, offset=-0.5, cache_size=0)
    torch.testing.assert_close(pe(nt), _formula_path(pe, nt.mask), rtol=0, atol=0)
    torch.testing.assert_close(pe(nt, dtype=torch.float16), _formula_path(pe, nt.mask, torch.float16), rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["nested", "mask", "arbitrary", "features"])
def test_out_buffer_is_written_and_returned(kind):
    nt = nested_tensor_from_tensor_list([torch.zeros(1, 9, 12), torch.zeros(1, 12, 7)])
    x = {
        "nested": nt,
        "mask": nt.mask,
        "arbitrary": MASKS["arbitrary"](),
        "features": torch.zeros(2, 3, 12, 12),
    }[kind]
    pe = PositionEmbeddingSine(16, normalize=True, offset=-0.5)
    expected = pe(x).clone()
    out = torch.full_like(expected, float("nan"))
    assert pe(x, out=out) is out
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    out.add_(1)  # the buffer is the caller's: the cache never saw it
    torch.testing.assert_close(pe(x), expected, rtol=0, atol=0)
    half = torch.empty_like(expected, dtype=torch.float16)
    torch.testing.assert_close(pe(x, dtype=torch.float16, out=half), expected.half(), rtol=0, atol=0)


def test_out_buffer_errors():
    pe = PositionEmbeddingSine(16)
    mask = torch.zeros(2, 5, 6, dtype=torch.bool)
    with pytest.raises(TypeError, match="out must be a torch.Tensor, got ndarray"):
        pe(mask, out=torch.empty(2, 32, 5, 6).numpy())
    with pytest.raises(ValueError, match=r"out must have shape \(2, 32, 5, 6\)"):
        pe(mask, out=torch.empty(2, 32, 6, 5))
    with pytest.raises(ValueError, match="dtype torch.float32"):
        pe(mask, out=torch.empty(2, 32, 5, 6, dtype=torch.float64))
    with pytest.raises(ValueError, match="dtype torch.float16"):
        pe(mask, dtype=torch.float16, out=torch.empty(2, 32, 5, 6))
    with pytest.raises(ValueError, match="must not require grad"):
        pe(mask, out=torch.empty(2, 32, 5, 6, requires_grad=True))


@pytest.mark.parametrize("kind", ["nested", "mask", "arbitrary", "features"])
def test_expanded_out_buffer_is_refused_naming_out(kind):
    """Issue 26 item 9: a stride-0 buffer got torch's raw "more than one element of the
    written-to tensor refers to a single memory location"."""
    nt = nested_tensor_from_tensor_list([torch.zeros(1, 9, 12), torch.zeros(1, 12, 7)])
    x = {"nested": nt, "mask": nt.mask, "arbitrary": MASKS["arbitrary"](), "features": torch.zeros(2, 3, 12, 12)}[kind]
    pe = PositionEmbeddingSine(16, normalize=True)
    shape = pe(x).shape
    expanded = torch.empty(1, *shape[1:]).expand(shape)
    with pytest.raises(ValueError, match=r"out must not overlap itself, got strides \(0, .*expanded \(stride-0\) view"):
        pe(x, out=expanded)
    channel_broadcast = torch.empty(shape[0], 1, *shape[2:]).expand(shape)
    with pytest.raises(ValueError, match="out must not overlap itself"):
        pe(x, out=channel_broadcast)


def test_out_buffer_with_an_empty_batch():
    out = torch.empty(0, 32, 5, 6)
    assert PositionEmbeddingSine(16)(torch.zeros(0, 5, 6, dtype=torch.bool), out=out) is out


@pytest.mark.parametrize("eps", [1e-6, 1e-8, 1e-12, 7.7e-7, 3.3e-5, 1e-3, 0.1, 1.0])
@pytest.mark.parametrize("offset, scale", [(0.0, 2 * math.pi), (-0.5, 2 * math.pi), (0.25, 1.7), (-1.0, 3.0)])
@pytest.mark.parametrize("normalize", [True, False])
def test_host_rule_equals_the_device_rule(eps, offset, scale, normalize):
    """The line table computed on the host with NumPy is bit for bit torch's: the rule on
    float32 arrays (a Python number meets them as a float32 in both)."""
    import numpy as np

    from vispos._positions import PositionRule

    rule = PositionRule(normalize, scale if normalize else 2 * math.pi, offset, eps)
    count = np.arange(0, 300, dtype=np.float32)[None, :]
    last = np.arange(0, 70001, 7, dtype=np.float32)[:, None]  # line lengths 0 .. 69993
    host = rule(count, last)
    device = rule(torch.from_numpy(count), torch.from_numpy(last))
    assert host.dtype == np.float32
    torch.testing.assert_close(torch.from_numpy(host), device, rtol=0, atol=0)


def test_divisor_table_follows_its_parameters():
    """One home for the divisors: assigning num_pos_feats or temperature checks the value,
    rebuilds dim_t and empties the cache (no staleness flag to consult at call time)."""
    from vispos._sincos import frequency_divisors

    pe = PositionEmbeddingSine(8)
    mask = torch.zeros(1, 3, 4, dtype=torch.bool)
    before = pe(mask)
    pe.temperature = 20
    assert torch.equal(pe.dim_t, frequency_divisors(8, 20, repeat=2))
    assert torch.equal(pe(mask), PositionEmbeddingSine(8, temperature=20)(mask)) and not torch.equal(pe(mask), before)
    pe.num_pos_feats = 4
    assert torch.equal(pe.dim_t, frequency_divisors(4, 20, repeat=2)) and pe(mask).shape == (1, 8, 3, 4)
    with pytest.raises(ValueError, match="num_pos_feats must be a positive even int"):
        pe.num_pos_feats = 5
    with pytest.raises(ValueError, match="temperature must be a finite number > 0"):
        pe.temperature = 0
    assert not hasattr(pe, "_dim_t_params")
