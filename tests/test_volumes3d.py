"""demos/volumes3d.py: the shipped volumes through MONAI's resampling, lesions with exact 3D boxes,
and the padded-batch dataset of the 3D DETR demo."""

import os
import sys

import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

pytest.importorskip("monai")
nib = pytest.importorskip("nibabel")
pytest.importorskip("nilearn")

from vispos.app.train import volumes3d as V  # noqa: E402

import vispos  # noqa: E402


def _nifti(tmp_path, data, zooms, name="vol.nii.gz"):
    affine = np.diag([*zooms, 1.0])
    path = tmp_path / name
    nib.save(nib.Nifti1Image(data.astype(np.float32), affine), str(path))
    return f"nifti:{path}"


def test_spacing_resamples_to_millimetres(tmp_path):
    # a uniform block (every voxel foreground) 20 x 16 x 8 voxels of 1 x 1 x 3 mm: 20 x 16 x 24 mm
    name = _nifti(tmp_path, np.ones((20, 16, 8)), (1.0, 1.0, 3.0))
    one = V.load_volume_resampled(name, 1.0)
    two = V.load_volume_resampled(name, 2.0)
    assert one.dtype == torch.float32 and one.dim() == 4 and one.shape[0] == 1
    # MONAI's Spacingd keeps the field of view: (n - 1) * zoom / spacing + 1 voxels per axis, rounded
    for vol, spacing in ((one, 1.0), (two, 2.0)):
        expected = (np.asarray([20, 16, 8]) - 1) * np.asarray([1.0, 1.0, 3.0]) / spacing + 1
        assert np.abs(np.asarray(vol.shape[1:]) - expected).max() <= 0.5, (vol.shape, expected)
    assert tuple(one.shape[1:]) == (20, 16, 22)


def test_intensities_are_z_scored_over_tissue(tmp_path):
    rng = np.random.default_rng(0)
    data = np.zeros((24, 24, 24))
    data[4:20, 4:20, 4:20] = rng.normal(300.0, 40.0, (16, 16, 16))
    vol = V.load_volume_resampled(_nifti(tmp_path, data, (2.0, 2.0, 2.0)), 2.0)
    tissue = vol[0, 2:-2, 2:-2, 2:-2]  # the foreground crop keeps a 2-voxel margin of air
    assert tuple(vol.shape[1:]) == (20, 20, 20)
    torch.testing.assert_close(tissue.mean(), torch.tensor(0.0), atol=1e-4, rtol=0)
    torch.testing.assert_close(tissue.std(unbiased=False), torch.tensor(1.0), atol=1e-4, rtol=0)


def test_shipped_volumes_load_and_are_copies():
    names = V.available_volumes(V.TRAIN_VOLUMES + ("anatomical",))
    assert set(V.TRAIN_VOLUMES) <= set(names)
    for name in names:
        a = V.load_volume_resampled(name, 4.0)
        assert a.dim() == 4 and a.shape[0] == 1 and min(a.shape[1:]) >= 8 and torch.isfinite(a).all()
        a.fill_(7.0)  # the caller's tensor: the cache is untouched
        assert not (V.load_volume_resampled(name, 4.0) == 7.0).all()
    # the MNI152 template is 197 x 233 x 189 mm: about 49 x 58 x 47 voxels at 4 mm, minus air
    t1 = V.load_volume_resampled("mni152_t1", 4.0)
    assert all(30 <= n <= 60 for n in t1.shape[1:])


def test_bad_volume_arguments(tmp_path):
    with pytest.raises(ValueError, match="spacing must be > 0"):
        V.load_volume_resampled("mni152_t1", 0.0)
    with pytest.raises(ValueError, match="unknown volume 'brain'"):
        V.available_volumes(["brain"])
    with pytest.warns(UserWarning, match="not available"):
        assert V.available_volumes([f"nifti:{tmp_path / 'missing.nii'}"]) == ()
    with pytest.raises(ValueError, match="at least one volume"):
        V.LesionsInVolumes([], 4, 0, 2.0, (16, 24))
    with pytest.raises(ValueError, match="crop must be"):
        V.LesionsInVolumes(["mni152_t1"], 4, 0, 4.0, (24, 16))
    with pytest.raises(ValueError, match="lesion sizes"):
        V.LesionsInVolumes(["mni152_t1"], 4, 0, 4.0, (12, 16), min_size=4, max_size=14)


