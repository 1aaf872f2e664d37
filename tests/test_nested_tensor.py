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
        ([torch.randn(3, 4, 4), torch.randn(1, 4, 4)], ValueError, r"tensors\[1\] has 1 channel \("),
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


# ------------------------------------------------------------------ DataLoader collation (issue 13)
import pickle  # noqa: E402

from torch.utils.data import DataLoader, Dataset  # noqa: E402
from torch.utils.data._utils.pin_memory import pin_memory as torch_pin_memory  # noqa: E402

from vispos import PaddedCollate, collate_fn  # noqa: E402

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


class _VariableSizeItems(Dataset):
    """Item i: an image (3, H_i, W_i) or volume (1, D_i, H_i, W_i) with a target dict; the
    content depends only on i, so every worker process builds the same item."""

    def __init__(self, n: int, n_spatial: int = 2) -> None:
        self.n, self.n_spatial = n, n_spatial

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(1000 + i)
        size = [int(s) for s in torch.randint(3, 12, (self.n_spatial,), generator=g)]
        channels = 3 if self.n_spatial == 2 else 1
        image = torch.randn(channels, *size, generator=g)
        target = {"labels": torch.randint(0, 3, (i % 3 + 1,), generator=g), "boxes": torch.rand(i % 3 + 1, 4, generator=g), "id": i}
        return image, target


def _assert_same_batch(a, b):
    (na, ta), (nb, tb) = a, b
    torch.testing.assert_close(na.tensors, nb.tensors, rtol=0, atol=0)
    assert torch.equal(na.mask, nb.mask)
    assert na.image_sizes == nb.image_sizes and na.rectangular == nb.rectangular
    assert len(ta) == len(tb)
    for x, y in zip(ta, tb):
        assert x["id"] == y["id"]
        torch.testing.assert_close(x["labels"], y["labels"], rtol=0, atol=0)
        torch.testing.assert_close(x["boxes"], y["boxes"], rtol=0, atol=0)


@pytest.mark.parametrize("n_spatial", [2, 3])
@pytest.mark.parametrize("divisibility, pad_value", [(0, 0.0), (4, -1.5)])
def test_padded_collate_matches_nested_tensor_from_tensor_list(n_spatial, divisibility, pad_value):
    ds = _VariableSizeItems(5, n_spatial)
    batch = [ds[i] for i in range(5)]
    copies = [(img.clone(), {k: v.clone() if torch.is_tensor(v) else v for k, v in t.items()}) for img, t in batch]
    nested, targets = PaddedCollate(divisibility, pad_value)(batch)
    ref = nested_tensor_from_tensor_list([img for img, _ in batch], divisibility, pad_value)
    _assert_same_batch((nested, targets), (ref, tuple(t for _, t in batch)))
    assert isinstance(targets, tuple) and all(t is b[1] for t, b in zip(targets, batch))  # passed through
    assert nested.rectangular and nested.image_sizes == [tuple(img.shape[1:]) for img, _ in batch]
    for (img, t), (ci, ct) in zip(batch, copies):  # inputs untouched
        assert torch.equal(img, ci) and torch.equal(t["boxes"], ct["boxes"])
    if divisibility == 0 and pad_value == 0.0:
        _assert_same_batch(collate_fn(batch), (nested, targets))


def test_padded_collate_takes_tv_tensors_and_returns_plain_tensors():
    tv_tensors = pytest.importorskip("torchvision.tv_tensors")
    batch = [(tv_tensors.Image(torch.rand(3, 4, 6)), None), (tv_tensors.Image(torch.rand(3, 5, 2)), None)]
    nested, targets = collate_fn(batch)
    assert type(nested.tensors) is torch.Tensor and targets == (None, None)
    ref = nested_tensor_from_tensor_list([b[0].as_subclass(torch.Tensor) for b in batch])
    torch.testing.assert_close(nested.tensors, ref.tensors, rtol=0, atol=0)


