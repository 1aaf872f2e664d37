"""Synthetic lesions with exact 3D boxes in random crops of real volumes that installed packages ship.

Volumes (nothing downloads; each is read from a file inside an installed package):

* ``mni152_t1``, ``mni152_gm``, ``mni152_wm``: nilearn's MNI152 2009 template (T1) and its grey-
  and white-matter probability maps, 1 mm (``nilearn.datasets.load_mni152_*``);
* ``epi``: the first frame of nibabel's ``example4d.nii.gz`` test volume, a real EPI
  (2 x 2 x 2.2 mm, 24 slices);
* ``anatomical``: nibabel's ``anatomical.nii`` test volume, a real T1 at 2 mm, partial field;
* ``b0``: dipy's ``aniso_vox.nii.gz``, a real diffusion b0 at 4 x 4 x 5 mm (``pip install dipy``);
* any NIfTI file the user names (``nifti:<path>``).

Every volume goes through a MONAI dict pipeline: ``EnsureChannelFirstd`` -> ``Orientationd``
(RAS) -> ``Spacingd`` (a common isotropic spacing, trilinear) -> ``CropForegroundd`` (the air
around the head) -> ``NormalizeIntensityd`` (z-score over the nonzero voxels). So one voxel is the
same size in millimetres in every volume, and intensities are in units of the volume's tissue
standard deviation.

An item (:class:`LesionsInVolumes`) is a random crop of one volume, each side drawn on its own
(so a batch holds items of different sizes and is padded), into which 1..``max_objects``
non-overlapping lesions are drawn: solid ellipsoids or cuboids (the classes), each axis
``min_size``..``max_size`` voxels, the intensity the mean of the tissue around the lesion plus a
contrast of ``contrast`` (a range, either sign) tissue standard deviations. A lesion's box is the
exact extent of the voxels it changed.

References:
    MONAI (Cardoso et al., arXiv:2211.02701) transforms and ``monai.data.box_utils`` box modes;
    Fonov et al., NeuroImage 2011 (MNI152 2009); nibabel and dipy (Garyfallidis et al., Front.
    Neuroinform. 2014) test data.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from ._task_args import HELDOUT_VOLUMES, TRAIN_VOLUMES, VOLUMES

__all__ = [
    "CLASSES", "VOLUMES", "TRAIN_VOLUMES", "HELDOUT_VOLUMES", "available_volumes", "load_volume_resampled",
    "draw_lesions", "LesionsInVolumes",
]

CLASSES = ("ellipsoid", "cuboid")


def _package_file(package: str, *parts: str) -> str:
    import importlib

    mod = importlib.import_module(package)
    return os.path.join(os.path.dirname(mod.__file__), *parts)


def available_volumes(names: Sequence[str]) -> tuple[str, ...]:
    """The names in ``names`` whose package is installed (``nifti:<path>`` entries: whose file
    exists), in order; a warning names each one left out."""
    import importlib.util

    out = []
    for name in names:
        if name.startswith("nifti:"):
            ok = os.path.isfile(name[len("nifti:"):])
        else:
            if name not in VOLUMES:
                raise ValueError(f"unknown volume {name!r}; expected one of {tuple(VOLUMES)} or 'nifti:<path>'")
            ok = importlib.util.find_spec(VOLUMES[name][0]) is not None
        if ok:
            out.append(name)
        else:
            warnings.warn(f"volume {name!r} is not available (package or file missing); left out", stacklevel=2)
    return tuple(out)


def _nifti_image(name: str):
    """The volume as a 3-D nibabel image (affine in mm)."""
    import nibabel as nib

    if name.startswith("nifti:"):
        img = nib.load(name[len("nifti:"):])
    elif name.startswith("mni152_"):
        from nilearn import datasets

        loader = {"t1": datasets.load_mni152_template, "gm": datasets.load_mni152_gm_template,
                  "wm": datasets.load_mni152_wm_template}[name[len("mni152_"):]]
        img = loader(resolution=1)
    elif name == "epi":
        img = nib.load(_package_file("nibabel", "tests", "data", "example4d.nii.gz"))
    elif name == "anatomical":
        img = nib.load(_package_file("nibabel", "tests", "data", "anatomical.nii"))
    elif name == "b0":
        img = nib.load(_package_file("dipy", "data", "files", "aniso_vox.nii.gz"))
    else:
        raise ValueError(f"unknown volume {name!r}; expected one of {tuple(VOLUMES)} or 'nifti:<path>'")
    if len(img.shape) == 4:
        img = img.slicer[..., 0]
    if len(img.shape) != 3:
        raise ValueError(f"volume {name!r} must be 3-D (or 4-D, first frame taken), got shape {img.shape}")
    return img


def smallest_extent_mm(name: str) -> float:
    """The volume's shortest side in mm (voxels times voxel size, from the NIfTI header): the
    resampled volume has ``smallest_extent_mm(name) / spacing`` voxels along that axis, before
    the foreground crop.

    Raises:
        ValueError: an unknown name; a volume that is not 3-D or 4-D.
    """
    img = _nifti_image(name)
    zooms = img.header.get_zooms()[:3]
    return float(min(n * z for n, z in zip(img.shape[:3], zooms)))


def load_volume_resampled(name: str, spacing: float) -> Tensor:
    """One volume through the MONAI pipeline of this module (RAS, ``spacing`` mm isotropic,
    foreground crop, foreground z-score).

    Args:
        name (str): a key of :data:`VOLUMES` or ``"nifti:<path>"``.
        spacing (float): voxel size in mm, every axis.

    Returns:
        Tensor[1, D, H, W], float32 (a new tensor each call; the resampled volume is computed once
        per process and cached).

    Raises:
        ValueError: an unknown name; a volume that is not 3-D or 4-D; ``spacing`` not > 0.
        ImportError: the volume's package (or MONAI) is missing.
    """
    if not spacing > 0:
        raise ValueError(f"spacing must be > 0 (mm), got {spacing!r}")
    return _resampled(name, float(spacing)).clone()


@functools.lru_cache(maxsize=16)
def _resampled(name: str, spacing: float) -> Tensor:
    from monai.data import MetaTensor
    from monai.transforms import (
        Compose, CropForegroundd, EnsureChannelFirstd, NormalizeIntensityd, Orientationd, Spacingd,
    )

    img = _nifti_image(name)
    data = np.asarray(img.dataobj, dtype=np.float32)
    data = np.nan_to_num(data, nan=0.0, posinf=0.0, neginf=0.0)
    image = MetaTensor(torch.from_numpy(np.ascontiguousarray(data)), affine=torch.as_tensor(img.affine))
    pipeline = Compose([
        EnsureChannelFirstd("image", channel_dim="no_channel"),
        Orientationd("image", axcodes="RAS", labels=(("L", "R"), ("P", "A"), ("I", "S"))),
        Spacingd("image", pixdim=(spacing,) * 3, mode="bilinear"),
        # the air around the head: a margin of 2 voxels is kept (never beyond the volume)
        CropForegroundd("image", source_key="image", select_fn=_foreground, margin=2, allow_smaller=True),
        NormalizeIntensityd("image", nonzero=True),
    ])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # MONAI's deprecation chatter about its own defaults
        out = pipeline({"image": image})["image"]
    return out.as_tensor().float().contiguous()


def _foreground(x: Tensor) -> Tensor:
    """Voxels above 5 % of the 99th percentile count as foreground (air and scanner noise are
    below it in every volume above)."""
    return x > 0.05 * torch.quantile(x.flatten().float()[::7], 0.99)


# ------------------------------------------------------------------------------------ lesions
def _shape_mask(cls: int, size: Sequence[int]) -> np.ndarray:
    """A solid ellipsoid (``cls`` 0) or cuboid (1) filling a ``size`` voxel block."""
    if cls == 1:
        return np.ones(tuple(size), dtype=bool)
    axes = [(np.arange(n) + 0.5 - n / 2) / (n / 2) for n in size]
    zz, yy, xx = np.meshgrid(*axes, indexing="ij")
    return zz**2 + yy**2 + xx**2 <= 1.0


def draw_lesions(
    volume: Tensor, rng: np.random.Generator, max_objects: int, min_size: int, max_size: int,
    contrast: tuple[float, float] = (1.5, 3.0),
) -> tuple[Tensor, Tensor, Tensor]:
    """Draws 1..``max_objects`` non-overlapping lesions into a copy of ``volume``.

    Each lesion is an ellipsoid or a cuboid of ``min_size``..``max_size`` voxels per axis (clipped
    to the volume), placed wholly inside it, at least one voxel apart from the others. Its voxels
    are set to the mean of the tissue in a 2-voxel shell around it plus ``±U(contrast)`` (units:
    the volume's intensity units, tissue standard deviations after :func:`load_volume_resampled`).

    Args:
        volume (Tensor[1, D, H, W]): float.
        rng (numpy.random.Generator): all randomness.
        max_objects, min_size, max_size (int): lesions per volume and their extent in voxels.
        contrast (tuple of float): the range of the absolute contrast.

    Returns:
        ``(volume Tensor[1, D, H, W], boxes Tensor[N, 6] float32, labels Tensor[N] int64)``; boxes
        are corners ``(d0, h0, w0, d1, h1, w1)`` in voxels, end exclusive (MONAI's ``xyzxyz``
        mode with its axes in tensor order), the exact extent of the changed voxels.
    """
    vol = volume[0].numpy().copy()
    shape = np.asarray(vol.shape)
    occupied = np.zeros(vol.shape, dtype=bool)
    boxes, labels = [], []
    for _ in range(int(rng.integers(1, max_objects + 1))):
        for _trial in range(30):
            cls = int(rng.integers(len(CLASSES)))
            size = np.minimum(rng.integers(min_size, max_size + 1, size=3), shape)
            start = np.asarray([int(rng.integers(0, s - z + 1)) for s, z in zip(shape, size)])
            region = tuple(slice(a, a + z) for a, z in zip(start, size))
            mask = _shape_mask(cls, size)
            if (occupied[region] & mask).any():
                continue
            shell = tuple(slice(max(0, a - 2), a + z + 2) for a, z in zip(start, size))
            around = np.ones(vol[shell].shape, dtype=bool)
            inner = tuple(slice(a - s.start, a - s.start + z) for a, s, z in zip(start, shell, size))
            around[inner] = ~mask
            around &= ~occupied[shell]
            local = float(vol[shell][around].mean()) if around.any() else float(vol.mean())
            sign = 1.0 if rng.random() < 0.5 else -1.0
            vol[region][mask] = local + sign * rng.uniform(*contrast)
            occupied[tuple(slice(max(0, a - 1), a + z + 1) for a, z in zip(start, size))] |= True
            idx = np.nonzero(mask)
            lo = start + np.asarray([i.min() for i in idx])
            hi = start + np.asarray([i.max() + 1 for i in idx])
            boxes.append([*lo, *hi])
            labels.append(cls)
            break
    out = torch.from_numpy(vol)[None]
    return out, torch.tensor(boxes, dtype=torch.float32).reshape(-1, 6), torch.tensor(labels, dtype=torch.int64)


class LesionsInVolumes(Dataset):
    """Lesions with exact 3D boxes in random crops of real volumes; item ``i`` depends only on
    ``(seed, i)``, so it is the same in every process, arm and resumed run.

    Args:
        volumes (sequence of str): volume names (:data:`VOLUMES` keys or ``"nifti:<path>"``).
        length (int): number of items.
        seed (int): data seed.
        spacing (float): common voxel size in mm.
        crop (tuple of int): ``(min, max)`` crop side in voxels, drawn per axis (clipped to the
            volume).
        max_objects, min_size, max_size (int), contrast (tuple of float): see :func:`draw_lesions`.

    Returns (per item):
        ``(Tensor[1, D, H, W] float32, {"labels": Tensor[N] int64, "boxes": Tensor[N, 6] float32})``:
        boxes center-size ``(cz, cy, cx, d, h, w)`` (MONAI's ``cccwhd`` with its axes in tensor
        order), normalised by the item's own ``(D, H, W, D, H, W)``, in ``[0, 1]``.

    Raises:
        ValueError: no volume, bad sizes (``min > max``, a lesion larger than the smallest crop).
    """

    def __init__(
        self, volumes: Sequence[str], length: int, seed: int, spacing: float, crop: tuple[int, int],
        max_objects: int = 3, min_size: int = 4, max_size: int = 16, contrast: tuple[float, float] = (1.5, 3.0),
    ) -> None:
        if not volumes:
            raise ValueError("volumes must name at least one volume, got none")
        if not (0 < crop[0] <= crop[1]):
            raise ValueError(f"crop must be (min, max) with 0 < min <= max, got {crop}")
        if not (0 < min_size <= max_size <= crop[0]):
            raise ValueError(
                f"lesion sizes must satisfy 0 < min_size <= max_size <= crop min, got {min_size}, {max_size}, {crop[0]}"
            )
        self.volumes = tuple(volumes)
        self.length, self.seed, self.spacing = int(length), int(seed), float(spacing)
        self.crop, self.max_objects = (int(crop[0]), int(crop[1])), int(max_objects)
        self.min_size, self.max_size, self.contrast = int(min_size), int(max_size), tuple(contrast)
        for name in self.volumes:  # load (and cache) now: a missing file fails here, not mid-training
            _resampled(name, self.spacing)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[Tensor, dict[str, Tensor]]:
        from monai.data.box_utils import convert_box_mode

        rng = np.random.default_rng([self.seed, index])
        volume = _resampled(self.volumes[int(rng.integers(len(self.volumes)))], self.spacing)
        shape = volume.shape[1:]
        size = [min(int(rng.integers(self.crop[0], self.crop[1] + 1)), s) for s in shape]
        start = [int(rng.integers(0, s - z + 1)) for s, z in zip(shape, size)]
        crop = volume[:, start[0]:start[0] + size[0], start[1]:start[1] + size[1], start[2]:start[2] + size[2]]
        image, corners, labels = draw_lesions(
            crop, rng, self.max_objects, self.min_size, self.max_size, self.contrast
        )
        scale = torch.tensor(size * 2, dtype=torch.float32)
        boxes = convert_box_mode(corners, src_mode="xyzxyz", dst_mode="cccwhd") / scale
        return image.contiguous(), {"labels": labels, "boxes": boxes.float()}

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(volumes={list(self.volumes)}, length={self.length}, seed={self.seed}, "
            f"spacing={self.spacing}, crop={self.crop}, max_objects={self.max_objects}, "
            f"min_size={self.min_size}, max_size={self.max_size}, contrast={self.contrast})"
        )
