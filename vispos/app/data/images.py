"""Images from files or from scikit-image's shipped sample photos, as float tensors ready to batch.

Nothing is downloaded: the sample photos are the ones scikit-image installs with itself.
Decoding goes through TorchCodec (PNG, JPEG, GIF, WebP, AVIF at their bit depth, EXIF orientation
applied) or Pillow (TIFF, BMP, PNM): one decoder per format, never a second opinion; a
decompression bomb is refused from its header. A damaged file raises ``ValueError``: both
decoders report damage as exceptions (torchvision's native PNG decoder, used before, ended the
process on some damaged PNGs, pytorch/vision #3613, #4485), and a file TorchCodec refuses is not
handed to Pillow, which returns plausible but wrong pixels for some damaged files.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from ..._checks import check_bool, check_file, check_int
from ._args import SAMPLE_IMAGES, check_paths, shrunk_size, unknown_sample

__all__ = [
    "IMAGE_FORMATS",
    "MAX_IMAGE_PIXELS",
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


#: the most pixels :func:`load_image` decodes by default (Pillow's own decompression-bomb
#: warning threshold); a larger image is refused from its header, before anything is allocated
MAX_IMAGE_PIXELS = 89_478_485

#: formats decoded by TorchCodec (8 and 16 bit; EXIF orientation applied by the decoder);
#: Pillow's names (``MPO`` is a multi-picture JPEG, as phone cameras write)
_TORCHCODEC_FORMATS = frozenset({"PNG", "JPEG", "MPO", "GIF", "WEBP", "AVIF"})
#: formats decoded by Pillow: what TorchCodec does not read (``PPM``: the PBM/PGM/PPM/PFM family)
_PILLOW_FORMATS = frozenset({"TIFF", "BMP", "PPM"})
#: the image formats :func:`load_image` reads (Pillow's format names); every one is covered by
#: the corrupted-file test (tests/test_data_fuzz.py)
IMAGE_FORMATS = tuple(sorted(_TORCHCODEC_FORMATS | _PILLOW_FORMATS))


def _shrink(image: Tensor, max_size: int | None) -> Tensor:
    """Bilinear, antialiased shrink of a float ``Tensor[3, H, W]`` so its longest side is at
    most ``max_size`` (never enlarged)."""
    from torchvision.transforms.v2 import InterpolationMode
    from torchvision.transforms.v2.functional import resize

    max_size = check_int(max_size, "max_size", minimum=1, optional=True)
    h, w = image.shape[-2:]
    size = list(shrunk_size((h, w), max_size))
    if size == [h, w]:
        return image
    out = resize(image, size, interpolation=InterpolationMode.BILINEAR, antialias=True)
    return out.clamp_(0.0, 1.0)


def _to_tensor(pil_image, max_size: int | None) -> Tensor:
    """An 8-bit Pillow image (any mode Pillow converts to RGB) as ``Tensor[3, H, W]`` in [0, 1]."""
    arr = np.asarray(pil_image.convert("RGB"))  # (H, W, 3) uint8
    image = torch.from_numpy(arr.copy()).permute(2, 0, 1).float().div_(255.0)
    return _shrink(image.contiguous(), max_size)


def _pillow_to_tensor(im, path: str) -> Tensor:
    """A Pillow image at its stored depth as float32 ``Tensor[3, H, W]`` in [0, 1]: 16-bit
    integers divided by 65535, 32-bit floats kept (clipped to [0, 1] with a warning when they
    leave it), everything else through Pillow's 8-bit RGB conversion."""
    from PIL import ImageOps

    im = ImageOps.exif_transpose(im)
    if im.mode.startswith("I;16") or im.mode in ("I", "F"):
        arr = np.asarray(im)
        if arr.dtype.kind in "iu":
            if arr.size and (arr.min() < 0 or arr.max() > 65535):
                raise ValueError(
                    f"image file {path!r} holds {im.mode} integers from {arr.min()} to {arr.max()}; "
                    "vispos reads integer images of at most 16 bits (0 .. 65535)"
                )
            arr = arr.astype(np.float32) / 65535.0
        else:
            arr = arr.astype(np.float32)
            if not np.isfinite(arr).all():
                raise ValueError(f"image file {path!r} holds non-finite values (NaN or inf)")
            lo, hi = (float(arr.min()), float(arr.max())) if arr.size else (0.0, 1.0)
            if lo < 0.0 or hi > 1.0:
                warnings.warn(
                    f"image file {path!r} holds floats from {lo:g} to {hi:g}; vispos expects float "
                    "images in [0, 1] and clips them", stacklevel=4,
                )
                arr = np.clip(arr, 0.0, 1.0)
        return torch.from_numpy(np.ascontiguousarray(arr))[None].expand(3, -1, -1).contiguous()
    return _to_tensor(im, None)