def test_padded_collate_pickles_and_repr():
    collate = PaddedCollate(size_divisibility=8, pad_value=2)
    clone = pickle.loads(pickle.dumps(collate))
    assert repr(clone) == "PaddedCollate(size_divisibility=8, pad_value=2)" == repr(collate)
    batch = [_VariableSizeItems(2)[i] for i in range(2)]
    _assert_same_batch(clone(batch), collate(batch))
    assert pickle.loads(pickle.dumps(collate_fn)) is collate_fn


def test_padded_collate_errors():
    with pytest.raises(TypeError, match="size_divisibility must be a non-negative int, got 2.0"):
        PaddedCollate(2.0)
    with pytest.raises(ValueError, match="size_divisibility must be >= 0, got -1"):
        PaddedCollate(-1)
    with pytest.raises(TypeError, match="pad_value must be a real number, got '0'"):
        PaddedCollate(0, "0")
    img = torch.zeros(3, 4, 4)
    with pytest.raises(TypeError, match="batch must be a list of \\(image, target\\) pairs, got Tensor"):
        collate_fn(img)
    with pytest.raises(ValueError, match="at least one"):
        collate_fn([])
    with pytest.raises(TypeError, match=r"batch\[0\] must be an \(image, target\) pair, got Tensor"):
        collate_fn([img])
    with pytest.raises(ValueError, match=r"batch\[1\] must be an \(image, target\) pair, got 3 elements"):
        collate_fn([(img, None), (img, None, None)])
    with pytest.raises(TypeError, match=r"batch\[0\]\[0\] \(the image\) must be a torch.Tensor"):
        collate_fn([("image.png", None)])
    with pytest.raises(ValueError, match=r"tensors\[1\] has 1 channel \("):
        collate_fn([(img, None), (torch.zeros(1, 4, 4), None)])


@pytest.mark.slow
@pytest.mark.parametrize("collate", [collate_fn, PaddedCollate(size_divisibility=4, pad_value=-1.0)])
def test_dataloader_two_workers_equals_in_process_collation(collate):
    ds = _VariableSizeItems(10)
    loader = DataLoader(ds, batch_size=3, num_workers=2, collate_fn=collate, pin_memory=torch.cuda.is_available())
    batches = list(loader)
    expected = [collate([ds[i] for i in range(s, min(s + 3, len(ds)))]) for s in range(0, len(ds), 3)]
    assert len(batches) == len(expected) == 4
    for got, want in zip(batches, expected):
        assert isinstance(got[0], NestedTensor)
        _assert_same_batch((got[0].to("cpu"), got[1]), want)
        if torch.cuda.is_available():
            assert got[0].tensors.is_pinned() and got[0].mask.is_pinned()


def test_pin_memory_is_what_the_dataloader_calls(monkeypatch):
    """Without CUDA nothing can be pinned, so Tensor.pin_memory is replaced by a marking copy: the
    DataLoader's own pin routine must reach NestedTensor.pin_memory and pin tensors and mask."""
    pinned = []

    def fake_pin(self, *args, **kwargs):
        out = self.clone()
        pinned.append(out)
        return out

    monkeypatch.setattr(torch.Tensor, "pin_memory", fake_pin)
    nested, targets = collate_fn([_VariableSizeItems(3)[i] for i in range(3)])
    before = (nested.tensors.clone(), nested.mask.clone())
    out, out_targets = torch_pin_memory((nested, targets))
    assert isinstance(out, NestedTensor) and out is not nested
    assert any(out.tensors is p for p in pinned) and any(out.mask is p for p in pinned)
    _assert_same_batch((out, out_targets), (nested, targets))
    assert out.rectangular and out.padding == nested.padding
    assert torch.equal(nested.tensors, before[0]) and torch.equal(nested.mask, before[1])
    unmasked = NestedTensor(nested.tensors, None).pin_memory()
    assert unmasked.mask is None and any(unmasked.tensors is p for p in pinned)


