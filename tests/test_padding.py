"""vispos.padding: every padding-mask fact, against slow references written from the definitions."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch.testing import assert_close

from vispos import nested_tensor_from_tensor_list
from vispos.nested_tensor import NestedTensor, SpatialInput, parse_spatial_input
from vispos.padding import (
    check_mask,
    interpolate_mask,
    is_rectangular,
    mask_sizes,
    rectangular_sizes,
    mask_valid_ratios,
    resize_image_sizes,
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
    assert_close(mask_valid_ratios(mask), torch.stack(expected, -1), rtol=0, atol=0)


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
    assert isinstance(rec, SpatialInput) and rec.host
    assert rec.padding is nt.padding and rec.padding.spatial == (4, 6) and rec.padding.batch == 2
    assert rec.padding.sizes == ((4, 5), (2, 6)) and rec.padding.kind == "rectangular"
    # a batch read from a CPU mask: classified on the host, the same padding
    plain = parse_spatial_input(NestedTensor(nt.tensors, nt.mask))
    assert plain.padding.kind == "rectangular" and plain.padding == nt.padding
    feat = parse_spatial_input(torch.zeros(2, 8, 3, 5))
    assert feat.padding.kind == "none" and feat.padding.spatial == (3, 5)
    with pytest.raises(TypeError, match=r"a float mask \(B, H, W\) and a 1D feature map \(B, C, L\) look alike"):
        parse_spatial_input(torch.zeros(2, 4, 5))
    assert parse_spatial_input(torch.zeros(2, 4, 5), num_axes=1).padding.spatial == (5,)


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


# ------------------------------------------------------------------ the Padding value object
import copy  # noqa: E402
import pickle  # noqa: E402
from unittest import mock  # noqa: E402

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from vispos import Padding  # noqa: E402


def _slow_boxes_mask(starts, stops, spatial):
    """True outside each item's box, cell by cell."""
    mask = torch.ones(len(starts), *spatial, dtype=torch.bool)
    for b, (start, stop) in enumerate(zip(starts, stops)):
        for idx in itertools.product(*(range(s) for s in spatial)):
            if all(a <= i < e for a, i, e in zip(start, idx, stop)):
                mask[(b, *idx)] = False
    return mask


def _slow_bbox(mask):
    """Per item: first valid index and one past the last along every axis, cell by cell."""
    starts, stops = [], []
    for item in mask:
        cells = [idx for idx in itertools.product(*(range(s) for s in item.shape)) if not item[idx]]
        if not cells:
            starts.append(tuple(0 for _ in item.shape))
            stops.append(tuple(0 for _ in item.shape))
            continue
        starts.append(tuple(min(c[a] for c in cells) for a in range(item.dim())))
        stops.append(tuple(max(c[a] for c in cells) + 1 for a in range(item.dim())))
    return tuple(starts), tuple(stops)


@st.composite
def boxes(draw, min_batch=1):
    """(sizes, starts, spatial): per-item boxes anywhere in a random padded grid."""
    n = draw(st.integers(1, 3))
    spatial = tuple(draw(st.integers(1, 6)) for _ in range(n))
    batch = draw(st.integers(min_batch, 3))
    sizes, starts = [], []
    for _ in range(batch):
        size = tuple(draw(st.integers(0, s)) for s in spatial)
        start = tuple(draw(st.integers(0, s - v)) for s, v in zip(spatial, size))
        sizes.append(size)
        starts.append(start)
    return sizes, starts, spatial


@settings(max_examples=60, deadline=None)
@given(box=boxes(), origin=st.booleans())
def test_from_sizes_mask_is_exact_and_found_again_in_it(box, origin):
    sizes, starts, spatial = box
    if origin:
        starts = [tuple(0 for _ in spatial) for _ in sizes]
    padding = Padding.from_sizes(sizes, spatial, starts=starts)
    assert padding.kind == "rectangular" and padding.at_origin == (origin or all(not any(s) for s in padding.starts))
    stops = [tuple(a + v for a, v in zip(s, size)) for s, size in zip(starts, sizes)]
    expected = _slow_boxes_mask(starts, stops, spatial)
    assert torch.equal(padding.mask, expected)
    found = Padding.from_mask(expected)  # classified on the host
    assert found.kind == "rectangular" and found == padding and hash(found) == hash(padding)
    assert (found.starts, found.stops) == (padding.starts, padding.stops) == _slow_bbox(expected)
    assert padding.sizes == tuple(tuple(e - s for s, e in zip(a, b)) for a, b in _slow_bbox_pairs(expected))
    unread = Padding.from_mask(expected, classify=False)  # the same cells, no box known
    assert unread.kind == "arbitrary" and unread == padding and unread.sizes == padding.sizes


