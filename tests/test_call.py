"""The field's call habits (``vispos/encodings/_call.py``): ``pos(x, mask)`` with DETR's mask,
transformers' ``pixel_mask`` by keyword and never confused with it, the deprecated positional
``dtype``, and the warnings for inputs that are probably mistakes (a channels-last image, an
item with no valid cell).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.testing import assert_close

import vispos
from vispos import NestedTensor, PositionEmbeddingLearned, PositionEmbeddingSine


def _batch():
    return vispos.nested_tensor_from_tensor_list([torch.rand(3, 20, 30), torch.rand(3, 25, 22)])


@pytest.mark.parametrize("cls", [PositionEmbeddingSine, PositionEmbeddingLearned])
def test_detr_mask_as_second_argument(cls):
    """DETR-family code writes ``pos(features, mask)``; it equals ``pos(NestedTensor(...))``."""
    batch, pos = _batch(), cls(16)
    assert_close(pos(batch.tensors, batch.mask), pos(batch), rtol=0, atol=0)
    assert_close(pos(batch.tensors, mask=batch.mask), pos(batch), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.int64, torch.float32, torch.bool])
def test_transformers_pixel_mask_by_keyword(dtype):
    """transformers' ``pixel_mask`` (1 = valid, of any dtype) by keyword is the inverse mask."""
    batch, pos = _batch(), PositionEmbeddingSine(16, normalize=True)
    pixel_mask = (~batch.mask).to(dtype)
    assert_close(pos(batch.tensors, pixel_mask=pixel_mask), pos(batch), rtol=0, atol=0)


def test_the_two_conventions_cannot_be_confused():
    batch, pos = _batch(), PositionEmbeddingSine(16)
    pixel_mask = (~batch.mask).long()
    with pytest.raises(TypeError, match=r"mask must be a bool tensor .*True marking padding.*pixel_mask=") as info:
        pos(batch.tensors, pixel_mask)  # an integer mask as the second argument: refused
    assert len(str(info.value)) < 400 and "tensor(" not in str(info.value)
    with pytest.raises(TypeError, match="both mask .* and pixel_mask"):
        pos(batch.tensors, batch.mask, pixel_mask=pixel_mask)
    with pytest.raises(TypeError, match="x is a batch with its own mask already"):
        pos(batch, batch.mask)
    with pytest.raises(TypeError, match="x is a mask already"):
        pos(batch.mask, pixel_mask=pixel_mask)
    with pytest.raises(ValueError, match=r"mask must have shape \(B, \*S\) = \(2, 25, 30\)"):
        pos(batch.tensors, batch.mask[:, :5])


def test_positional_dtype_still_works_and_warns():
    batch, pos = _batch(), PositionEmbeddingSine(16)
    with pytest.warns(DeprecationWarning, match="pass dtype= by keyword"):
        half = pos(batch, torch.float16)
    assert half.dtype == torch.float16
    assert_close(half, pos(batch, dtype=torch.float16), rtol=0, atol=0)
    with pytest.raises(TypeError, match="dtype twice"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            pos(batch, torch.float16, dtype=torch.float16)


@pytest.mark.parametrize("shape", [(2, 32, 32, 3), (2, 32, 32, 1), (1, 16, 16, 16, 1)])
def test_channels_last_image_warns(shape):
    """``(2, 32, 32, 3)`` is read as 32 channels over a (32, 3) grid: warned, with the fix."""
    pos = PositionEmbeddingSine(8)
    x = torch.rand(shape)
    with pytest.warns(UserWarning, match=r"read channels-first.*movedim\(-1, 1\)"):
        pos(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pos(NestedTensor(x, None))  # meant: silent
        pos(torch.rand(2, 256, 20, 30))  # a feature map: silent
        pos(torch.rand(2, 3, 32, 32))  # a channels-first image: silent


@pytest.mark.parametrize("how", ["boxes", "holes", "nested"])
def test_an_item_with_no_valid_cell_warns(how):
    """A fully padded item gets DETR's finite values (documented); it is also warned about."""
    mask = torch.zeros(2, 6, 7, dtype=torch.bool)
    if how == "holes":
        mask[0, 2, 3] = True  # not a box: the cumulative-count path
    mask[1] = True
    x = NestedTensor(torch.rand(2, 3, 6, 7), mask) if how == "nested" else mask
    with pytest.warns(UserWarning, match="no valid cell"):
        out = PositionEmbeddingSine(8, normalize=True)(x)
    assert out.isfinite().all()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        PositionEmbeddingSine(8, normalize=True)(mask[:1])
