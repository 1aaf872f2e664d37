"""vispos.monai.spacing: per-item spacing (mm) from MetaTensor affines."""

import pytest
import torch
from torch.testing import assert_close

monai = pytest.importorskip("monai")

from monai.data import MetaTensor  # noqa: E402
from monai.transforms import Orientationd, Spacingd  # noqa: E402

from vispos.monai import NestedPadCollate, meta_spacing  # noqa: E402


def _item(spacing, size=(6, 5, 4)):
    affine = torch.diag(torch.tensor([*spacing, 1.0], dtype=torch.float64))
    return {"image": MetaTensor(torch.rand(1, *size), affine=affine)}


def test_batch_spacing_in_tensor_axis_order():
    items = [_item((0.7, 0.7, 5.0)), _item((2.0, 1.0, 3.0), (4, 4, 4))]
    batch = NestedPadCollate()(items)
    got = meta_spacing(batch["image"])
    assert got.dtype == torch.float32 and got.shape == (2, 3)
    assert_close(got, torch.tensor([[0.7, 0.7, 5.0], [2.0, 1.0, 3.0]]))
    # the same numbers as MONAI's own MetaTensor.pixdim, per item
    for b, item in enumerate(items):
        assert_close(got[b].double(), torch.as_tensor(item["image"].pixdim, dtype=torch.float64))
    assert_close(meta_spacing(batch["image"].tensors, dtype=torch.float64)[0], torch.tensor([0.7, 0.7, 5.0], dtype=torch.float64))


def test_spacing_follows_monai_resampling_and_reorientation():
    item = Spacingd("image", (1.5, 2.0, 4.0))(_item((1.0, 1.0, 1.0), (12, 12, 12)))
    assert_close(meta_spacing(item["image"]), torch.tensor([[1.5, 2.0, 4.0]]))
    # a rotated affine: the column lengths are the spacings, whatever the orientation
    swapped = Orientationd("image", "SAR")(item)
    assert_close(meta_spacing(swapped["image"]), torch.tensor([[4.0, 2.0, 1.5]]))


def test_single_item_and_errors():
    assert meta_spacing(_item((0.5, 0.5, 2.0))["image"]).shape == (1, 3)
    with pytest.raises(TypeError, match="x must be a MetaTensor batch or a NestedTensor holding one"):
        meta_spacing(torch.ones(1, 1, 2, 2, 2))