def _slow_bbox_pairs(mask):
    starts, stops = _slow_bbox(mask)
    return list(zip(starts, stops))


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_random_masks_are_rectangular_exactly_when_they_are_boxes(data):
    n = data.draw(st.integers(1, 3))
    spatial = tuple(data.draw(st.integers(1, 5)) for _ in range(n))
    batch = data.draw(st.integers(1, 3))
    cells = batch * math.prod(spatial)
    mask = torch.tensor(data.draw(st.lists(st.booleans(), min_size=cells, max_size=cells))).view(batch, *spatial)
    padding = Padding.from_mask(mask)
    starts, stops = _slow_bbox(mask)
    is_boxes = torch.equal(mask, _slow_boxes_mask(starts, stops, spatial))
    assert padding.kind == ("rectangular" if is_boxes else "arbitrary")
    assert (padding.starts, padding.stops) == (starts, stops)
    assert torch.equal(padding.mask, mask) and padding.mask is mask  # kept, not copied
    assert padding.valid_ratios().tolist() == mask_valid_ratios(mask).tolist()


@settings(max_examples=80, deadline=None)
@given(box=boxes(), data=st.data())
def test_resize_of_boxes_equals_interpolating_the_mask(box, data):
    """DETR's rule for feature levels: a rectangular padding resized on the host is exactly the
    nearest interpolation of its mask, and stays rectangular."""
    sizes, starts, spatial = box
    new = tuple(data.draw(st.integers(1, 9)) for _ in spatial)
    padding = Padding.from_sizes(sizes, spatial, starts=starts)
    resized = padding.resize(new)
    expected = interpolate_mask(padding.mask, new)
    assert resized.kind == "rectangular" and resized.spatial == new
    assert torch.equal(resized.mask, expected)
    assert resized == Padding.from_mask(expected)
    assert_close(resized.valid_ratios(torch.float64), mask_valid_ratios(expected, torch.float64), rtol=0, atol=0)
    arbitrary = Padding.from_mask(padding.mask, classify=False).resize(new)
    assert torch.equal(arbitrary.mask, expected)


def test_resize_image_sizes_is_the_same_host_rule():
    sizes = [(20, 17), (3, 9), (1, 1)]
    padding = Padding.from_sizes(sizes, (20, 17))
    assert resize_image_sizes(sizes, (20, 17), (7, 5)) == list(padding.resize((7, 5)).sizes)


def test_none_padding_views():
    padding = Padding.none(2, (3, 4))
    assert padding.kind == "none" and padding.at_origin and padding.sizes == ((3, 4), (3, 4))
    assert torch.equal(padding.mask, torch.zeros(2, 3, 4, dtype=torch.bool))
    assert padding == Padding.from_sizes([(3, 4), (3, 4)], (3, 4))  # the same cells
    assert padding.resize((5, 6)) == Padding.none(2, (5, 6))
    assert padding.valid_ratios().tolist() == [[1.0, 1.0], [1.0, 1.0]]
    assert padding.resize((3, 4)) is padding and padding.pin_memory() is padding


def test_symmetric_starts_follow_monai_spatial_pad():
    monai = pytest.importorskip("monai.transforms")
    img = torch.rand(1, 5, 8)
    padded = monai.SpatialPad((9, 11), method="symmetric")(img)
    padding = Padding.from_sizes([(5, 8)], (9, 11), starts="symmetric")
    assert padding.starts == ((2, 1),) and padding.stops == ((7, 9),)
    assert torch.equal(torch.as_tensor(padded)[0][~padding.mask[0]].view(5, 8), img[0])


