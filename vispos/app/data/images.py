"""Images and volumes from files or from shipped samples, as tensors ready to batch.

Nothing is downloaded: the sample photos are the ones scikit-image installs with itself, the
sample volume is the MNI152 T1 template nilearn installs with itself; user volumes are NIfTI files
read by nibabel (``pip install 'vispos[medical]'``).
"""

from __future__ import annotations

import contextlib
import math
import os
import warnings
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "MAX_IMAGE_PIXELS",
    "MAX_VOLUME_VOXELS",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "SAMPLE_IMAGES",
    "imagenet_normalize",
    "load_image",
    "load_images",
    "sample_images",
    "VOLUME_NORMALIZATIONS",
    "normalize_intensity",
    "resize_volume",
    "load_volume",
    "load_volumes",
    "mni152_template",
    "sample_volumes",
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

#: scikit-image sample photos used by ``vispos demo``: (name, height x width)
SAMPLE_IMAGES = ("astronaut", "coffee", "chelsea", "rocket")


#: the most pixels :func:`load_image` decodes by default (Pillow's own decompression-bomb
#: warning threshold); a larger image is refused from its header, before anything is allocated
MAX_IMAGE_PIXELS = 89_478_485

#: formats torchvision.io.decode_image reads (8 and 16 bit, EXIF orientation); others go to Pillow
_TORCHVISION_FORMATS = frozenset({"PNG", "JPEG", "GIF", "WEBP"})


def _check_max_size(max_size: object) -> None:
    if max_size is not None and (isinstance(max_size, bool) or not isinstance(max_size, int) or max_size <= 0):
        raise ValueError(f"max_size must be a positive int or None, got {max_size!r}")


def _shrink(image: Tensor, max_size: int | None) -> Tensor:
    """Bilinear, antialiased shrink of a float ``Tensor[3, H, W]`` so its longest side is at
    most ``max_size`` (never enlarged)."""
    from torchvision.transforms.v2 import InterpolationMode
    from torchvision.transforms.v2.functional import resize

    _check_max_size(max_size)
    h, w = image.shape[-2:]
    if max_size is None or max(h, w) <= max_size:
        return image
    ratio = max_size / max(h, w)
    size = [max(1, round(h * ratio)), max(1, round(w * ratio))]
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


def _check_paths(paths: object) -> None:
    """``paths`` must be a list/tuple of paths (a single str would be read letter by letter)."""
    if isinstance(paths, (str, bytes, os.PathLike)) or not isinstance(paths, Sequence):
        raise TypeError(f"paths must be a list or tuple of file paths, got {type(paths).__name__} {paths!r:.80}")


def load_image(
    path: str | os.PathLike, max_size: int | None = None, *, max_pixels: int | None = MAX_IMAGE_PIXELS
) -> Tensor:
    """Reads an image file at its stored depth, upright, as float RGB in [0, 1].

    The header is read first (Pillow, lazily): an image larger than ``max_pixels`` is refused
    before any pixel is decoded. PNG, JPEG, GIF and WebP are then decoded by
    ``torchvision.io.decode_image`` (8- and 16-bit, EXIF orientation applied); other formats
    (TIFF, BMP, ...) by Pillow, with ``ImageOps.exif_transpose``. Integers are divided by their
    type's maximum (255 for 8 bits, 65535 for 16 bits); 32-bit float images (TIFF mode ``F``) are
    taken as stored, expected in [0, 1] (clipped with a warning otherwise). Grey images are
    repeated to three channels; an alpha channel is dropped.

    Args:
        path (str | PathLike): any format Pillow identifies.
        max_size (int, optional): shrink (bilinear, antialiased) so the longest side is at most this.
        max_pixels (int, optional): refuse larger images (default :data:`MAX_IMAGE_PIXELS`);
            None lifts the limit (Pillow still refuses more than twice its own
            ``Image.MAX_IMAGE_PIXELS``).

    Returns:
        Tensor[3, H, W], float32 in [0, 1]; ``H, W`` as the image is displayed (after EXIF
        rotation).

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file is not an image Pillow can read; it has more than ``max_pixels``
            pixels (the message names the file, its size and the limit); integers above 16 bits
            or non-finite floats; bad ``max_size`` / ``max_pixels``.

    References:
        torchvision ``torchvision.io.decode_image``; Pillow ``Image.open``,
        ``ImageOps.exif_transpose``; EXIF 2.3 tag 0x0112 (Orientation).
    """
    from PIL import Image, UnidentifiedImageError

    _check_max_size(max_size)
    if max_pixels is not None and (isinstance(max_pixels, bool) or not isinstance(max_pixels, int) or max_pixels <= 0):
        raise ValueError(f"max_pixels must be a positive int or None, got {max_pixels!r}")
    path = os.fspath(path)
    if os.path.isdir(path):
        raise IsADirectoryError(f"image file {path!r} is a directory, not an image file")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"image file {path!r} does not exist")
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
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise ValueError(f"image file {path!r} could not be read as an image: {exc}") from None
    with im:
        w, h = im.size
        if max_pixels is not None and w * h > max_pixels:
            raise ValueError(
                f"image file {path!r} declares {w}x{h} = {w * h} pixels, more than max_pixels="
                f"{max_pixels} (a decompression bomb?); refused before decoding"
            )
        try:
            image = None
            if im.format in _TORCHVISION_FORMATS:
                with contextlib.suppress(RuntimeError):  # a variant torchvision does not decode
                    image = _decode_torchvision(path)
            if image is None:
                im.load()
                image = _pillow_to_tensor(im, path)
        except (UnidentifiedImageError, OSError, SyntaxError, RuntimeError, Image.DecompressionBombError) as exc:
            raise ValueError(f"image file {path!r} could not be read as an image: {exc}") from None
    return _shrink(image, max_size)


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