def load_image(
    path: str | os.PathLike, max_size: int | None = None, *, max_pixels: int | None = MAX_IMAGE_PIXELS
) -> Tensor:
    """Reads an image file at its stored depth, upright, as float RGB in [0, 1].

    The header is read first (Pillow, lazily): an image larger than ``max_pixels`` is refused
    before any pixel is decoded. PNG, JPEG (and MPO), GIF, WebP and AVIF are then decoded by
    TorchCodec's ``decode_image`` (8- and 16-bit, EXIF orientation applied: the same pixels as
    Pillow's ``ImageOps.exif_transpose`` for orientations 1-8). The rule for damage: a file of
    these formats that TorchCodec refuses raises ``ValueError`` and is not retried with Pillow,
    which returns an image without error for some damaged files (a palette PNG that lost its
    palette, a GIF with a forged LZW code size: all black; a PNG or GIF cut short while
    ``PIL.ImageFile.LOAD_TRUNCATED_IMAGES`` is set: its missing rows filled; a bad checksum or a
    missing end marker). TIFF, BMP and PNM (PBM/PGM/PPM/PFM) are decoded by Pillow alone, with
    ``ImageOps.exif_transpose``. Integers are divided by their type's maximum (255 for 8 bits,
    65535 for 16 bits); 32-bit float images (TIFF mode ``F``) are taken as stored, expected in
    [0, 1] (clipped with a warning otherwise). Grey images are repeated to three channels; an
    alpha channel is dropped; a file of several frames (a multipage TIFF, an animated GIF, WebP or
    AVIF, an MPO) gives its first frame, with a ``UserWarning`` that says so. A damaged file (truncated,
    flipped bytes, forged header fields) raises ``ValueError``, never ends the process.

    Args:
        path (str | PathLike): an image in one of :data:`IMAGE_FORMATS` (detected from its
            content, not its name).
        max_size (int, optional): shrink (bilinear, antialiased) so the longest side is at most this.
        max_pixels (int, optional): refuse larger images (default :data:`MAX_IMAGE_PIXELS`);
            None lifts the limit (Pillow still refuses more than twice its own
            ``Image.MAX_IMAGE_PIXELS``).

    Returns:
        Tensor[3, H, W], float32 in [0, 1]; ``H, W`` as the image is displayed (after EXIF
        rotation).

    Raises:
        FileNotFoundError: no such file.
        IsADirectoryError: ``path`` is a directory.
        TypeError: a non-int ``max_size`` / ``max_pixels``.
        ValueError: the file is not an image, is in a format outside :data:`IMAGE_FORMATS`, or is
            damaged, or TorchCodec refuses a PNG / JPEG / MPO / GIF / WebP / AVIF (every message
            names the file and the decoder's reason); it has more than ``max_pixels`` pixels (the
            message names its size and the limit); integers above 16 bits or non-finite floats;
            a non-positive ``max_size`` / ``max_pixels``.

    References:
        TorchCodec ``torchcodec.decoders.decode_image``; Pillow ``Image.open``,
        ``ImageOps.exif_transpose``; EXIF 2.3 tag 0x0112 (Orientation).
    """
    from PIL import Image, UnidentifiedImageError

    max_size = check_int(max_size, "max_size", minimum=1, optional=True)
    max_pixels = check_int(max_pixels, "max_pixels", minimum=1, optional=True)
    path = check_file(path, "image file", "an image file")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # our own limit below
            im = Image.open(path)  # reads the header only
    except Image.DecompressionBombError as exc:
        size = _header_size(path)
        found = f"{size[0]}x{size[1]} = {size[0] * size[1]} pixels" if size else str(exc)
        raise ValueError(
            f"image file {path!r} declares {found}, more than Pillow's limit of "
            f"{2 * (Image.MAX_IMAGE_PIXELS or 0)} pixels (a decompression bomb?); refused before decoding"
        ) from None
    except UnidentifiedImageError:
        raise ValueError(
            f"image file {path!r} could not be read as an image: Pillow identifies no image "
            f"format in it (load_image reads {', '.join(IMAGE_FORMATS)})"
        ) from None
    except Exception as exc:  # noqa: BLE001 - a forged header: OSError, SyntaxError, RuntimeError ...
        raise ValueError(f"image file {path!r} could not be read as an image: {_why(exc)}") from None
    with im:
        w, h = im.size
        if im.format not in IMAGE_FORMATS:
            raise ValueError(
                f"image file {path!r} is {im.format}; load_image reads {', '.join(IMAGE_FORMATS)} "
                "(convert it first, e.g. with Pillow, to PNG or TIFF)"
            )
        if max_pixels is not None and w * h > max_pixels:
            raise ValueError(
                f"image file {path!r} declares {w}x{h} = {w * h} pixels, more than max_pixels="
                f"{max_pixels} (a decompression bomb?); refused before decoding"
            )
        frames = _frame_count(path)
        if frames > 1:
            warnings.warn(f"image file {path!r} holds {frames} frames (a multipage or animated image); frame 0 is "
                          "used", UserWarning, stacklevel=2)
        if im.format in _TORCHCODEC_FORMATS:
            try:
                image = _decode_torchcodec(path)
            except (RuntimeError, ValueError) as exc:  # damaged: no second, more lenient decoder
                raise ValueError(
                    f"{_damaged(path, 'TorchCodec', exc)}; not retried with Pillow, which returns "
                    f"plausible but wrong pixels for some damaged {im.format} files"
                ) from None
        else:
            try:
                im.load()
                image = _pillow_to_tensor(im, path)
            except ValueError as exc:
                if path in str(exc):  # ours, already naming the file
                    raise
                raise ValueError(_damaged(path, "Pillow", exc)) from None
            except Exception as exc:  # noqa: BLE001 - Pillow's decoders: OSError, SyntaxError ...
                raise ValueError(_damaged(path, "Pillow", exc)) from None
    return _shrink(image, max_size)