@pytest.mark.parametrize("seed", range(6))
def test_lesion_boxes_are_exact_and_contrast_is_local(seed):
    rng = np.random.default_rng(seed)
    base = torch.from_numpy(rng.normal(0.0, 0.1, (1, 30, 26, 22)).astype(np.float32))
    base[:, :, :13] += 2.0  # two "tissues": contrast is relative to the one around the lesion
    out, boxes, labels = V.draw_lesions(base, rng, 3, 3, 10, contrast=(1.5, 3.0))
    assert out.shape == base.shape and boxes.shape == (len(labels), 6) and len(labels) >= 1
    assert labels.dtype == torch.int64 and set(labels.tolist()) <= {0, 1}
    assert not torch.equal(out, base) and base[:, :, :13].mean() > 1.5  # the input was not modified
    changed = (out != base)[0]
    covered = torch.zeros_like(changed)
    for (d0, h0, w0, d1, h1, w1), cls in zip(boxes.long().tolist(), labels.tolist()):
        assert 3 <= d1 - d0 <= 10 and 3 <= h1 - h0 <= 10 and 3 <= w1 - w0 <= 10
        region = changed[d0:d1, h0:h1, w0:w1]
        # tight: every face of the box holds changed voxels
        for axis in range(3):
            assert region.narrow(axis, 0, 1).any() and region.narrow(axis, region.shape[axis] - 1, 1).any()
        if cls == 1:
            assert region.all()  # a cuboid fills its box
        else:
            assert not region.all() and region.float().mean() > 0.3  # an ellipsoid does not
        value = out[0, d0:d1, h0:h1, w0:w1][region]
        assert torch.all(value == value[0])  # one intensity per lesion
        shell = base[0, max(0, d0 - 2):d1 + 2, max(0, h0 - 2):h1 + 2, max(0, w0 - 2):w1 + 2]
        assert 1.4 <= abs(float(value[0]) - float(shell.mean())) <= 3.1 + 0.2
        covered[d0:d1, h0:h1, w0:w1] = True
    assert not (changed & ~covered).any()  # nothing drawn outside the boxes
    from monai.data.box_utils import box_iou

    iou = box_iou(boxes, boxes) - torch.eye(len(boxes))
    assert (iou < 1e-6).all()  # lesions do not overlap


def test_dataset_is_deterministic_padded_and_normalised():
    ds = V.LesionsInVolumes(["mni152_t1", "epi"], 12, 3, 4.0, (10, 20), max_objects=2, min_size=3, max_size=8)
    sizes = set()
    for i in range(len(ds)):
        (a, ta), (b, tb) = ds[i], ds[i]
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        torch.testing.assert_close(ta["boxes"], tb["boxes"], rtol=0, atol=0)
        assert a.dtype == torch.float32 and a.shape[0] == 1
        assert all(s <= 20 for s in a.shape[1:])
        sizes.add(tuple(a.shape[1:]))
        boxes = ta["boxes"]
        assert boxes.dtype == torch.float32 and boxes.shape[1] == 6
        assert (boxes >= 0).all() and (boxes <= 1).all()
        # center-size in tensor axis order, normalised by the item's own (D, H, W)
        lo = (boxes[:, :3] - boxes[:, 3:] / 2) * torch.tensor(a.shape[1:])
        hi = (boxes[:, :3] + boxes[:, 3:] / 2) * torch.tensor(a.shape[1:])
        torch.testing.assert_close(lo, lo.round(), atol=1e-4, rtol=0)  # whole voxels
        assert (lo >= -1e-4).all() and (hi <= torch.tensor(a.shape[1:]) + 1e-4).all()
    assert len(sizes) > 6  # crops of many sizes: batches are padded
    other = V.LesionsInVolumes(["mni152_t1", "epi"], 12, 4, 4.0, (10, 20), max_objects=2, min_size=3, max_size=8)
    assert any(other[i][0].shape != ds[i][0].shape or not torch.equal(other[i][0], ds[i][0]) for i in range(4))
    nested, targets = vispos.PaddedCollate()([ds[i] for i in range(4)])
    assert nested.tensors.shape[:2] == (4, 1) and nested.mask.shape == (4, *nested.tensors.shape[2:])
    assert nested.mask.any() and len(targets) == 4
    assert "LesionsInVolumes(volumes=['mni152_t1', 'epi']" in repr(ds)