def _decode_torchvision(path: str) -> Tensor:
    """``decode_image`` in RGB at the stored depth (uint8 or uint16), EXIF applied, as float."""
    from torchvision.io import ImageReadMode, decode_image, read_file
    from torchvision.transforms.v2.functional import to_dtype

    data = decode_image(read_file(path), mode=ImageReadMode.RGB, apply_exif_orientation=True)
    if data.dim() == 4:  # an animated GIF: its first frame, as Pillow gives
        data = data[0]
    return to_dtype(data, torch.float32, scale=True)


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
        TypeError: ``paths`` is a single path rather than a list.
        FileNotFoundError / ValueError: as :func:`load_image`.
    """
    from tqdm.auto import tqdm

    _check_paths(paths)
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


# ------------------------------------------------------------------------------------ volumes
#: intensity normalisations :func:`normalize_intensity` knows (None: leave intensities as read)
VOLUME_NORMALIZATIONS = ("zscore", "minmax", "percentile", None)


def normalize_intensity(
    volume: Tensor,
    method: str | None = "zscore",
    *,
    nonzero: bool = True,
    percentiles: tuple[float, float] = (0.5, 99.5),
) -> Tensor:
    """Normalises a volume's intensities per channel; returns a new float32 tensor.

    ``"zscore"``: ``(v - mean) / std`` with the statistics of the foreground (nonzero voxels when
    ``nonzero``, as nnU-Net does for MRI), applied to every voxel. ``"minmax"``: to ``[0, 1]``.
    ``"percentile"``: clipped to the given percentiles of the foreground, then to ``[0, 1]``.
    ``None``: a float32 copy.

    Args:
        volume (Tensor[C, D, H, W]): any real dtype.
        method (str | None): one of :data:`VOLUME_NORMALIZATIONS`.
        nonzero (bool): take statistics over nonzero voxels only (all voxels if none is nonzero).
        percentiles (tuple of float): for ``"percentile"``, in ``[0, 100]``, low < high.

    Returns:
        Tensor[C, D, H, W], float32.

    Raises:
        ValueError: an unknown ``method``; a volume that is not ``(C, D, H, W)``; bad percentiles.

    References:
        Isensee et al., nnU-Net, Nature Methods 2021 (foreground z-score for MRI).
    """
    if method not in VOLUME_NORMALIZATIONS:
        raise ValueError(f"normalize must be one of {VOLUME_NORMALIZATIONS}, got {method!r}")
    if not isinstance(volume, Tensor) or volume.dim() != 4:
        got = tuple(volume.shape) if isinstance(volume, Tensor) else type(volume).__name__
        raise ValueError(f"volume must be a Tensor[C, D, H, W], got {got}")
    lo_p, hi_p = percentiles
    if not 0 <= lo_p < hi_p <= 100:
        raise ValueError(f"percentiles must satisfy 0 <= low < high <= 100, got {percentiles!r}")
    out = volume.detach().to(torch.float32).clone()
    if method is None:
        return out
    for c in range(out.shape[0]):
        chan = out[c]
        fg = chan[chan != 0] if nonzero and bool((chan != 0).any()) else chan.flatten()
        if method == "zscore":
            std = float(fg.std()) if fg.numel() > 1 else 0.0
            chan.sub_(float(fg.mean())).div_(std if std > 0 else 1.0)
        else:
            if method == "percentile":
                sample = fg.double()[:: max(1, fg.numel() // 1_000_000)]  # quantile's size limit
                q = torch.quantile(sample, torch.tensor([lo_p / 100, hi_p / 100], dtype=torch.float64))
                lo, hi = float(q[0]), float(q[1])
                chan.clamp_(lo, hi)
            else:
                lo, hi = float(chan.min()), float(chan.max())
            chan.sub_(lo).div_(hi - lo if hi > lo else 1.0).clamp_(0.0, 1.0)
    return out


def resize_volume(volume: Tensor, max_size: int | None = None, scale: float | None = None) -> Tensor:
    """Resizes a volume (trilinear) so its longest axis is at most ``max_size``, or by ``scale``.

    Never enlarges with ``max_size``; returns a new tensor (the input itself is not modified).

    Args:
        volume (Tensor[C, D, H, W]): floating.
        max_size (int, optional): longest axis after resizing.
        scale (float, optional): factor for every axis (instead of ``max_size``).

    Returns:
        Tensor[C, D', H', W'], ``volume``'s dtype.

    Raises:
        ValueError: both or a non-positive ``max_size`` / ``scale``; a volume that is not 4-D.
    """
    if volume.dim() != 4:
        raise ValueError(f"volume must be a Tensor[C, D, H, W], got shape {tuple(volume.shape)}")
    if max_size is not None and scale is not None:
        raise ValueError("give max_size or scale, not both")
    if max_size is not None:
        if isinstance(max_size, bool) or not isinstance(max_size, int) or max_size <= 0:
            raise ValueError(f"max_size must be a positive int or None, got {max_size!r}")
        longest = max(volume.shape[1:])
        if longest <= max_size:
            return volume.clone()
        scale = max_size / longest
    if scale is None:
        return volume.clone()
    if not scale > 0:
        raise ValueError(f"scale must be > 0, got {scale!r}")
    size = [max(1, round(s * scale)) for s in volume.shape[1:]]
    return torch.nn.functional.interpolate(
        volume[None], size=size, mode="trilinear", align_corners=False
    )[0]


#: the most voxels (all channels together) :func:`load_volume` reads by default: 2**28, 1 GiB
#: as float32 (a 512^3 CT scan has 2**27)
MAX_VOLUME_VOXELS = 2**28


def _why(exc: BaseException) -> str:
    """An exception from a reader as one short line: its type, and its message if any."""
    text = " ".join(str(exc).split())[:300]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _check_nifti_header(img, path: str, max_voxels: int | None) -> None:
    """Refuses, from the header alone, what cannot become a float32 ``Tensor[C, D, H, W]``."""
    shape = tuple(int(n) for n in img.shape)
    dtype = img.get_data_dtype()
    if len(shape) not in (3, 4):
        raise ValueError(f"volume file {path!r} must be 3-D or 4-D, got shape {shape} (from its header)")
    if 0 in shape:
        raise ValueError(f"volume file {path!r} has an empty axis: its header says shape {shape}")
    if dtype.fields is not None or dtype.kind not in "biuf":
        try:
            name = img.header._data_type_codes.label[int(img.header["datatype"])]
        except (AttributeError, KeyError, TypeError, ValueError):
            name = str(dtype)
        raise ValueError(
            f"volume file {path!r} stores {name} voxels ({dtype}); vispos reads real scalar voxels "
            "(int, uint or float); split colour or complex volumes into real channels first"
        )
    voxels = math.prod(shape)
    if max_voxels is not None and voxels > max_voxels:
        raise ValueError(
            f"volume file {path!r} declares shape {shape} = {voxels} voxels, more than "
            f"max_voxels={max_voxels}; refused before reading"
        )
    data_file = img.file_map["image"].filename if "image" in img.file_map else None
    if data_file and os.path.isfile(data_file) and not data_file.endswith((".gz", ".bz2", ".zst")):
        offset = int(getattr(img.dataobj, "offset", 0))
        header_bytes = int(getattr(img.header, "sizeof_hdr", 0))
        if os.path.samefile(data_file, path) and offset < header_bytes:
            raise ValueError(
                f"volume file {path!r} is corrupt: its voxels would start at byte {offset}, inside "
                f"its {header_bytes}-byte header (vox_offset)"
            )
        needed = offset + voxels * dtype.itemsize
        found = os.path.getsize(data_file)
        if found < needed:
            raise ValueError(
                f"volume file {path!r} is truncated: its header declares shape {shape} of {dtype} "
                f"({needed} bytes with the header) but {data_file!r} has {found} bytes"
            )


def _nifti_to_tensor(img, source: str, canonical: bool) -> Tensor:
    import nibabel as nib

    if canonical:
        img = nib.as_closest_canonical(img)
    data = np.asarray(img.get_fdata(dtype=np.float32))
    if data.ndim == 3:
        data = data[None]
    elif data.ndim == 4:
        data = np.moveaxis(data, -1, 0)  # (X, Y, Z, T) -> channels first
    else:
        raise ValueError(f"volume {source!r} must be 3-D or 4-D, got shape {data.shape}")
    if not np.isfinite(data).all():
        data = np.nan_to_num(data, nan=0.0, posinf=0.0, neginf=0.0)
    return torch.from_numpy(np.ascontiguousarray(data))


def load_volume(
    path: str | os.PathLike,
    normalize: str | None = "zscore",
    max_size: int | None = None,
    canonical: bool = True,
    *,
    max_voxels: int | None = MAX_VOLUME_VOXELS,
) -> Tensor:
    """Reads a NIfTI volume (``.nii`` / ``.nii.gz``) with nibabel.

    The volume is reoriented to the closest canonical (RAS+) orientation, so the tensor axes
    ``(D, H, W)`` are (left->Right, posterior->Anterior, inferior->Superior); a 4-D file's last
    axis becomes the channels. Non-finite voxels become 0.

    Args:
        path (str | PathLike): the file.
        normalize (str | None): see :func:`normalize_intensity`. Default ``"zscore"``.
        max_size (int, optional): shrink (trilinear) so the longest axis is at most this.
        canonical (bool): reorient to RAS+. Default True.
        max_voxels (int, optional): refuse a file whose header declares more voxels (all
            channels together); default :data:`MAX_VOLUME_VOXELS`, None lifts the limit.

    Returns:
        Tensor[C, D, H, W], float32 (``C = 1`` for a 3-D file).

    Raises:
        FileNotFoundError: no such file.
        ValueError: not a volume nibabel reads (also a truncated or corrupt file); not 3-D / 4-D
            or an empty axis; voxels that are not real scalars (RGB24, RGBA32, complex); more
            than ``max_voxels`` voxels; an uncompressed file shorter than its header says. These
            are checked on the header, before any voxel is read, and every message names the
            file. Bad ``normalize`` / ``max_size`` / ``max_voxels``.
        ImportError: nibabel is missing (``pip install 'vispos[medical]'``).

    References:
        nibabel (Brett et al.), ``nibabel.load``, ``as_closest_canonical``.
    """
    try:
        import nibabel as nib
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("NIfTI volumes are read with nibabel: pip install 'vispos[medical]'") from exc
    path = os.fspath(path)
    if os.path.isdir(path):
        raise IsADirectoryError(f"volume file {path!r} is a directory, not a NIfTI file")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"volume file {path!r} does not exist")
    if max_voxels is not None and (isinstance(max_voxels, bool) or not isinstance(max_voxels, int) or max_voxels <= 0):
        raise ValueError(f"max_voxels must be a positive int or None, got {max_voxels!r}")
    _check_max_size(max_size)
    if normalize not in VOLUME_NORMALIZATIONS:
        raise ValueError(f"normalize must be one of {VOLUME_NORMALIZATIONS}, got {normalize!r}")
    # a forged or corrupt file can make nibabel / numpy raise almost anything (HeaderDataError,
    # LinAlgError, DTypePromotionError, zlib.error, EOFError ...): each becomes a ValueError
    # naming the file. MemoryError cannot happen: the size is checked on the header first.
    try:
        img = nib.load(path)  # the header only: the voxels are read lazily
    except Exception as exc:  # noqa: BLE001 - see above
        raise ValueError(f"volume file {path!r} could not be read as a NIfTI volume: {_why(exc)}") from None
    _check_nifti_header(img, path, max_voxels)
    try:
        # a truncated or corrupt file fails here, not in nib.load
        vol = _nifti_to_tensor(img, path, canonical)
    except ValueError as exc:
        if path in str(exc):
            raise
        raise ValueError(f"volume file {path!r} could not be read as a NIfTI volume: {_why(exc)}") from None
    except Exception as exc:  # noqa: BLE001 - see above
        raise ValueError(f"volume file {path!r} could not be read as a NIfTI volume: {_why(exc)}") from None
    vol = resize_volume(vol, max_size) if max_size is not None else vol
    return normalize_intensity(vol, normalize)


def load_volumes(
    paths: Sequence[str | os.PathLike],
    normalize: str | None = "zscore",
    max_size: int | None = None,
    progress: bool | None = None,
    *,
    max_voxels: int | None = MAX_VOLUME_VOXELS,
) -> list[Tensor]:
    """Reads several NIfTI volumes (see :func:`load_volume`) with a tqdm progress bar.

    Args:
        paths: the files.
        normalize, max_size, max_voxels: as in :func:`load_volume`.
        progress (bool, optional): show a progress bar; default: when more than 4 paths.

    Returns:
        list of Tensor[C, D_i, H_i, W_i], float32.

    Raises:
        TypeError: ``paths`` is a single path rather than a list.
        FileNotFoundError / ValueError / ImportError: as :func:`load_volume`.
    """
    from tqdm.auto import tqdm

    _check_paths(paths)
    if progress is None:
        progress = len(paths) > 4
    return [
        load_volume(p, normalize, max_size, max_voxels=max_voxels)
        for p in tqdm(paths, desc="loading volumes", disable=not progress)
    ]


def mni152_template(
    resolution: int | None = None, normalize: str | None = "zscore", max_size: int | None = None
) -> Tensor:
    """nilearn's MNI152 T1 template (2009 nonlinear asymmetric, skull-stripped), shipped inside
    nilearn: no download.

    Args:
        resolution (int, optional): voxel size in mm passed to
            ``nilearn.datasets.load_mni152_template`` (default 1 mm: 197 x 233 x 189).
        normalize, max_size: as in :func:`load_volume`.

    Returns:
        Tensor[1, D, H, W], float32, RAS+ axes.

    Raises:
        ImportError: nilearn is missing (``pip install 'vispos[medical]'``).

    References:
        Fonov et al., Unbiased average age-appropriate atlases for pediatric studies, NeuroImage
        2011 (MNI152 2009); Abraham et al., nilearn, Front. Neuroinform. 2014.
    """
    try:
        from nilearn.datasets import load_mni152_template
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("the MNI152 template comes with nilearn: pip install 'vispos[medical]'") from exc
    vol = _nifti_to_tensor(load_mni152_template(resolution=resolution), "MNI152", canonical=True)
    vol = resize_volume(vol, max_size) if max_size is not None else vol
    return normalize_intensity(vol, normalize)


def sample_volumes(max_size: int = 64, normalize: str | None = "zscore") -> list[tuple[str, Tensor]]:
    """Three volumes of different shapes cut from the MNI152 template, for ``vispos demo --volume``.

    ``mni152``: the whole template shrunk so its longest axis is ``max_size``;
    ``mni152_coarse``: the whole template at 3/4 of that size (a coarser scan);
    ``mni152_superior``: the superior 55% of the brain (a partial field of view) at the first
    one's voxel size.

    Args:
        max_size (int): longest axis of the first volume. Default 64.
        normalize (str | None): see :func:`normalize_intensity`.

    Returns:
        list of ``(name, Tensor[1, D, H, W])``, float32.

    Raises:
        ValueError: ``max_size`` < 8.
    """
    if isinstance(max_size, bool) or not isinstance(max_size, int) or max_size < 8:
        raise ValueError(f"max_size must be an int >= 8, got {max_size!r}")
    full = mni152_template(normalize=None)
    scale = max_size / max(full.shape[1:])
    depth = full.shape[-1]
    crop = full[..., int(round(0.45 * depth)):]
    vols = [
        ("mni152", resize_volume(full, scale=scale)),
        ("mni152_coarse", resize_volume(full, scale=0.75 * scale)),
        ("mni152_superior", resize_volume(crop, scale=scale)),
    ]
    return [(name, normalize_intensity(v, normalize)) for name, v in vols]