def _frame_count(path: str) -> int:
    """The frames of an image file (a multipage TIFF, an animated GIF / WebP / AVIF, an MPO), read
    through a handle of its own, so the decoding is not disturbed; 1 when the count cannot be read
    (a damaged file: its decoder then says what is wrong)."""
    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as other:
                return int(getattr(other, "n_frames", 1))
    except Exception:  # noqa: BLE001 - only the warning is at stake
        return 1


def _why(exc: BaseException) -> str:
    """An exception from a decoder as one short line: its type, and its message if any."""
    text = " ".join(str(exc).split())[:300]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _damaged(path: str, decoder: str, error: BaseException) -> str:
    return f"image file {path!r} could not be read as an image (damaged or truncated?): {decoder}: {_why(error)}"


def displayed_size(path: str | os.PathLike) -> tuple[int, int] | None:
    """``(H, W)`` of the image :func:`load_image` would return (before ``max_size``), read from
    the header alone (EXIF orientations 5-8 swap the axes); None when the header cannot be read
    (:func:`load_image` then says why). Lets a caller bound a batch before decoding it."""
    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(os.fspath(path)) as im:
                w, h = im.size
                if im.format == "TIFF":  # Pillow's TIFF size is already the upright one
                    return h, w
                if im.format == "PNG":  # PNG's getexif() decodes the image to find a late eXIf
                    exif = Image.Exif()
                    if im.info.get("exif"):
                        exif.load(im.info["exif"])
                else:
                    exif = im.getexif()
                orientation = exif.get(0x0112, 1)
    except Exception:  # noqa: BLE001 - load_image reports the file's problem
        return None
    return (w, h) if orientation in (5, 6, 7, 8) else (h, w)


def _header_size(path: str) -> tuple[int, int] | None:
    """(width, height) from the header of an image Pillow refused as a bomb: its format plugins
    are asked directly, as ``Image.open`` does, which reads the header and decodes nothing."""
    from PIL import Image

    Image.init()
    with open(path, "rb") as fh:
        prefix = fh.read(16)
        for fmt in Image.ID:
            factory, accept = Image.OPEN[fmt]
            try:
                if accept is not None and not accept(prefix):
                    continue
                fh.seek(0)
                with factory(fh, path) as im:
                    return tuple(im.size)
            except Exception:  # noqa: BLE001 - only a better message is at stake
                continue
    return None