@pytest.mark.cuda
@needs_cuda
def test_pin_memory_and_non_blocking_copy_on_cuda():
    nested, _ = collate_fn([_VariableSizeItems(3)[i] for i in range(3)])
    pinned = nested.pin_memory()
    assert pinned.tensors.is_pinned() and pinned.mask.is_pinned() and not nested.tensors.is_pinned()
    moved = pinned.to("cuda", non_blocking=True)
    assert moved.rectangular and moved.padding == nested.padding.to("cuda")
    torch.testing.assert_close(moved.tensors.cpu(), nested.tensors, rtol=0, atol=0)
    assert torch.equal(moved.mask.cpu(), nested.mask)


@pytest.mark.parametrize(
    "args, kwargs",
    [(("cpu",), {"non_blocking": True}), ((torch.float64,), {"non_blocking": True}), (("cpu", torch.float64, True), {})],
)
def test_to_keeps_sizes_and_rectangular_flag(args, kwargs, monkeypatch):
    from vispos import Padding

    nested, _ = collate_fn([_VariableSizeItems(3)[i] for i in range(3)])
    seen = []
    original = Padding.to

    def spy(self, *a, **k):
        seen.append(k.get("non_blocking"))
        return original(self, *a, **k)

    monkeypatch.setattr(Padding, "to", spy)
    moved = nested.to(*args, **kwargs)
    assert moved is not nested and moved.rectangular and moved.padding == nested.padding
    assert seen == [True]  # the padding (and its mask) follow with the caller's non_blocking
    torch.testing.assert_close(moved.tensors, nested.tensors.to(*args, **kwargs), rtol=0, atol=0)
    assert moved.mask.dtype == torch.bool and torch.equal(moved.mask, nested.mask)


# ------------------------------------------------------- one truth: claims are checked (issue 19)
from vispos import Padding  # noqa: E402


def test_inconsistent_mask_and_sizes_are_refused_at_construction():
    """The issue's repro: a mask with no padding and sizes that claim some. It used to build, and
    the embedding followed the sizes (off by up to 2.0 from the mask's)."""
    with pytest.raises(ValueError, match=r"image_sizes\[0\] = \(2, 3\) disagrees with the mask, whose item 0 has valid region \(4, 5\)"):
        NestedTensor(torch.zeros(1, 3, 4, 5), torch.zeros(1, 4, 5, dtype=torch.bool), [(2, 3)], rectangular=True)
    with pytest.raises(ValueError, match=r"image_sizes\[0\] = \(2, 3\) disagrees"):
        NestedTensor(torch.zeros(1, 3, 4, 5), torch.zeros(1, 4, 5, dtype=torch.bool), [(2, 3)])
    holed = torch.zeros(1, 4, 5, dtype=torch.bool)
    holed[0, 1, 1] = True
    with pytest.raises(ValueError, match="rectangular=True but the mask is not per-item boxes"):
        NestedTensor(torch.zeros(1, 3, 4, 5), holed, [(4, 5)], rectangular=True)
    padding = Padding.from_sizes([(2, 3)], (4, 5))
    with pytest.raises(ValueError, match=r"image_sizes\[0\] = \(4, 5\) disagrees"):
        NestedTensor(torch.zeros(1, 3, 4, 5), padding, [(4, 5)])
    with pytest.raises(ValueError, match=r"mask \(a Padding of shape \(1, 4, 5\) on cpu\) must have shape \(B, \*S\) = \(1, 4, 6\)"):
        NestedTensor(torch.zeros(1, 3, 4, 6), padding)


