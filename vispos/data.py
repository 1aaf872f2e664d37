"""Images from files or from scikit-image's shipped sample photos, as tensors ready to batch.

Nothing is downloaded: the sample photos are the ones scikit-image installs with itself.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "SAMPLE_IMAGES",
    "imagenet_normalize",
    "load_image",
    "load_images",
    "sample_images",
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

#: scikit-image sample photos used by ``vispos demo``: (name, height x width)
SAMPLE_IMAGES = ("astronaut", "coffee", "chelsea", "rocket")


def _to_tensor(pil_image, max_size: int | None) -> Tensor:
    from PIL import Image

    img = pil_image.convert("RGB")
    if max_size is not None:
        if isinstance(max_size, bool) or not isinstance(max_size, int) or max_size <= 0:
            raise ValueError(f"max_size must be a positive int or None, got {max_size!r}")
        w, h = img.size
        longest = max(w, h)
        if longest > max_size:
            ratio = max_size / longest
            img = img.resize((max(1, round(w * ratio)), max(1, round(h * ratio))), Image.BILINEAR)
    arr = np.asarray(img, dtype=np.float32) / 255.0  # (H, W, 3)
    return torch.from_numpy(arr.copy()).permute(2, 0, 1).contiguous()


def load_image(path: str | os.PathLike, max_size: int | None = None) -> Tensor:
    """Reads an image file with Pillow.

    Args:
        path (str | PathLike): any format Pillow reads; grey and RGBA images become RGB.
        max_size (int, optional): shrink (bilinear) so the longest side is at most this.

    Returns:
        Tensor[3, H, W], float32 in [0, 1].

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file is not an image Pillow can read; bad ``max_size``.
    """
    from PIL import Image, UnidentifiedImageError

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"image file {path!r} does not exist")
    try:
        with Image.open(path) as im:
            im.load()
            return _to_tensor(im, max_size)
    except (UnidentifiedImageError, OSError) as exc:
        raise ValueError(f"image file {path!r} could not be read as an image: {exc}") from None


def load_images(
    paths: Sequence[str | os.PathLike], max_size: int | None = None, progress: bool | None = None
) -> list[Tensor]:
    """Reads several images (see :func:`load_image`), with a tqdm progress bar.

    Args:
        paths: image files.
        max_size (int, optional): as in :func:`load_image`.
        progress (bool, optional): show a progress bar; default: when more than 8 paths.

    Returns:
        list of Tensor[3, H_i, W_i], float32 in [0, 1].
    """
    from tqdm.auto import tqdm

    if progress is None:
        progress = len(paths) > 8
    return [load_image(p, max_size) for p in tqdm(paths, desc="loading images", disable=not progress)]


def sample_images(
    names: Sequence[str] = SAMPLE_IMAGES, max_size: int | None = None
) -> list[tuple[str, Tensor]]:
    """scikit-image's shipped sample photos (``skimage.data.<name>()``), no download.

    Args:
        names: sample names, default ``astronaut`` (512x512), ``coffee`` (400x600), ``chelsea``
            (300x451) and ``rocket`` (427x640).
        max_size (int, optional): as in :func:`load_image`.

    Returns:
        list of ``(name, Tensor[3, H, W])``, float32 in [0, 1].

    Raises:
        ImportError: scikit-image is missing (``pip install vispos[demo]``).
        ValueError: an unknown sample name.
    """
    try:
        import skimage.data
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the sample photos come from scikit-image: pip install 'vispos[demo]'"
        ) from exc
    from PIL import Image

    out = []
    for name in names:
        loader = getattr(skimage.data, name, None)
        if loader is None or not callable(loader):
            raise ValueError(f"unknown scikit-image sample {name!r}; try one of {SAMPLE_IMAGES}")
        arr = np.asarray(loader())
        out.append((name, _to_tensor(Image.fromarray(arr), max_size)))
    return out


def imagenet_normalize(image: Tensor) -> Tensor:
    """``(image - mean) / std`` with ImageNet's statistics; returns a new tensor.

    Args:
        image (Tensor[3, H, W] or Tensor[B, 3, H, W]): float in [0, 1].

    Raises:
        ValueError: the channel axis does not have 3 entries.
    """
    if image.dim() not in (3, 4) or image.shape[-3] != 3:
        raise ValueError(f"image must have shape (3, H, W) or (B, 3, H, W), got {tuple(image.shape)}")
    mean = torch.tensor(IMAGENET_MEAN, dtype=image.dtype, device=image.device).view(3, 1, 1)
    std = torch.tensor(IMAGENET_STD, dtype=image.dtype, device=image.device).view(3, 1, 1)
    return (image - mean) / std
