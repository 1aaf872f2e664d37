"""Guards a new user meets in the first hour: transformers' ``pixel_mask`` values, DETR's
``(x, mask)`` call of SAM's encoder, channels-last images, NestedPadCollate's first argument,
counts in messages, a grid no machine holds, NaN images."""

from __future__ import annotations

import warnings

import pytest
import torch

import vispos
from vispos._checks import check_index, count


@pytest.mark.parametrize("bad", [float("nan"), 2.0, 0.5])
def test_pixel_mask_other_than_0_and_1_is_refused(bad):
    """Before: NaN or 2 in a pixel_mask was read as valid, silently."""
    pe = vispos.PositionEmbeddingSine(8)
    x = torch.zeros(2, 4, 5, 6)
    pixel_mask = torch.ones(2, 5, 6)
    pixel_mask[1, 3:] = 0
    want = pe(x, mask=pixel_mask == 0)
    torch.testing.assert_close(pe(x, pixel_mask=pixel_mask), want)
    torch.testing.assert_close(pe(x, pixel_mask=pixel_mask.long()), want)
    pixel_mask[0, 0, 0] = bad
    with pytest.raises(ValueError, match=r"^pixel_mask must hold only 0 and 1 .*got a Tensor of shape \(2, 5, 6\) "
                                         r"and dtype torch.float32 with other values") as info:
        pe(x, pixel_mask=pixel_mask)
    assert "nan" not in str(info.value).lower().replace("(nan or", "")
    with pytest.raises(ValueError, match=r"pixel_mask must hold only 0 and 1 .* dtype torch.int64"):
        pe(x, pixel_mask=torch.full((2, 5, 6), 2))


def test_random_fourier_says_what_it_takes_for_x_and_mask():
    """Before: ``forward() takes 2 positional arguments but 3 were given``."""
    pe = vispos.PositionEmbeddingRandom(16)
    x, mask = torch.zeros(2, 4, 5, 5), torch.zeros(2, 5, 5, dtype=torch.bool)
    with pytest.raises(TypeError, match=r"PositionEmbeddingRandom.forward takes one input \(SAM's signature\): a "
                                        r"size \(H, W\) .* got 2 positional arguments .*NestedTensor\(x, mask\).*"
                                        r"forward_with_coords\(coords, image_size\)"):
        pe(x, mask)
    assert pe(vispos.NestedTensor(x, mask)).shape == (2, 32, 5, 5) and pe((5, 5)).shape == (32, 5, 5)


def test_channels_last_images_get_a_hint():
    """Before: ``tensors[1] has 32 channels (...)`` and no word on the layout."""
    images = [torch.zeros(64, 48, 3), torch.zeros(32, 48, 3)]  # (H, W, C)
    with pytest.raises(ValueError, match=r"tensors\[1\] has 32 channels .* looks channels-last: pass "
                                         r"t.movedim\(-1, 0\)"):
        vispos.nested_tensor_from_tensor_list(images)
    with pytest.raises(ValueError, match=r"has 1 channel \(shape \(1, 4, 4\)\) but tensors\[0\] has 3 \(shape \(3, 4, 4\)\)$"):
        vispos.nested_tensor_from_tensor_list([torch.zeros(3, 4, 4), torch.zeros(1, 4, 4)])  # no hint


def test_nested_pad_collate_named_a_size_says_so():
    """Before: ``NestedPadCollate(32)`` (as ``PaddedCollate(32)``) said only ``keys must be a key
    or a non-empty sequence of keys, got 32``."""
    pytest.importorskip("monai")
    from vispos.monai import NestedPadCollate

    assert vispos.PaddedCollate(32).size_divisibility == 32
    with pytest.raises(TypeError, match=r"NestedPadCollate's first argument is keys.* pass size_divisibility=32 by "
                                        r"keyword \(PaddedCollate\(32\)"):
        NestedPadCollate(32)
    assert NestedPadCollate(size_divisibility=32).size_divisibility == 32


def test_counts_are_singular_or_plural():
    """Before: ``a batch of 1 items``, ``vispos run: 1 images``."""
    assert (count(1, "image"), count(2, "image"), count(0, "item")) == ("1 image", "2 images", "0 items")
    with pytest.raises(IndexError, match=r"out of range for a batch of 1 item$"):
        check_index(3, 1)


def test_a_grid_no_machine_holds_is_refused_before_computing(monkeypatch):
    """Before: torch's allocator error (``DefaultCPUAllocator: can't allocate memory: you tried to
    allocate 5120000000000 bytes``), after the positions were computed."""
    huge = vispos.Padding.none(1, (100000, 100000))
    with pytest.raises(ValueError, match=r"PositionEmbeddingSine: an output of shape \(1, 128, 100000, 100000\) and "
                                         r"dtype torch.float32 would need 4768 GiB, more than the .* of cpu; embed a "
                                         r"smaller grid"):
        vispos.PositionEmbeddingSine(64)(huge)
    with pytest.raises(ValueError, match=r"PositionEmbeddingRandom: an output of shape \(1, 64, 100000, 100000\)"):
        vispos.PositionEmbeddingRandom(32)(huge)
    with pytest.raises(ValueError, match=r"PositionEmbeddingRandom: an output of shape \(64, 100000, 100000\)"):
        vispos.PositionEmbeddingRandom(32)((100000, 100000))
    import vispos._checks as checks

    monkeypatch.setattr(checks, "memory_bytes", lambda device: 2**20)  # one guard for batches and encoders
    with pytest.raises(ValueError, match=r"need 1.8 MiB, more than the 1.0 MiB of cpu"):
        vispos.PositionEmbeddingSine(64)(vispos.Padding.none(1, (60, 60)))
    with pytest.raises(ValueError, match=r"need 5.0 MiB, more than the 1.0 MiB of cpu; use smaller items"):
        vispos.nested_tensor_from_tensor_list([torch.zeros(1, 1024, 1024)])


def test_nan_image_warns_once_per_call_site():
    """Before: a NaN image was padded into the batch silently."""
    image = torch.zeros(3, 4, 4)
    image[0, 1, 1] = float("nan")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for _ in range(3):
            vispos.nested_tensor_from_tensor_list([torch.zeros(3, 4, 5), image])  # one call site
    assert [str(w.message)[:53] for w in caught] == ["tensors[1] (shape (3, 4, 4), torch.float32) holds NaN"]
    assert caught[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        vispos.nested_tensor_from_tensor_list([torch.zeros(3, 4, 5), torch.ones(3, 4, 4)], pad_value=float("nan"))
        vispos.nested_tensor_from_tensor_list([torch.zeros(1, 4, 4, dtype=torch.int64)])
