"""vispos.monai.collate: MONAI dict batches as NestedTensor, masks from MONAI's pad records."""

import pickle

import numpy as np
import pytest
import torch
from torch.testing import assert_close

monai = pytest.importorskip("monai")

from monai.data import DataLoader, Dataset, MetaTensor, pad_list_data_collate  # noqa: E402
from monai.transforms import (  # noqa: E402
    BorderPadd,
    Compose,
    DivisiblePadd,
    RandFlipd,
    RandRotate90d,
    RandSpatialCropd,
    ResizeWithPadOrCropd,
    Spacingd,
    SpatialPadd,
)

from vispos import NestedTensor  # noqa: E402
from vispos.monai import NestedPadCollate, decollate_nested_batch, recorded_padding_mask  # noqa: E402

SIZES = [(5, 7, 9), (8, 6, 12), (3, 4, 5)]


def _sample(size, i=0, spacing=(0.7, 0.7, 5.0)):
    """A volume whose every voxel is >= 1, so padding (zeros) is known from the values alone."""
    g = torch.Generator().manual_seed(i)
    affine = torch.diag(torch.tensor([*spacing, 1.0], dtype=torch.float64))
    affine[:3, 3] = torch.tensor([float(i), 2.0, -3.0], dtype=torch.float64)
    image = MetaTensor(torch.rand((1, *size), generator=g) + 1, affine=affine)
    label = MetaTensor((torch.rand((1, *size), generator=g) > 0.5).float() + 1, affine=affine.clone())
    return {"image": image, "label": label, "id": i}


def _samples(transform=None, sizes=SIZES):
    out = [_sample(s, i) for i, s in enumerate(sizes)]
    return [transform(d) for d in out] if transform is not None else out


def _padding_from_values(tensors):
    """The oracle: every real voxel is >= 1, every padded one 0 (constant padding)."""
    return tensors[:, 0] == 0


def test_end_padding_mask_sizes_and_meta():
    items = _samples()
    batch = NestedPadCollate()(items)
    nested = batch["image"]
    assert isinstance(nested, NestedTensor)
    assert isinstance(nested.tensors, MetaTensor)
    assert tuple(nested.tensors.shape) == (3, 1, 8, 7, 12)
    expected = torch.ones(3, 8, 7, 12, dtype=torch.bool)
    for b, size in enumerate(SIZES):
        expected[(b, *(slice(0, s) for s in size))] = False
        assert_close(nested.tensors[(b, slice(None), *(slice(0, s) for s in size))].as_tensor(), items[b]["image"].as_tensor())
    assert torch.equal(nested.mask, expected)
    assert torch.equal(nested.mask, _padding_from_values(nested.tensors))
    assert nested.rectangular and nested.padding.at_origin and nested.image_sizes == SIZES
    for b in range(3):  # indexing gives each item's own volume back
        assert torch.equal(nested[b].as_tensor(), items[b]["image"].as_tensor())
    # metadata stays per item, as MONAI's list_data_collate keeps it
    for b in range(3):
        assert_close(nested.tensors.affine[b], items[b]["image"].affine)
    assert torch.equal(batch["id"], torch.tensor([0, 1, 2]))
    # the label is padded the same way (not a NestedTensor: only `keys` are)
    assert isinstance(batch["label"], MetaTensor)
    assert torch.equal(batch["label"][:, 0] == 0, expected)


def test_symmetric_collate_matches_monai_and_masks_its_padding():
    items = _samples()
    ours = NestedPadCollate(method="symmetric")(_samples())
    theirs = pad_list_data_collate(items)  # MONAI's own symmetric collate
    assert torch.equal(ours["image"].tensors.as_tensor(), theirs["image"].as_tensor())
    assert torch.equal(ours["image"].mask, _padding_from_values(theirs["image"]))
    padding = ours["image"].padding  # per-item boxes, away from the origin
    assert padding.kind == "rectangular" and not padding.at_origin
    assert padding.sizes == tuple(SIZES) and padding.starts[2] == (2, 1, 3)
    for b, item in enumerate(_samples()):  # (MONAI's collate padded `items` in place)
        assert torch.equal(ours["image"][b].as_tensor(), item["image"].as_tensor())
    mask = ours["image"].mask
    assert mask[0, 0].all() and mask[0, -1].all() and mask[2, 0].all()  # padded before and after


@pytest.mark.parametrize("method", ["end", "symmetric"])
def test_mask_equals_padding_of_earlier_monai_transforms(method):
    # SpatialPad (symmetric by default) and DivisiblePad put padding before the volume: it is masked
    transform = Compose([SpatialPadd(["image", "label"], (6, 6, 6)), DivisiblePadd(["image", "label"], k=4), BorderPadd("image", 1)])
    batch = NestedPadCollate(method=method)(_samples(transform))
    nested = batch["image"]
    assert torch.equal(nested.mask, _padding_from_values(nested.tensors))
    assert nested.mask.any(dim=(1, 2))[:, 0].all()  # padding at the start of the first axis too
    assert nested.rectangular and not nested.padding.at_origin  # boxes, found in the mask


