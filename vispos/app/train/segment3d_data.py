"""Volumes of different sizes and spacings with inserted lesions and their voxel masks.

An item (:class:`LesionMasks`) is a random field of view of one real volume that installed
packages ship (:mod:`vispos.app.train.volumes3d`: nilearn's MNI152 maps and nibabel's EPI for
training, nibabel's ``anatomical.nii`` and dipy's anisotropic b0 held out), first brought by MONAI
to ``spacings[0]`` mm isotropic (RAS, foreground crop, z-score), then resampled by MONAI's
``Resize`` (trilinear) to its own size: each side a multiple of
:data:`~vispos.app.train.segment3d_args.SIZE_MULTIPLE` drawn from ``sizes``, each voxel size drawn
from ``spacings`` (a field of view wider than the volume is clipped to it, which makes that
voxel smaller). Into it 1..``max_objects`` lesions are drawn (solid ellipsoids or cuboids, the
mean of the surrounding tissue plus a contrast of either sign), and their union is the label.

:class:`PatchesOf` turns an item into MONAI's training patch for the crop pipeline
(``RandCropByPosNegLabeld``, one patch, positive and negative centres equally likely).

References:
    MONAI (Cardoso et al., arXiv:2211.02701) ``Resize``, ``RandCropByPosNegLabeld``;
    Fonov et al., NeuroImage 2011 (MNI152 2009); nibabel and dipy test data.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from .segment3d_args import SIZE_MULTIPLE
from .volumes3d import _shape_mask, load_volume_resampled

__all__ = ["LesionMasks", "PatchesOf", "draw_lesion_masks"]


def draw_lesion_masks(
    volume: np.ndarray, rng: np.random.Generator, max_objects: int, min_size: int, max_size: int,
    contrast: tuple[float, float],
) -> tuple[np.ndarray, np.ndarray]:
    """Draws 1..``max_objects`` non-overlapping lesions into a copy of ``volume``.

    Each lesion is an ellipsoid or a cuboid of ``min_size``..``max_size`` voxels per axis (clipped
    to the volume), wholly inside it, at least one voxel from the others; its voxels are set to
    the mean of the tissue in a 2-voxel shell around it plus ``±U(contrast)``.

    Args:
        volume (ndarray[D, H, W], float32): intensities (tissue standard deviations).
        rng (numpy.random.Generator): all randomness.
        max_objects, min_size, max_size (int): lesions per volume and their extent in voxels.
        contrast (tuple of float): the range of the absolute contrast.

    Returns:
        ``(volume ndarray[D, H, W] float32, label ndarray[D, H, W] int64)``: label 1 on lesion voxels.
    """
    vol = volume.copy()
    shape = np.asarray(vol.shape)
    label = np.zeros(vol.shape, dtype=np.int64)
    occupied = np.zeros(vol.shape, dtype=bool)
    for _ in range(int(rng.integers(1, max_objects + 1))):
        for _trial in range(30):
            size = np.minimum(rng.integers(min_size, max_size + 1, size=3), shape)
            start = np.asarray([int(rng.integers(0, s - z + 1)) for s, z in zip(shape, size)])
            region = tuple(slice(a, a + z) for a, z in zip(start, size))
            mask = _shape_mask(int(rng.integers(2)), size)
            if (occupied[region] & mask).any():
                continue
            shell = tuple(slice(max(0, a - 2), a + z + 2) for a, z in zip(start, size))
            around = ~occupied[shell]
            inner = tuple(slice(a - s.start, a - s.start + z) for a, s, z in zip(start, shell, size))
            around[inner] &= ~mask
            local = float(vol[shell][around].mean()) if around.any() else float(vol.mean())
            sign = 1.0 if rng.random() < 0.5 else -1.0
            vol[region][mask] = local + sign * rng.uniform(*contrast)
            label[region][mask] = 1
            occupied[tuple(slice(max(0, a - 1), a + z + 1) for a, z in zip(start, size))] = True
            break
    return vol, label


class LesionMasks(Dataset):
    """Real volumes at their own sizes and anisotropic spacings with lesion masks; item ``i``
    depends only on ``(seed, i)`` (the same in every process, pipeline and resumed run).

    Args:
        volumes (sequence of str): volume names (``vispos.app.train.volumes3d.VOLUMES`` keys or
            ``"nifti:<path>"``).
        length (int): number of items.
        seed (int): data seed.
        sizes (tuple of int): ``(min, max)`` side in voxels; each side is a multiple of
            ``SIZE_MULTIPLE`` in that range, drawn per axis.
        spacings (tuple of float): ``(min, max)`` voxel size in mm, drawn per axis.
        max_objects, min_size, max_size (int), contrast (tuple of float): see :func:`draw_lesion_masks`.

    Returns (per item):
        ``(Tensor[1, D, H, W] float32, {"label": Tensor[D, H, W] int64, "spacing": Tensor[3]
        float64 (mm per voxel, D H W), "index": int})``.

    Raises:
        ValueError: no volume; no multiple of ``SIZE_MULTIPLE`` in ``sizes``; ``max_size`` larger
            than the smallest side.
    """

    def __init__(
        self, volumes: Sequence[str], length: int, seed: int, sizes: tuple[int, int],
        spacings: tuple[float, float], max_objects: int = 3, min_size: int = 4, max_size: int = 12,
        contrast: tuple[float, float] = (1.5, 3.0),
    ) -> None:
        if not volumes:
            raise ValueError("volumes must name at least one volume, got none")
        self.choices = [s for s in range(SIZE_MULTIPLE, int(sizes[1]) + 1, SIZE_MULTIPLE) if s >= sizes[0]]
        if not self.choices:
            raise ValueError(f"sizes must hold a multiple of {SIZE_MULTIPLE}, got {tuple(sizes)}")
        if not 0 < min_size <= max_size <= self.choices[0]:
            raise ValueError(f"lesion sizes must satisfy 0 < min_size <= max_size <= {self.choices[0]}, got "
                             f"{min_size}, {max_size}")
        self.volumes, self.length, self.seed = tuple(volumes), int(length), int(seed)
        self.spacings = (float(spacings[0]), float(spacings[1]))
        self.max_objects, self.min_size, self.max_size = int(max_objects), int(min_size), int(max_size)
        self.contrast = (float(contrast[0]), float(contrast[1]))
        # loaded (and cached) now: a missing file fails here, not mid-training
        self.sources = {name: load_volume_resampled(name, self.spacings[0]) for name in self.volumes}

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[Tensor, dict]:
        from monai.transforms import Resize

        rng = np.random.default_rng([self.seed, index])
        source = self.sources[self.volumes[int(rng.integers(len(self.volumes)))]]
        base = self.spacings[0]
        size = [int(rng.choice(self.choices)) for _ in range(3)]
        want = rng.uniform(*self.spacings, size=3)
        # the field of view in source voxels, clipped to the volume
        view = [max(1, min(int(round(n * s / base)), side)) for n, s, side in zip(size, want, source.shape[1:])]
        start = [int(rng.integers(0, side - v + 1)) for v, side in zip(view, source.shape[1:])]
        crop = source[:, start[0]:start[0] + view[0], start[1]:start[1] + view[1], start[2]:start[2] + view[2]]
        image = Resize(spatial_size=size, mode="trilinear")(crop)
        image = torch.as_tensor(np.asarray(image), dtype=torch.float32)
        vol, label = draw_lesion_masks(image[0].numpy(), rng, self.max_objects, self.min_size, self.max_size,
                                       self.contrast)
        spacing = torch.tensor([v * base / n for v, n in zip(view, size)], dtype=torch.float64)
        return torch.from_numpy(vol)[None].contiguous(), {
            "label": torch.from_numpy(label), "spacing": spacing, "index": int(index)}

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(volumes={list(self.volumes)}, length={self.length}, seed={self.seed}, "
                f"sizes={self.choices}, spacings={self.spacings}, max_objects={self.max_objects}, "
                f"min_size={self.min_size}, max_size={self.max_size}, contrast={self.contrast})")


class PatchesOf(Dataset):
    """MONAI's training patches of a :class:`LesionMasks`: ``RandCropByPosNegLabeld`` (one patch
    of ``patch`` voxels per side, a lesion voxel or a background voxel at its centre with equal
    odds), seeded by ``(seed, i)``.

    Returns (per item):
        ``(Tensor[1, P, P, P] float32, {"label": Tensor[P, P, P] int64, "spacing", "index"})``.
    """

    def __init__(self, volumes: LesionMasks, patch: int, seed: int) -> None:
        self.volumes, self.patch, self.seed = volumes, int(patch), int(seed)

    def __len__(self) -> int:
        return len(self.volumes)

    def __getitem__(self, index: int) -> tuple[Tensor, dict]:
        from monai.transforms import RandCropByPosNegLabeld

        image, target = self.volumes[index]
        crop = RandCropByPosNegLabeld(["image", "label"], "label", spatial_size=(self.patch,) * 3, pos=1, neg=1,
                                      num_samples=1, allow_smaller=True)
        crop.set_random_state(seed=int(np.random.default_rng([self.seed, index, 1]).integers(2**31)))
        out = crop({"image": image, "label": target["label"][None]})[0]
        return torch.as_tensor(np.asarray(out["image"])).float(), {
            **target, "label": torch.as_tensor(np.asarray(out["label"]))[0].long()}
