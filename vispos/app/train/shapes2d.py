"""Shapes with exact boxes pasted on real photographs: the data of the 2D DETR training task.

Solid shapes drawn by ``skimage.draw.random_shapes`` (three classes: rectangle, circle,
triangle; boxes exact, read from the drawn pixels) pasted onto real photographs shipped with
scikit-image and matplotlib, each photograph at its natural aspect ratio. Training images go
through torchvision ``transforms.v2`` with ``tv_tensors.BoundingBoxes`` (horizontal flip, a
multi-scale resize of the longer side), so every batch holds images of different sizes and is
padded by :class:`vispos.PaddedCollate`. Held-out images use other photographs
(:data:`~vispos.app.train._task_args.TRAIN_PHOTOS`, :data:`~vispos.app.train._task_args.HELDOUT_PHOTOS`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor
from torchvision import tv_tensors
from torchvision.ops import box_convert
from torchvision.transforms import v2

from ..data import IMAGENET_MEAN, IMAGENET_STD, load_image, sample_images
from ._task_args import HELDOUT_PHOTOS, TRAIN_PHOTOS

__all__ = ["CLASSES", "TRAIN_PHOTOS", "HELDOUT_PHOTOS", "ShapesOnPhotos", "draw_objects", "load_photos"]

CLASSES = ("rectangle", "circle", "triangle")


def load_photos(names: Sequence[str], max_size: int) -> list[Tensor]:
    """Real photographs as ``Tensor[3, H, W]`` float32 in [0, 1], longer side ``max_size``
    (read once per process; callers get their own copies)."""
    return [t.clone() for t in _load_photos(tuple(names), max_size)]


@functools.lru_cache(maxsize=4)
def _load_photos(names: tuple[str, ...], max_size: int) -> tuple[Tensor, ...]:
    out = []
    for name in names:
        if name == "grace_hopper":
            import matplotlib

            path = os.path.join(matplotlib.get_data_path(), "sample_data", "grace_hopper.jpg")
            out.append(load_image(path, max_size=max_size))
        else:
            out.append(sample_images([name], max_size=max_size)[0][1])
    return tuple(out)


def draw_objects(
    photo: Tensor, rng: np.random.Generator, max_objects: int, min_size: int, max_size: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Pastes 1..max_objects non-overlapping shapes on a copy of ``photo``.

    Returns ``(image Tensor[3, H, W], boxes Tensor[N, 4] XYXY pixels (end exclusive), labels
    Tensor[N] int64)``. Each box is the exact extent of the shape's drawn pixels (equal to
    ``random_shapes``' own label clipped to the canvas).
    """
    from skimage.draw import random_shapes

    h, w = photo.shape[1:]
    image = photo.permute(1, 2, 0).numpy().copy()
    occupied = np.zeros((h, w), dtype=bool)
    boxes, labels = [], []
    for _ in range(int(rng.integers(1, max_objects + 1))):
        for _trial in range(20):
            cls = int(rng.integers(len(CLASSES)))
            drawn, _ = random_shapes(
                (h, w), max_shapes=1, shape=CLASSES[cls], min_size=min_size, max_size=max_size,
                intensity_range=((0, 254),), rng=int(rng.integers(2**31)),
            )
            pixels = (drawn != 255).any(-1)
            rows, cols = np.nonzero(pixels.any(1))[0], np.nonzero(pixels.any(0))[0]
            if rows.size < min_size // 2 or cols.size < min_size // 2 or (pixels & occupied).any():
                continue
            y0, y1, x0, x1 = rows[0], rows[-1] + 1, cols[0], cols[-1] + 1
            occupied[max(0, y0 - 2):y1 + 2, max(0, x0 - 2):x1 + 2] = True  # keep objects apart
            image[pixels] = drawn[pixels] / 255.0
            boxes.append([x0, y0, x1, y1])
            labels.append(cls)
            break
    image_t = torch.from_numpy(image).permute(2, 0, 1).contiguous()
    return image_t, torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4), torch.tensor(labels, dtype=torch.int64)


class ShapesOnPhotos(torch.utils.data.Dataset):
    """Shapes with exact boxes on real photographs; item ``i`` is the same in every process.

    Args:
        photos (list of Tensor[3, H, W]): backgrounds, float in [0, 1].
        length (int): number of items.
        seed (int): data seed; item ``i`` depends only on ``(seed, i)``.
        scales (sequence of int): longer sides for the multi-scale resize.
        train (bool): random flip and random scale (else: scale ``scales[i % len]``, no flip).
        max_objects, min_size, max_size (int): objects per image and their size in pixels at
            the photo's base size.

    Returns (per item):
        ``(Tensor[3, H, W] normalised, {"labels": Tensor[N] int64, "boxes": Tensor[N, 4] cxcywh
        normalised by the image's own (W, H, W, H)})``.
    """

    def __init__(
        self, photos: Sequence[Tensor], length: int, seed: int, scales: Sequence[int], train: bool,
        max_objects: int = 3, min_size: int = 12, max_size: int = 48,
    ) -> None:
        self.photos, self.length, self.seed = list(photos), length, seed
        self.scales, self.train = tuple(scales), train
        self.max_objects, self.min_size, self.max_size = max_objects, min_size, max_size
        self.normalize = v2.Compose([v2.ToDtype(torch.float32), v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
        resizes = [v2.Resize(size=None, max_size=s, antialias=True) for s in self.scales]
        self.augment = v2.Compose([v2.RandomHorizontalFlip(0.5), v2.RandomChoice(resizes)])
        self.fixed = resizes

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[Tensor, dict[str, Tensor]]:
        rng = np.random.default_rng([self.seed, index])
        photo = self.photos[int(rng.integers(len(self.photos)))]
        image, boxes, labels = draw_objects(photo, rng, self.max_objects, self.min_size, self.max_size)
        image = tv_tensors.Image(image)
        boxes = tv_tensors.BoundingBoxes(boxes, format="XYXY", canvas_size=tuple(image.shape[1:]))
        if self.train:
            with torch.random.fork_rng(devices=[]):  # transforms.v2 draws from torch's global RNG
                torch.manual_seed(int(rng.integers(2**31)))
                image, boxes = self.augment(image, boxes)
        else:
            image, boxes = self.fixed[index % len(self.fixed)](image, boxes)
        h, w = image.shape[1:]
        cxcywh = box_convert(boxes.as_subclass(Tensor), "xyxy", "cxcywh") / torch.tensor([w, h, w, h])
        return self.normalize(image).as_subclass(Tensor), {"labels": labels, "boxes": cxcywh.float()}