def test_mask_follows_crops_flips_and_rotations():
    transform = Compose(
        [
            SpatialPadd("image", (10, 10, 10)),
            RandFlipd("image", prob=1.0, spatial_axis=[0, 2]),
            RandRotate90d("image", prob=1.0, max_k=3, spatial_axes=(0, 1)),
            RandSpatialCropd("image", (8, 9, 7), random_size=False),
            ResizeWithPadOrCropd("image", (9, 8, 8)),
        ]
    )
    transform.set_random_state(3)
    items = _samples(transform)
    for item in items:
        assert torch.equal(recorded_padding_mask(item["image"]), item["image"][0] == 0)
    batch = NestedPadCollate(keys=("image",))(items)
    assert torch.equal(batch["image"].mask, _padding_from_values(batch["image"].tensors))


def test_recorded_padding_mask_plain_and_unpadded():
    assert not recorded_padding_mask(torch.ones(1, 3, 4)).any()
    assert recorded_padding_mask(torch.ones(1, 3, 4)).shape == (3, 4)
    img = SpatialPadd("image", (4, 6))({"image": MetaTensor(torch.ones(1, 3, 4))})["image"]
    expected = torch.ones(4, 6, dtype=torch.bool)
    expected[0:3, 1:5] = False
    assert torch.equal(recorded_padding_mask(img), expected)


def test_resampling_after_padding_is_refused_before_is_fine():
    fine = Compose([Spacingd("image", (1.4, 1.4, 5.0)), SpatialPadd("image", (8, 8, 8))])(_sample((5, 7, 9)))
    assert torch.equal(recorded_padding_mask(fine["image"]), fine["image"][0] == 0)
    bad = Compose([SpatialPadd("image", (8, 8, 8)), Spacingd("image", (1.4, 1.4, 5.0))])(_sample((5, 7, 9)))
    with pytest.raises(ValueError, match=r"batch\[0\]\['image'\]: the padding recorded earlier cannot be followed through 'SpatialResample'"):
        NestedPadCollate()([bad])


def test_same_sizes_still_get_a_mask():
    items = _samples(sizes=[(4, 4, 4)] * 2)
    batch = NestedPadCollate()(items)
    assert not batch["image"].mask.any() and batch["image"].rectangular
    padded = _samples(SpatialPadd("image", (6, 6, 6)), sizes=[(4, 4, 4)] * 2)
    batch = NestedPadCollate()(padded)  # MONAI's collate would record nothing here
    assert torch.equal(batch["image"].mask, _padding_from_values(batch["image"].tensors))
    assert batch["image"].mask.sum() == 2 * (6**3 - 4**3)


def test_size_divisibility_and_pad_value():
    batch = NestedPadCollate(size_divisibility=4, value=-1.0)(_samples())
    nested = batch["image"]
    assert tuple(nested.tensors.shape[2:]) == (8, 8, 12)
    assert torch.equal(nested.mask, nested.tensors[:, 0] == -1)


@pytest.mark.parametrize("method", ["end", "symmetric"])
def test_decollate_round_trip_and_invert(method):
    transform = Compose([SpatialPadd(["image", "label"], (6, 6, 6)), DivisiblePadd(["image", "label"], k=4)])
    originals = _samples()
    items = [transform(dict(d)) for d in originals]
    before = [len(d["image"].applied_operations) for d in items]
    batch = NestedPadCollate(method=method)(items)
    assert [len(d["image"].applied_operations) for d in items] == before  # the caller's samples untouched
    back = decollate_nested_batch(batch)
    assert len(back) == 3
    for got, want, orig in zip(back, items, originals):
        for key in ("image", "label"):
            assert got[key].shape == want[key].shape
            assert torch.equal(got[key].as_tensor(), want[key].as_tensor())
            assert_close(got[key].affine, want[key].affine)
            assert [op["class"] for op in got[key].applied_operations] == [op["class"] for op in want[key].applied_operations]
        # MONAI's inverse then undoes the transforms before the collate
        inverted = transform.inverse(got)
        assert torch.equal(inverted["image"].as_tensor(), orig["image"].as_tensor())


def test_plain_tensors_round_trip():
    items = [{"image": torch.rand(2, *s) + 1} for s in SIZES]
    batch = NestedPadCollate(method="symmetric")(items)
    assert torch.equal(batch["image"].mask, _padding_from_values(batch["image"].tensors))
    back = decollate_nested_batch(batch)
    for got, want in zip(back, items):
        assert torch.equal(got["image"], want["image"])


def test_dataloader_workers_pin_memory():
    data = [{"image": torch.rand(1, *s) + 1, "id": i} for i, s in enumerate(SIZES * 2)]
    transform = SpatialPadd("image", (6, 6, 6))
    loader = DataLoader(
        Dataset(data, transform=transform), batch_size=3, num_workers=2, collate_fn=NestedPadCollate(),
        pin_memory=torch.cuda.is_available(),
    )
    batches = list(loader)
    assert len(batches) == 2
    for batch in batches:
        nested = batch["image"]
        assert isinstance(nested, NestedTensor) and isinstance(nested.tensors, MetaTensor)
        assert torch.equal(nested.mask, _padding_from_values(nested.tensors))
        if torch.cuda.is_available():
            assert nested.tensors.is_pinned() and nested.mask.is_pinned()
        for i, item in zip(batch["id"].tolist(), decollate_nested_batch(batch)):
            assert torch.equal(item["image"].as_tensor(), transform(data[i])["image"].as_tensor())