def test_consistent_claims_are_accepted_and_derived_not_stored():
    mask = Padding.from_sizes([(2, 3), (4, 5)], (4, 5)).mask
    nt = NestedTensor(torch.zeros(2, 3, 4, 5), mask, [(2, 3), (4, 5)], rectangular=True)
    assert nt.rectangular and nt.image_sizes == [(2, 3), (4, 5)] and nt.mask is mask
    holed = mask.clone()
    holed[1, 0, 0] = True  # holes, bounding box unchanged: image_sizes is the valid region's size
    arbitrary = NestedTensor(torch.zeros(2, 3, 4, 5), holed, [(2, 3), (4, 5)])
    assert not arbitrary.rectangular and arbitrary.padding.kind == "arbitrary"
    sizes_only = NestedTensor(torch.zeros(2, 3, 4, 5), None, [(2, 3), (4, 5)], rectangular=True)
    assert sizes_only.padding == nt.padding and torch.equal(sizes_only.mask, mask)
    assert NestedTensor(torch.zeros(2, 3, 4, 5), None).mask is None


def test_symmetric_padding_places_items_in_the_middle():
    items = [torch.arange(6.0).view(1, 2, 3), torch.ones(1, 5, 4)]
    nt = nested_tensor_from_tensor_list(items, pad_value=-1.0, method="symmetric")
    assert nt.padding.starts == ((1, 0), (0, 0)) and nt.image_sizes == [(2, 3), (5, 4)]
    assert torch.equal(nt[0], items[0]) and torch.equal(nt[1], items[1])
    assert torch.equal(nt.tensors[0, 0, 1:3, 0:3], items[0][0]) and (nt.tensors[0][:, nt.mask[0]] == -1).all()
    collated, _ = PaddedCollate(method="symmetric")([(t, None) for t in items])
    assert collated.padding == nt.padding
    assert repr(PaddedCollate(method="symmetric")) == "PaddedCollate(size_divisibility=0, pad_value=0.0, method='symmetric')"
    with pytest.raises(ValueError, match=r"method must be one of \('end', 'symmetric'\), got 'center'"):
        nested_tensor_from_tensor_list(items, method="center")


# ------------------------------------------------------------------------------- issue 26, 4 5 8
def test_int64_pad_value_is_exact_at_both_entry_points():
    """Item 4: PaddedCollate stored float(pad_value), so 2**53 + 1 became 2**53, and 2**63 - 1
    was refused with a message whose two numbers contradicted each other."""
    items = [torch.zeros(1, 2, dtype=torch.int64), torch.zeros(1, 3, dtype=torch.int64)]
    for value in (2**53 + 1, 2**63 - 1, -(2**63)):
        direct = nested_tensor_from_tensor_list(items, pad_value=value)
        collated, _ = PaddedCollate(pad_value=value)([(t, None) for t in items])
        assert int(direct.tensors[0, 0, 2]) == value and int(collated.tensors[0, 0, 2]) == value
    for call in (
        lambda: nested_tensor_from_tensor_list(items, pad_value=2**63),
        lambda: PaddedCollate(pad_value=2**63)([(t, None) for t in items]),
    ):
        with pytest.raises(ValueError, match=r"pad_value=9223372036854775808 cannot be stored in the items' dtype torch.int64: expected an integer in \[-9223372036854775808, 9223372036854775807\]"):
            call()


@pytest.mark.parametrize(
    "dtype, value",
    [(torch.float16, 1e6), (torch.float16, 65520.0), (torch.float32, 1e39), (torch.bfloat16, 1e39), (torch.float32, 10**400)],
)
def test_pad_value_overflow_is_a_value_error_at_both_entry_points(dtype, value):
    """Item 5: torch's "value cannot be converted to type c10::Half without overflow"."""
    items = [torch.zeros(1, 2, dtype=dtype), torch.zeros(1, 3, dtype=dtype)]
    for call in (
        lambda: nested_tensor_from_tensor_list(items, pad_value=value),
        lambda: PaddedCollate(pad_value=value)([(t, None) for t in items]),
    ):
        with pytest.raises(ValueError, match=rf"pad_value=.* cannot be stored in the items' dtype {dtype}: expected a value that does not overflow"):
            call()
    assert nested_tensor_from_tensor_list(items, pad_value=65504.0 if dtype == torch.float16 else 1e30).tensors.isfinite().all()
    assert nested_tensor_from_tensor_list(items, pad_value=float("-inf")).tensors[0, 0, 2] == float("-inf")