def test_equality_hash_repr_pickle_and_copies():
    a = Padding.from_sizes([(4, 5), (2, 6)], (4, 6))
    b = Padding.from_mask(a.mask.clone())
    other = Padding.from_sizes([(4, 5), (2, 5)], (4, 6))
    assert a == b and hash(a) == hash(b) and a != other and a != Padding.from_sizes([(4, 5), (2, 6)], (5, 6))
    assert a != "rectangular" and len({a, b, other}) == 2
    assert repr(a) == "Padding(kind='rectangular', batch=2, spatial=(4, 6), sizes=[(4, 5), (2, 6)], device=cpu)"
    sym = Padding.from_sizes([(2, 3)], (4, 6), starts="symmetric")
    assert repr(sym) == "Padding(kind='rectangular', batch=1, spatial=(4, 6), sizes=[(2, 3)], starts=[(1, 1)], device=cpu)"
    holed = a.mask.clone()
    holed[0, 1, 1] = True
    arb = Padding.from_mask(holed)
    assert repr(arb) == "Padding(kind='arbitrary', batch=2, spatial=(4, 6), device=cpu)"
    for p in (a, b, sym, arb, Padding.none(3, (2,))):
        clone = pickle.loads(pickle.dumps(p))
        assert clone == p and clone.kind == p.kind and torch.equal(clone.mask, p.mask)
        assert copy.deepcopy(p) == p
    fresh = Padding.from_sizes([(1, 2)], (3, 3))  # no mask built yet: pickles as its boxes
    assert len(pickle.dumps(fresh)) < len(pickle.dumps(Padding.from_mask(fresh.mask)))


def test_to_and_copies_never_share_storage_when_asked():
    a = Padding.from_mask(torch.tensor([[False, True, False]]))
    assert a.to("cpu") is a and a.to() is a
    c = a.to("cpu", copy=True)
    assert c == a and c.mask.untyped_storage().data_ptr() != a.mask.untyped_storage().data_ptr()
    r = Padding.from_sizes([(2,)], (3,))
    r.mask  # noqa: B018 - built
    rc = r.to("cpu", copy=True)
    assert rc == r and rc.mask.untyped_storage().data_ptr() != r.mask.untyped_storage().data_ptr()


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda: Padding(), TypeError, r"build a Padding with Padding.from_sizes"),
        (lambda: Padding.from_sizes([(2, 2)], (3,)), ValueError, r"sizes\[0\] = \(2, 2\) must have 1 entries"),
        (lambda: Padding.from_sizes([(2.0, 2)], (3, 3)), TypeError, r"sizes\[0\] must hold ints"),
        (lambda: Padding.from_sizes("22", (3, 3)), TypeError, r"sizes must be a sequence of per-item sizes"),
        (lambda: Padding.from_sizes([(4, 2)], (3, 3)), ValueError, r"item 0 \(starts \(0, 0\), sizes \(4, 2\)\) does not fit"),
        (lambda: Padding.from_sizes([(2, 2)], (3, 3), starts=[(2, 0)]), ValueError, r"does not fit in the padded size \(3, 3\)"),
        (lambda: Padding.from_sizes([(-1, 2)], (3, 3)), ValueError, r"must be >= 0"),
        (lambda: Padding.from_sizes([(1, 2)], (3, 3), starts="center"), ValueError, r"starts must be per-item ints or 'symmetric', got 'center'"),
        (lambda: Padding.from_sizes([(1, 2)], (3, 3), starts=[(0, 0), (0, 0)]), ValueError, r"starts has 2 items but sizes has 1"),
        (lambda: Padding.from_sizes(torch.ones(1, 2), (3, 3)), TypeError, r"sizes must hold integers, got a tensor of dtype torch.float32"),
        (lambda: Padding.from_sizes([(1,)], (1, 2, 3, 4)), ValueError, r"spatial must hold 1 to 3 sizes"),
        (lambda: Padding.from_sizes([(1,)], 3), TypeError, r"spatial must be a sequence of 1 to 3 ints"),
        (lambda: Padding.none(-1, (3,)), ValueError, r"batch must be >= 0, got -1"),
        (lambda: Padding.none(2, (3.0,)), TypeError, r"spatial must be an int or a sequence of 1 ints"),
        (lambda: Padding.from_mask(torch.zeros(2, 3)), TypeError, r"mask must have dtype torch.bool"),
        (lambda: Padding.from_mask(torch.zeros(2, dtype=torch.bool)), ValueError, r"1 to 3 spatial axes"),
        (lambda: Padding.from_mask(torch.zeros(2, 3, dtype=torch.bool), classify=1), TypeError, r"classify must be a bool or None"),
        (lambda: Padding.none(1, (3,)).resize((0,)), ValueError, r"size must hold 1 positive ints, got \(0,\)"),
        (lambda: Padding.none(1, (3,)).resize(2.0), TypeError, r"size must be an int or a sequence of 1 ints"),
        (lambda: Padding.none(1, (3,)).to("cpu", copy=1), TypeError, r"copy must be a bool"),
        (lambda: Padding.none(1, (3,)).valid_ratios(torch.int64), TypeError, r"dtype must be a floating torch.dtype"),
    ],
)
def test_padding_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_tensor_sizes_are_read_once_on_the_host():
    padding = Padding.from_sizes(torch.tensor([[2, 3], [1, 1]]), (3, 3))
    assert padding.sizes == ((2, 3), (1, 1))