def test_pinned_batch_keeps_meta_and_inverts(monkeypatch):
    """DataLoader(pin_memory=True) runs torch's pin routine on every batch. Without CUDA nothing
    can be pinned, so Tensor.pin_memory is replaced by a marking copy: the routine must reach the
    NestedTensor, keep the batched MetaTensor's per-item metadata and still decollate and invert."""
    pinned = []

    def fake_pin(self, *args, **kwargs):
        out = self.clone()
        pinned.append(out)
        return out

    from torch.utils.data._utils.pin_memory import pin_memory as torch_pin_memory

    transform = Compose([SpatialPadd(["image", "label"], (6, 6, 6)), DivisiblePadd(["image", "label"], k=4)])
    originals = _samples()
    items = [transform(dict(d)) for d in originals]
    batch = NestedPadCollate(method="symmetric")(items)
    monkeypatch.setattr(torch.Tensor, "pin_memory", fake_pin)
    out = torch_pin_memory(batch)
    nested = out["image"]
    assert isinstance(nested, NestedTensor) and nested is not batch["image"]
    assert any(nested.tensors is p for p in pinned) and any(nested.mask is p for p in pinned)
    assert isinstance(nested.tensors, MetaTensor) and nested.tensors.is_batch
    assert torch.equal(nested.mask, batch["image"].mask) and nested.padding == batch["image"].padding
    assert_close(nested.tensors.affine, batch["image"].tensors.affine, rtol=0, atol=0)
    monkeypatch.undo()
    for got, want, orig in zip(decollate_nested_batch(out), items, originals):
        assert torch.equal(got["image"].as_tensor(), want["image"].as_tensor())
        assert torch.equal(transform.inverse(got)["image"].as_tensor(), orig["image"].as_tensor())


def test_pickles_and_repr():
    collate = NestedPadCollate(("image", "label"), method="symmetric", size_divisibility=2, value=0.5)
    again = pickle.loads(pickle.dumps(collate))
    assert repr(again) == repr(collate) == (
        "NestedPadCollate(keys=('image', 'label'), method='symmetric', mode='constant', "
        "size_divisibility=2, value=0.5)"
    )
    batch = again(_samples())
    assert isinstance(batch["label"], NestedTensor)


@pytest.mark.parametrize(
    "build, error, match",
    [
        (lambda: NestedPadCollate(method="center"), ValueError, r"method must be one of \('end', 'symmetric'\), got 'center'"),
        (lambda: NestedPadCollate(size_divisibility=-1), ValueError, "size_divisibility"),
        (lambda: NestedPadCollate(keys=[]), TypeError, r"keys must be a key or a non-empty sequence of keys, got \[\]"),
        (lambda: NestedPadCollate(mode=3), TypeError, "mode must be a MONAI pad mode name"),
        (lambda: NestedPadCollate()([]), ValueError, "batch must hold at least one sample"),
        (lambda: NestedPadCollate()({"image": torch.ones(1, 2, 2)}), TypeError, "batch must be a list of dict samples, got dict"),
        (lambda: NestedPadCollate()([torch.ones(1, 2, 2)]), TypeError, r"batch\[0\] must be a dict sample"),
        (lambda: NestedPadCollate()([{"img": torch.ones(1, 2, 2)}]), ValueError, r"batch\[0\] has no key 'image'"),
        (lambda: NestedPadCollate()([{"image": [1, 2]}]), TypeError, r"batch\[0\]\['image'\] must be a tensor"),
        (lambda: NestedPadCollate()([{"image": torch.ones(4)}]), ValueError, r"with 1 to 3 spatial axes, got \(4,\)"),
        (
            lambda: NestedPadCollate()([{"image": torch.ones(1, 2, 2)}, {"image": torch.ones(2, 2, 2)}]),
            ValueError,
            r"batch\[1\]\['image'\] has shape \(2, 2, 2\) but batch\[0\]\['image'\] has \(1, 2, 2\)",
        ),
        (lambda: recorded_padding_mask(np.ones((1, 2))), TypeError, "img must be a torch.Tensor"),
        (lambda: recorded_padding_mask(torch.ones(3)), ValueError, "at least one spatial axis"),
        (lambda: decollate_nested_batch([1]), TypeError, "batch must be a dict from NestedPadCollate"),
        (lambda: NestedPadCollate.inverse(3), TypeError, "data must be a dict sample"),
    ],
)
def test_errors(build, error, match):
    with pytest.raises(error, match=match):
        build()


def test_import_vispos_does_not_import_monai():
    import subprocess
    import sys

    code = "import sys, vispos; print('monai' in sys.modules, 'vispos.monai' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