def test_size_divisibility_that_cannot_fit_is_refused_before_allocating(monkeypatch):
    """Item 5: size_divisibility=10**9 gave "Storage size calculation overflowed"; a batch
    larger than the machine's memory is refused too, naming the parameter, before allocating."""
    items = [torch.zeros(3, 4, 5), torch.zeros(3, 6, 2)]
    allocated = []
    original = torch.Tensor.new_full
    monkeypatch.setattr(torch.Tensor, "new_full", lambda self, *a, **k: allocated.append(a) or original(self, *a, **k))
    for call in (
        lambda: nested_tensor_from_tensor_list(items, size_divisibility=10**9),
        lambda: PaddedCollate(size_divisibility=10**9)([(t, None) for t in items]),
    ):
        with pytest.raises(ValueError, match=r"size_divisibility=1000000000 pads the batch to \(1000000000, 1000000000\) cells.*use a smaller size_divisibility"):
            call()
    import vispos._checks as checks

    monkeypatch.setattr(checks, "memory_bytes", lambda device: 2**20)  # a 1 MiB machine (the one guard)
    with pytest.raises(ValueError, match=r"size_divisibility=512 pads the batch to \(512, 512\) cells: 2 x 3 channels of torch.float32 need 6.5 MiB, more than the 1.0 MiB of cpu"):
        nested_tensor_from_tensor_list(items, size_divisibility=512)
    with pytest.raises(ValueError, match=r"tensors \(largest item \(600, 600\)\) pads the batch .* use smaller items"):
        nested_tensor_from_tensor_list([torch.zeros(1, 600, 600)])
    assert allocated == []
    assert nested_tensor_from_tensor_list(items, size_divisibility=32).tensors.shape == (2, 3, 32, 32)


@pytest.mark.parametrize(
    "args, kwargs",
    [
        ((), {"copy": True}),
        (("cpu",), {"copy": True}),
        ((torch.float32,), {"copy": True}),
        ((torch.float32, False, True), {}),
        (("cpu", torch.float32, False, True), {}),
        ((torch.zeros(1), False, True), {}),
        ((), {"device": "cpu", "dtype": torch.float32, "copy": True, "non_blocking": False}),
    ],
)
@pytest.mark.parametrize("kind", ["rectangular", "arbitrary", "built from sizes"])
def test_to_copy_returns_a_mask_of_its_own_in_every_call_form(args, kwargs, kind):
    """Item 8: ``to(..., copy=True)`` returned a mask sharing storage with the original."""
    nested = nested_tensor_from_tensor_list([torch.zeros(1, 3, 4), torch.zeros(1, 2, 5)])
    if kind == "arbitrary":
        holed = nested.mask.clone()
        holed[0, 0, 0] = True
        nested = NestedTensor(nested.tensors, holed)
    elif kind == "built from sizes":
        nested = NestedTensor(nested.tensors, None, nested.image_sizes)
        nested.mask  # noqa: B018 - built
    moved = nested.to(*args, **kwargs)
    assert moved.padding == nested.padding and moved.padding.kind == nested.padding.kind
    assert moved.tensors.untyped_storage().data_ptr() != nested.tensors.untyped_storage().data_ptr()
    assert moved.mask.untyped_storage().data_ptr() != nested.mask.untyped_storage().data_ptr()
    before = nested.mask.clone()
    moved.mask.fill_(True)  # writing into the copy leaves the original alone
    assert torch.equal(nested.mask, before)
    same = nested.to("cpu")  # no copy asked: torch shares storage, and so does the mask
    assert same.mask is nested.mask
