"""vispos.invariance.geometry._geometry: torch's output-size arithmetic, replayed on each item's box."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from vispos.invariance.geometry._geometry import Geometry, Window
from vispos.invariance.rules._functions import window_of


@settings(max_examples=300, deadline=None)
@given(n=st.integers(1, 40), k=st.integers(1, 7), s=st.integers(1, 4), d=st.integers(1, 3), data=st.data())
def test_out_size_is_torchs(n, k, s, d, data):
    p = data.draw(st.integers(0, k // 2))  # torch pools need padding <= kernel / 2
    ceil = data.draw(st.booleans())
    window = window_of(1, k, s, p, d, ceil)
    x = torch.zeros(1, 1, n)
    try:
        want = F.max_pool1d(x, k, s, p, d, ceil_mode=ceil).shape[-1]
    except RuntimeError:  # too small: torch refuses, the geometry says < 1
        assert window.out_size(n, 0) < 1
        return
    assert window.out_size(n, 0) == want
    if not ceil:
        assert F.conv1d(x, torch.zeros(1, 1, k), stride=s, padding=p, dilation=d).shape[-1] == want


@pytest.mark.parametrize("k, d", [(3, 1), (4, 1), (3, 2), (2, 3)])
def test_same_padding(k, d):
    window = window_of(1, k, 1, "same", d)
    x = torch.zeros(1, 1, 9)
    assert window.out_size(9, 0) == F.conv1d(x, torch.zeros(1, 1, k), padding="same", dilation=d).shape[-1] == 9
    assert window.pad_lo[0] + window.pad_hi[0] == d * (k - 1)


def test_boxes_follow_each_item_and_refuse_misaligned_starts():
    g = Geometry(2)
    conv = g.child(0, window_of(2, 3, 2, 1), "conv")
    pool = g.child(conv, window_of(2, 3, 2, 1, ceil_mode=True), "pool")
    assert g.child(0, window_of(2, 1, 1, 0), "1x1") == 0  # identity: no new geometry
    assert g.child(0, window_of(2, 3, 2, 1), "again") == conv  # the same window twice: one id
    sizes = ((13, 9), (5, 7))
    boxes = g.boxes(((0, 0), (4, 8)), sizes, (17, 16))
    for b, size in enumerate(sizes):  # each item's box has the shape torch gives the item alone
        x = F.conv2d(torch.zeros(1, 1, *size), torch.zeros(1, 1, 3, 3), stride=2, padding=1)
        assert boxes[conv][1][b] == tuple(x.shape[2:])
        assert boxes[pool][1][b] == tuple(F.max_pool2d(x, 3, 2, 1, ceil_mode=True).shape[2:])
    assert boxes[conv][0] == ((0, 0), (2, 4)) and boxes[pool][0] == ((0, 0), (1, 2))
    assert boxes[pool][2] == tuple(F.max_pool2d(torch.zeros(1, 1, 9, 8), 3, 2, 1, ceil_mode=True).shape[2:])
    with pytest.raises(ValueError, match=r"item 1 starts at 1 on axis 0 of the input to pool \(stride 2\)"):
        g.boxes(((0, 0), (2, 0)), ((5, 5), (5, 5)), (9, 9))


def test_sums_of_maps_that_differ_for_an_item_are_refused():
    g = Geometry(1)
    a = g.child(0, window_of(1, 3, 2, 1), "conv a")
    b = g.child(0, window_of(1, 2, 2, 0), "conv b")
    g.require_equal(a, b, "add")
    assert g.boxes(((0,),), ((8,),), (8,))  # 8 -> 4 both ways
    with pytest.raises(ValueError, match=r"the two inputs of add cover different cells .* shape mismatch"):
        g.boxes(((0,),), ((9,),), (9,))  # 9 -> 5 and 4


def test_sums_whose_canvases_differ_name_the_canvas():
    """An item whose maps agree on a canvas whose maps do not: the batch's shapes, not the item's,
    fail, and the message says so."""
    g = Geometry(1)
    a = g.child(0, window_of(1, 3, 2, 1), "conv a")
    b = g.child(0, window_of(1, 2, 2, 0), "conv b")
    g.require_equal(a, b, "add")
    with pytest.raises(ValueError, match=r"inputs of add are \(5,\) and \(4,\) cells on the padded canvas \(9,\)"):
        g.boxes(((0,),), ((8,),), (9,))  # the item: 4 both ways; the canvas: 5 and 4