def test_device_masks_are_not_read_unless_asked():
    """A mask on an accelerator (simulated: host_side False) is not classified, so an encoder
    call reads nothing back; classify=True reads it."""
    mask = Padding.from_sizes([(2, 3)], (4, 4)).mask
    with mock.patch("vispos._tracing.host_side", lambda device: False):
        assert Padding.from_mask(mask).kind == "arbitrary"
        assert Padding.from_mask(mask, classify=True).kind == "rectangular"


# ------------------------------------------------- every encoder agrees with the mask alone
from vispos import (  # noqa: E402
    PositionEmbeddingLearned,
    PositionEmbeddingSine,
    PositionEmbeddingSineDepthAdded,
)
from vispos._sincos import sincos_embed  # noqa: E402
from vispos.backbones import flatten_levels  # noqa: E402
from vispos.encodings.sine import cumulative_positions  # noqa: E402


def _sine_from_mask(pe, mask):
    """What the mask alone gives: DETR's cumulative counts of the mask through the validated
    core, on full position tensors (equal to the cell-by-cell float64 formula, see test_sine)."""
    positions = cumulative_positions(mask, normalize=pe.normalize, scale=pe.scale, offset=pe.offset, eps=pe.eps)
    return sincos_embed(positions, pe.num_pos_feats, divisors=[pe.dim_t] * len(positions))


def _depth_added_from_mask(pe, mask):
    z, y, x = cumulative_positions(mask, normalize=pe.normalize, scale=pe.scale, offset=pe.offset, eps=pe.eps)
    plane = sincos_embed([y, x], pe.num_pos_feats, temperature=pe.temperature)
    return plane + sincos_embed([z], 2 * pe.num_pos_feats, temperature=pe.temperature)


def _inputs(padding, channels=2):
    """The same cells handed over every way a caller can: a NestedTensor of the Padding, of
    the mask (classified on the host), of the mask unread (arbitrary), the bare mask."""
    tensors = torch.zeros(padding.batch, channels, *padding.spatial)
    mask = padding.mask.clone()
    return {
        "padding": NestedTensor(tensors, padding),
        "nested mask": NestedTensor(tensors, mask),
        "unread mask": NestedTensor(tensors, Padding.from_mask(mask, classify=False)),
        "bool mask": mask,
    }


@st.composite
def paddings(draw):
    """A padding from random sizes (boxes at the origin or anywhere) or from a random mask."""
    mode = draw(st.sampled_from(["origin", "boxes", "mask"]))
    if mode == "mask":
        n = draw(st.integers(1, 3))
        spatial = tuple(draw(st.integers(1, 5)) for _ in range(n))
        batch = draw(st.integers(1, 3))
        cells = batch * math.prod(spatial)
        values = draw(st.lists(st.booleans(), min_size=cells, max_size=cells))
        return Padding.from_mask(torch.tensor(values).view(batch, *spatial))
    sizes, starts, spatial = draw(boxes())
    return Padding.from_sizes(sizes, spatial, starts=None if mode == "origin" else starts)


