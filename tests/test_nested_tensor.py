import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vispos import NestedTensor, interpolate_mask, nested_tensor_from_tensor_list


@pytest.mark.parametrize("sizes", [[(3, 5, 7), (3, 4, 9)], [(2, 3, 4, 5), (2, 5, 2, 5), (2, 1, 1, 1)], [(4, 10), (4, 3)]])
def test_pad_mask_sizes_and_round_trip(sizes, device):
    items = [torch.randn(*s, device=device) for s in sizes]
    copies = [t.clone() for t in items]
    nt = nested_tensor_from_tensor_list(items, pad_value=-7.0)
    spatial = [max(s[i] for s in sizes) for i in range(1, len(sizes[0]))]
    assert nt.tensors.shape == (len(items), sizes[0][0], *spatial)
    assert nt.mask.shape == (len(items), *spatial) and nt.mask.dtype == torch.bool
    assert len(nt) == len(items)
    assert nt.image_sizes == [tuple(s[1:]) for s in sizes]
    for i, t in enumerate(items):
        torch.testing.assert_close(nt[i], t, rtol=0, atol=0)
        region = tuple(slice(0, s) for s in sizes[i][1:])
        expected_mask = torch.ones(spatial, dtype=torch.bool, device=device)
        expected_mask[region] = False
        assert torch.equal(nt.mask[i], expected_mask)
        pad = nt.tensors[i][:, nt.mask[i]]
        assert torch.all(pad == -7.0)
    for t, c in zip(items, copies):  # inputs untouched
        assert torch.equal(t, c)
    assert torch.equal(nt[-1], items[-1])


def test_size_divisibility_and_decompose():
    nt = nested_tensor_from_tensor_list([torch.ones(1, 33, 40), torch.ones(1, 20, 70)], size_divisibility=32)
    assert nt.tensors.shape == (2, 1, 64, 96)
    tensors, mask = nt.decompose()
    assert tensors is nt.tensors and mask is nt.mask
    assert nt.image_sizes == [(33, 40), (20, 70)]


def test_image_sizes_from_mask_and_to():
    mask = torch.ones(2, 6, 8, dtype=torch.bool)
    mask[0, :4, :5] = False
    mask[1, :6, :2] = False
    nt = NestedTensor(torch.randn(2, 3, 6, 8), mask)
    assert nt.image_sizes == [(4, 5), (6, 2)]
    assert nt[0].shape == (3, 4, 5)
    moved = nt.to(torch.float64)
    assert moved is not nt and moved.tensors.dtype == torch.float64 and moved.mask.dtype == torch.bool
    assert nt.tensors.dtype == torch.float32
    assert "NestedTensor(tensors=torch.float32[2, 3, 6, 8], mask=bool[2, 6, 8]" in repr(nt)


def test_no_mask():
    nt = NestedTensor(torch.randn(2, 3, 4, 5), None)
    assert nt.image_sizes == [(4, 5), (4, 5)]
    assert nt.to(torch.float16).mask is None


@pytest.mark.parametrize(
    "tensors, exc, match",
    [
        ([], ValueError, "at least one tensor"),
        (torch.randn(2, 3, 4, 4), TypeError, "list or tuple"),
        ([torch.randn(3, 4, 4), "x"], TypeError, r"tensors\[1\] must be a torch.Tensor"),
        ([torch.randn(3, 4, 4), torch.randn(3, 2, 4, 4)], ValueError, r"tensors\[1\] has shape \(3, 2, 4, 4\)"),
        ([torch.randn(3, 4, 4), torch.randn(1, 4, 4)], ValueError, r"tensors\[1\] has 1 channels"),
        ([torch.randn(3, 4, 4), torch.randn(3, 4, 4).double()], ValueError, r"tensors\[1\] has dtype"),
        ([torch.randn(3, 0, 4)], ValueError, "zero-size"),
        ([torch.randn(4)], ValueError, r"tensors\[0\] must have shape"),
        ([torch.randn(1, 2, 2, 2, 2)], ValueError, r"tensors\[0\] must have shape"),
    ],
)
def test_bad_lists(tensors, exc, match):
    with pytest.raises(exc, match=match):
        nested_tensor_from_tensor_list(tensors)


@pytest.mark.parametrize("value, exc", [(-1, ValueError), (1.5, TypeError), (True, TypeError)])
def test_bad_size_divisibility(value, exc):
    with pytest.raises(exc, match="size_divisibility"):
        nested_tensor_from_tensor_list([torch.randn(3, 4, 4)], size_divisibility=value)


def test_bad_constructor_and_index():
    with pytest.raises(TypeError, match="dtype torch.bool"):
        NestedTensor(torch.randn(2, 3, 4, 4), torch.zeros(2, 4, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"mask must have shape \(B, \*S\) = \(2, 4, 4\)"):
        NestedTensor(torch.randn(2, 3, 4, 4), torch.zeros(2, 4, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="1 to 3 spatial axes"):
        NestedTensor(torch.randn(2, 3), None)
    with pytest.raises(TypeError, match="tensors must be a torch.Tensor"):
        NestedTensor([1, 2], None)
    nt = nested_tensor_from_tensor_list([torch.randn(3, 4, 4)])
    with pytest.raises(IndexError, match="out of range"):
        nt[1]
    with pytest.raises(ValueError, match=r"image_sizes\[0\]"):
        NestedTensor(torch.randn(1, 3, 4, 4), None, image_sizes=[(5, 4)])


@pytest.mark.parametrize("shape, size", [((2, 12), (5,)), ((2, 12, 17), (3, 5)), ((1, 8, 12, 16), (2, 3, 4))])
def test_interpolate_mask_matches_detr(shape, size):
    mask = torch.rand(shape) > 0.5
    ref = torch.nn.functional.interpolate(mask[None].float(), size=size).to(torch.bool)[0]
    out = interpolate_mask(mask, size)
    assert out.dtype == torch.bool and torch.equal(out, ref)
    assert torch.equal(interpolate_mask(mask, shape[1:]), mask)


def test_interpolate_mask_errors():
    mask = torch.zeros(2, 8, 8, dtype=torch.bool)
    with pytest.raises(TypeError, match="dtype torch.bool"):
        interpolate_mask(mask.float(), (4, 4))
    with pytest.raises(ValueError, match="2 positive ints"):
        interpolate_mask(mask, (4, 4, 4))
    with pytest.raises(ValueError, match="2 positive ints"):
        interpolate_mask(mask, (0, 4))
    with pytest.raises(TypeError, match="size must be"):
        interpolate_mask(mask, (4.0, 4))
    assert interpolate_mask(mask, 4).shape == (2, 4, 4)


@settings(max_examples=40, deadline=None)
@given(
    n_axes=st.integers(1, 3),
    data=st.data(),
)
def test_round_trip_property(n_axes, data):
    n = data.draw(st.integers(1, 4))
    c = data.draw(st.integers(1, 3))
    shapes = [tuple(data.draw(st.integers(1, 6)) for _ in range(n_axes)) for _ in range(n)]
    div = data.draw(st.integers(0, 4))
    items = [torch.randn(c, *s) for s in shapes]
    nt = nested_tensor_from_tensor_list(items, size_divisibility=div)
    for i, t in enumerate(items):
        assert torch.equal(nt[i], t)
        assert int((~nt.mask[i]).sum()) == t[0].numel()
    if div:
        assert all(s % div == 0 for s in nt.tensors.shape[2:])
    rebuilt = NestedTensor(nt.tensors, nt.mask)
    assert rebuilt.image_sizes == [tuple(s) for s in shapes]