def _decode_torchcodec(path: str) -> Tensor:
    """TorchCodec's ``decode_image`` in RGB at the stored depth (uint8, or uint16 for 16-bit
    PNG), EXIF orientation applied, as float32 ``Tensor[3, H, W]`` in [0, 1]."""
    from torchcodec.decoders import decode_image

    image = decode_image(path, mode="RGB", output_dtype="auto")
    if image.dim() == 4:  # an animated GIF / WebP / AVIF: its first frame, as Pillow gives
        image = image[0]
    scale = 65535.0 if image.dtype == torch.uint16 else 255.0
    return image.to(torch.float32).div_(scale)


def load_images(
    paths: Sequence[str | os.PathLike],
    max_size: int | None = None,
    progress: bool | None = None,
    *,
    max_pixels: int | None = MAX_IMAGE_PIXELS,
) -> list[Tensor]:
    """Reads several images (see :func:`load_image`), with a tqdm progress bar.

    Args:
        paths: image files.
        max_size (int, optional): as in :func:`load_image`.
        progress (bool, optional): show a progress bar; default: when more than 8 paths.
        max_pixels (int, optional): as in :func:`load_image`.

    Returns:
        list of Tensor[3, H_i, W_i], float32 in [0, 1].

    Raises:
        TypeError: ``paths`` is a single path rather than a list; ``progress`` is not a bool or
            None; as :func:`load_image`.
        FileNotFoundError / ValueError: as :func:`load_image`.
    """
    from tqdm.auto import tqdm

    check_paths(paths)
    progress = check_bool(progress, "progress", optional=True)
    if progress is None:
        progress = len(paths) > 8
    return [
        load_image(p, max_size, max_pixels=max_pixels)
        for p in tqdm(paths, desc="loading images", disable=not progress)
    ]


def sample_images(
    names: Sequence[str] = SAMPLE_IMAGES, max_size: int | None = None
) -> list[tuple[str, Tensor]]:
    """scikit-image's shipped sample photos (``skimage.data.<name>()``), no download.

    Args:
        names: sample names (any of :data:`~vispos.app.data._args.SAMPLE_NAMES`), default
            ``astronaut`` (512x512), ``coffee`` (400x600), ``chelsea`` (300x451) and ``rocket`` (427x640).
        max_size (int, optional): as in :func:`load_image`.

    Returns:
        list of ``(name, Tensor[3, H, W])``, float32 in [0, 1].

    Raises:
        ImportError: scikit-image is missing (``pip install vispos[demo]``).
        ValueError: an unknown sample name (the message suggests the nearest).
    """
    try:
        import skimage.data
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the sample photos come from scikit-image: pip install 'vispos[demo]'"
        ) from exc
    from PIL import Image

    for name in names:  # every name before the first photo is read
        problem = unknown_sample(name)
        if problem:
            raise ValueError(problem)
    out = []
    for name in names:
        loader = getattr(skimage.data, name)
        arr = np.asarray(loader())
        out.append((name, _to_tensor(Image.fromarray(arr), max_size)))
    return out


def imagenet_normalize(image: Tensor) -> Tensor:
    """``(image - mean) / std`` with ImageNet's statistics; returns a new tensor.

    Args:
        image (Tensor[3, H, W] or Tensor[B, 3, H, W]): float in [0, 1].

    Raises:
        TypeError: ``image`` is not a floating tensor.
        ValueError: the channel axis does not have 3 entries.
    """
    if not isinstance(image, Tensor) or not image.is_floating_point():
        got = image.dtype if isinstance(image, Tensor) else type(image).__name__
        raise TypeError(f"image must be a floating Tensor[3, H, W] or [B, 3, H, W] in [0, 1], got {got}")
    if image.dim() not in (3, 4) or image.shape[-3] != 3:
        raise ValueError(f"image must have shape (3, H, W) or (B, 3, H, W), got {tuple(image.shape)}")
    mean = torch.tensor(IMAGENET_MEAN, dtype=image.dtype, device=image.device).view(3, 1, 1)
    std = torch.tensor(IMAGENET_STD, dtype=image.dtype, device=image.device).view(3, 1, 1)
    return (image - mean) / std