SINE_VARIANTS = [
    dict(),
    dict(normalize=True),
    dict(normalize=True, offset=-0.5),  # Deformable-DETR
    dict(offset=-1.0, temperature=20),
    dict(normalize=True, scale=1.0, eps=1e-3),
]


@settings(max_examples=70, deadline=None)
@given(padding=paddings(), variant=st.sampled_from(range(len(SINE_VARIANTS))), device_branch=st.booleans())
def test_every_encoder_agrees_with_the_mask_alone(padding, variant, device_branch):
    """Issue 19: NestedTensors built from random sizes and from random masks, in 1D/2D/3D,
    through every path (host boxes, boxes read on the device, cumulative counts, the forced
    device branch): each mask-taking encoder gives what the mask alone gives."""
    mask = padding.mask
    kwargs = SINE_VARIANTS[variant]
    pe = PositionEmbeddingSine(4, cache_size=0, **kwargs)
    expected = _sine_from_mask(pe, mask)
    with mock.patch("vispos._tracing.host_side", lambda device: not device_branch):
        for name, x in _inputs(padding).items():
            assert_close(pe(x), expected, rtol=0, atol=0, msg=name)
    if padding.kind == "rectangular" and padding.at_origin:  # traced form: sizes from the mask
        assert_close(pe._embed_padding(padding, torch.float32, False), expected, rtol=0, atol=0)
    # the batch padded from its items (DETR's collate) agrees with its own mask too
    if padding.kind == "rectangular" and padding.at_origin and all(0 not in s for s in padding.sizes):
        items = [torch.zeros(1, *s) for s in padding.sizes]
        nt = nested_tensor_from_tensor_list(items)
        assert_close(pe(nt), _sine_from_mask(pe, nt.mask), rtol=0, atol=0)
    if padding.num_axes == 3:
        depth = PositionEmbeddingSineDepthAdded(4, cache_size=0, **{k: v for k, v in kwargs.items() if k != "temperature"})
        want = _depth_added_from_mask(depth, mask)
        for name, x in _inputs(padding).items():
            assert_close(depth(x), want, rtol=0, atol=0, msg=name)
    # learned: DETR's table rows by cell index, the mask ignored, whatever form it came in
    learned = PositionEmbeddingLearned(4, num_embeddings=8, num_axes=padding.num_axes)
    rows = learned(torch.zeros(padding.batch, 1, *padding.spatial))
    for name, x in _inputs(padding).items():
        assert_close(learned(x), rows, rtol=0, atol=0, msg=name)
    # Deformable-DETR's encoder input: the level's key padding mask and valid ratios
    if padding.num_axes >= 2:
        flat = flatten_levels([NestedTensor(torch.zeros_like(expected), padding)], [expected])
        assert torch.equal(flat.key_padding_mask, mask.flatten(1))
        assert_close(flat.valid_ratios[:, 0], mask_valid_ratios(mask), rtol=0, atol=0)


def test_a_mask_written_in_place_stays_the_truth():
    """One truth after construction too: writing into the mask a padding read (or built) makes
    the padding read it again, so no box ever disagrees with the mask in the caller's hands."""
    pe = PositionEmbeddingSine(8, normalize=True)
    nt = nested_tensor_from_tensor_list([torch.zeros(1, 4, 5), torch.zeros(1, 3, 6)])
    before = pe(nt)
    assert nt.rectangular
    nt.mask[0, 0, 0] = True  # a hole in the mask the batch built from its boxes
    assert nt.padding.kind == "arbitrary" and not nt.rectangular
    assert_close(pe(nt), _sine_from_mask(pe, nt.mask), rtol=0, atol=0)
    assert not torch.equal(pe(nt), before)
    mask = Padding.from_sizes([(2, 2)], (3, 3)).mask.clone()
    padding = Padding.from_mask(mask)
    assert padding.kind == "rectangular" and padding.sizes == ((2, 2),)
    mask[0, 2, :2] = False  # still a box, a larger one: found again
    assert padding.kind == "rectangular" and padding.sizes == ((3, 2),)
    assert padding == Padding.from_sizes([(3, 2)], (3, 3))
    with torch.inference_mode():  # inference tensors have no version counter to follow
        inference = nested_tensor_from_tensor_list([torch.zeros(1, 4, 5), torch.zeros(1, 3, 6)])
        assert inference.padding.kind == "rectangular" and pe(inference).shape == before.shape
    assert Padding.from_mask(inference.mask) == inference.padding


def test_host_box_reading_matches_the_torch_ops():
    """find_boxes reads a CPU mask with NumPy (vispos/padding/_masks_host.py): the same sizes and
    mismatches as the torch ops it replaces, on boxes at and off the origin, holes, transposed
    (non-contiguous) masks and 1-3 axes."""
    from vispos.padding import _mask_origin
    from vispos.padding._masks_host import origin_mismatch

    gen = torch.Generator().manual_seed(0)
    for trial in range(300):
        n = trial % 3 + 1
        spatial = [int(v) for v in torch.randint(1, 7, (n,), generator=gen)]
        mask = torch.ones(3, *spatial, dtype=torch.bool)
        for b in range(3):
            start = [int(torch.randint(0, s + 1, (1,), generator=gen)) if trial % 4 == 0 else 0 for s in spatial]
            stop = [int(torch.randint(a, s + 1, (1,), generator=gen)) for a, s in zip(start, spatial)]
            mask[(b, *(slice(a, e) for a, e in zip(start, stop)))] = False
        if trial % 5 == 0:
            mask.view(-1)[int(torch.randint(0, mask.numel(), (1,), generator=gen))] ^= True
        if trial % 7 == 0 and n > 1:
            mask = mask.transpose(1, n)
        spatial = tuple(mask.shape[1:])
        sizes = _mask_origin.rectangular_sizes(mask)
        wrong = (mask == _mask_origin.origin_boxes(sizes, spatial)).flatten(1).any(1)
        assert origin_mismatch(mask, spatial) == (sizes.tolist(), wrong.tolist())


def test_valid_is_the_mask_inverted_kept_once_and_follows_in_place_writes():
    padding = Padding.from_sizes([(3, 4), (5, 2)], (5, 4))
    valid = padding.valid
    assert valid.dtype == torch.bool and torch.equal(valid, ~padding.mask)
    assert padding.valid is valid  # derived once: no kernel per layer that reads it
    mask = torch.zeros(2, 5, 4, dtype=torch.bool)
    given = Padding.from_mask(mask)
    before = given.valid
    mask[1, 4:] = True  # the caller's mask is the truth from then on
    assert given.valid is not before and torch.equal(given.valid, ~mask)


def test_valid_under_inference_mode_and_of_an_inference_mask():
    """An inference tensor has no version counter to key a kept value on: ``valid`` of a mask
    built (or given) under ``torch.inference_mode()`` is its inverse all the same, and a value
    derived there is not kept for a later training step (an inference tensor cannot be saved for
    backward)."""
    with torch.inference_mode():
        built = Padding.from_sizes([(3, 4), (5, 2)], (5, 4))
        assert torch.equal(built.valid, ~built.mask)
        mask = torch.zeros(2, 5, 4, dtype=torch.bool)
        given = Padding.from_mask(mask)
        assert torch.equal(given.valid, ~mask)
        mask[1, 4:] = True  # no version to notice it by: derived again
        assert torch.equal(given.valid, ~mask)
    padding = Padding.from_sizes([(3, 4), (5, 2)], (5, 4))
    padding.mask  # noqa: B018 - built outside inference mode
    with torch.inference_mode():
        assert torch.equal(padding.valid, ~padding.mask)
    valid = padding.valid
    assert not valid.is_inference()
    x = torch.randn(2, 5, 4, requires_grad=True)
    torch.where(valid, x, 0.0).sum().backward()  # saved for backward
    assert torch.equal(x.grad, valid.double().float())
