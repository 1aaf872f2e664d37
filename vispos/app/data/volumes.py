"""Volumes from NIfTI files or from nilearn's shipped MNI152 template, as float tensors ready to batch.

Nothing is downloaded: the sample volume is the MNI152 T1 template nilearn installs with
itself; user volumes are NIfTI files read by nibabel (``pip install 'vispos[medical]'``),
checked from the header before any voxel is read.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from ... import _deprecation
from ..._checks import check_bool, check_choice, check_file, check_int, check_number
from ._args import VOLUME_NORMALIZATIONS, check_paths, shrunk_size

__all__ = [
    "MAX_VOLUME_VOXELS",
    "VOLUME_NORMALIZATIONS",
    "normalize_intensity",
    "resize_volume",
    "load_volume",
    "load_volumes",
    "mni152_template",
    "sample_volumes",
]


def _check_volume(volume: object) -> None:
    """``volume`` must be a ``Tensor[C, D, H, W]`` (TypeError for another type, ValueError for another rank)."""
    if not isinstance(volume, Tensor):
        raise TypeError(f"volume must be a Tensor[C, D, H, W], got {type(volume).__name__}")
    if volume.dim() != 4:
        raise ValueError(f"volume must be a Tensor[C, D, H, W], got shape {tuple(volume.shape)}")


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

    The statistics cannot overflow: each channel is first divided by its largest finite
    magnitude (so the sums, the spread ``max - min`` and the squares stay within ``[-4, 4]``), and
    the result is the same affine map written in those units. Finite voxels therefore give finite
    results, however extreme (values near float32's limit of 3.4e38 included). Non-finite voxels
    are left out of the statistics and stay non-finite (:func:`load_volume` replaces them by 0
    first). float64 volumes are normalised in float64, then rounded to float32.

    Args:
        volume (Tensor[C, D, H, W]): any real dtype.
        method (str | None): one of :data:`VOLUME_NORMALIZATIONS`.
        nonzero (bool): take statistics over nonzero voxels only (all voxels if none is nonzero).
        percentiles (tuple of float): for ``"percentile"``, in ``[0, 100]``, low < high.

    Returns:
        Tensor[C, D, H, W], float32: finite wherever ``volume`` is finite (``"zscore"``,
        ``"minmax"``, ``"percentile"``; ``None`` rounds float64 beyond float32's range to inf).

    Raises:
        TypeError: ``method`` is neither a str nor None; ``volume`` is not a tensor.
        ValueError: an unknown ``method``; a volume that is not ``(C, D, H, W)``; bad percentiles.

    References:
        Isensee et al., nnU-Net, Nature Methods 2021 (foreground z-score for MRI).
    """
    method = check_choice(method, VOLUME_NORMALIZATIONS, "method")
    _check_volume(volume)
    lo_p, hi_p = percentiles
    if not 0 <= lo_p < hi_p <= 100:
        raise ValueError(f"percentiles must satisfy 0 <= low < high <= 100, got {percentiles!r}")
    work = torch.float64 if volume.dtype == torch.float64 else torch.float32
    out = volume.detach().to(work, copy=True)
    if method is None:
        return out.to(torch.float32)
    for c in range(out.shape[0]):
        _normalize_channel(out[c], method, nonzero, lo_p / 100, hi_p / 100)
    return out.to(torch.float32)


def _normalize_channel(chan: Tensor, method: str, nonzero: bool, lo_q: float, hi_q: float) -> None:
    """Normalises one channel in place, in units of its largest finite magnitude (no overflow)."""
    finite = torch.isfinite(chan)
    use = finite & (chan != 0) if nonzero and bool((finite & (chan != 0)).any()) else finite
    fg = chan[use]
    if fg.numel() == 0:  # nothing finite to take statistics from
        return
    unit = float(fg.abs().max()) if method != "minmax" else float(chan[finite].abs().max())
    if unit > 0:
        chan.div_(unit)  # every finite voxel now in [-1, 1]
        fg = fg / unit
    if method == "zscore":
        std = float(fg.std()) if fg.numel() > 1 else 0.0
        chan.sub_(float(fg.mean())).div_(std if std > 0 else 1.0)
        return
    if method == "percentile":
        sample = fg.double()[:: max(1, fg.numel() // 1_000_000)]  # quantile's size limit
        q = torch.quantile(sample, torch.tensor([lo_q, hi_q], dtype=torch.float64))
        lo, hi = float(q[0]), float(q[1])
        chan.clamp_(lo, hi)
    else:
        values = chan[finite]
        lo, hi = float(values.min()), float(values.max())
    chan.sub_(lo).div_(hi - lo if hi > lo else 1.0).clamp_(0.0, 1.0)


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
        TypeError: ``volume`` is not a tensor; a non-int ``max_size`` or non-number ``scale``.
        ValueError: both or a non-positive ``max_size`` / ``scale`` (or a non-finite
            ``scale``); a ``scale`` giving more than :data:`MAX_VOLUME_VOXELS` voxels (checked
            before anything is allocated); a volume that is not 4-D.
    """
    _check_volume(volume)
    if max_size is not None and scale is not None:
        raise ValueError("give max_size or scale, not both")
    if max_size is not None:
        max_size = check_int(max_size, "max_size", minimum=1)
        size = list(shrunk_size(volume.shape[1:], max_size))
        if size == list(volume.shape[1:]):
            return volume.clone()
    elif scale is None:
        return volume.clone()
    else:
        scale = check_number(scale, "scale", positive=True)
        size = [max(1, round(s * scale)) for s in volume.shape[1:]]
        voxels = volume.shape[0] * math.prod(size)
        if voxels > MAX_VOLUME_VOXELS:
            raise ValueError(
                f"scale={scale!r} would resize the volume {tuple(volume.shape)} to "
                f"{(volume.shape[0], *size)} = {voxels} voxels, more than MAX_VOLUME_VOXELS="
                f"{MAX_VOLUME_VOXELS}"
            )
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
    import nibabel as nib

    if not isinstance(img, nib.Nifti1Pair):  # NIfTI-1 / NIfTI-2, single files and pairs
        raise ValueError(
            f"volume file {path!r} is {type(img).__name__.replace('Image', '')}, not NIfTI; "
            "load_volume reads NIfTI-1 / NIfTI-2 (.nii, .nii.gz, .hdr/.img pairs): convert it with "
            "nibabel, nib.save(nib.Nifti1Image(img.get_fdata(), img.affine), 'volume.nii.gz')"
        )
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
        single_file = isinstance(img, nib.Nifti1Image)  # a .hdr/.img pair's voxels start at 0
        if single_file and os.path.samefile(data_file, path) and offset < header_bytes:
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


def volume_shape(path: str | os.PathLike, canonical: bool = True) -> tuple[int, ...] | None:
    """``(C, D, H, W)`` of the volume :func:`load_volume` would return (before ``max_size``),
    read from the header alone (the RAS+ reorientation permutes the axes); None when the header
    cannot be read or is refused (:func:`load_volume` then says why). Lets a caller bound a batch
    before reading it."""
    try:
        import nibabel as nib

        img = nib.load(os.fspath(path))
        _check_nifti_header(img, os.fspath(path), MAX_VOLUME_VOXELS)  # what load_volume refuses
        shape = tuple(int(n) for n in img.shape)
        spatial = list(shape[:3])
        if canonical:
            for axis, (target, _) in enumerate(nib.io_orientation(img.affine)):
                spatial[int(target)] = shape[axis]
    except Exception:  # noqa: BLE001 - load_volume reports the file's problem
        return None
    return (shape[3] if len(shape) == 4 else 1, *spatial)


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


@_deprecation.renamed_kwargs(normalize="intensity")
def load_volume(
    path: str | os.PathLike,
    intensity: str | None = "zscore",
    max_size: int | None = None,
    canonical: bool = True,
    *,
    max_voxels: int | None = MAX_VOLUME_VOXELS,
) -> Tensor:
    """Reads a NIfTI volume (``.nii`` / ``.nii.gz`` / ``.hdr`` + ``.img``) with nibabel.

    The volume is reoriented to the closest canonical (RAS+) orientation, so the tensor axes
    ``(D, H, W)`` are (left->Right, posterior->Anterior, inferior->Superior); a 4-D file's last
    axis becomes the channels. Non-finite voxels become 0.

    Args:
        path (str | PathLike): a NIfTI-1 or NIfTI-2 file: ``.nii``, ``.nii.gz``, or either file
            of a ``.hdr`` / ``.img`` pair. Other formats nibabel reads (MGH, Analyze, MINC,
            PAR/REC) are refused with a hint to convert them.
        intensity (str | None): how intensities are normalised: ``"zscore"``, ``"minmax"``,
            ``"percentile"`` or None (see :func:`normalize_intensity`). Default ``"zscore"``.
            (Formerly ``normalize``, which still works with a ``DeprecationWarning``: vispos'
            ``normalize`` is DETR's bool.)
        max_size (int, optional): shrink (trilinear) so the longest axis is at most this.
        canonical (bool): reorient to RAS+. Default True.
        max_voxels (int, optional): refuse a file whose header declares more voxels (all
            channels together); default :data:`MAX_VOLUME_VOXELS`, None lifts the limit.

    Returns:
        Tensor[C, D, H, W], float32 (``C = 1`` for a 3-D file); finite with every
        ``intensity`` (the statistics cannot overflow, see :func:`normalize_intensity`).

    Raises:
        FileNotFoundError: no such file.
        IsADirectoryError: ``path`` is a directory.
        TypeError: an ``intensity`` that is not a str or None; a non-int ``max_size`` /
            ``max_voxels``; a non-bool ``canonical``.
        ValueError: not a NIfTI volume (also a truncated or corrupt file); not 3-D / 4-D
            or an empty axis; voxels that are not real scalars (RGB24, RGBA32, complex); more
            than ``max_voxels`` voxels; an uncompressed file shorter than its header says. These
            are checked on the header, before any voxel is read, and every message names the
            file. An unknown ``intensity``; a non-positive ``max_size`` / ``max_voxels``.
        ImportError: nibabel is missing (``pip install 'vispos[medical]'``).

    References:
        nibabel (Brett et al.), ``nibabel.load``, ``as_closest_canonical``.
    """
    try:
        import nibabel as nib
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("NIfTI volumes are read with nibabel: pip install 'vispos[medical]'") from exc
    path = check_file(path, "volume file", "a NIfTI file")
    max_voxels = check_int(max_voxels, "max_voxels", minimum=1, optional=True)
    max_size = check_int(max_size, "max_size", minimum=1, optional=True)
    canonical = check_bool(canonical, "canonical")
    intensity = check_choice(intensity, VOLUME_NORMALIZATIONS, "intensity")
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
    return normalize_intensity(vol, intensity)


@_deprecation.renamed_kwargs(normalize="intensity")
def load_volumes(
    paths: Sequence[str | os.PathLike],
    intensity: str | None = "zscore",
    max_size: int | None = None,
    progress: bool | None = None,
    *,
    max_voxels: int | None = MAX_VOLUME_VOXELS,
) -> list[Tensor]:
    """Reads several NIfTI volumes (see :func:`load_volume`) with a tqdm progress bar.

    Args:
        paths: the files.
        intensity, max_size, max_voxels: as in :func:`load_volume`.
        progress (bool, optional): show a progress bar; default: when more than 4 paths.

    Returns:
        list of Tensor[C, D_i, H_i, W_i], float32.

    Raises:
        TypeError: ``paths`` is a single path rather than a list; ``progress`` is not a bool or
            None; as :func:`load_volume`.
        FileNotFoundError / ValueError / ImportError: as :func:`load_volume`.
    """
    from tqdm.auto import tqdm

    check_paths(paths)
    progress = check_bool(progress, "progress", optional=True)
    if progress is None:
        progress = len(paths) > 4
    return [
        load_volume(p, intensity, max_size, max_voxels=max_voxels)
        for p in tqdm(paths, desc="loading volumes", disable=not progress)
    ]


@_deprecation.renamed_kwargs(normalize="intensity")
def mni152_template(
    resolution: int | None = None, intensity: str | None = "zscore", max_size: int | None = None
) -> Tensor:
    """nilearn's MNI152 T1 template (2009 nonlinear asymmetric, skull-stripped), shipped inside
    nilearn: no download.

    Args:
        resolution (int, optional): voxel size in mm passed to
            ``nilearn.datasets.load_mni152_template`` (default 1 mm: 197 x 233 x 189).
        intensity, max_size: as in :func:`load_volume`.

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
    return normalize_intensity(vol, intensity)


@_deprecation.renamed_kwargs(normalize="intensity")
def sample_volumes(max_size: int = 64, intensity: str | None = "zscore") -> list[tuple[str, Tensor]]:
    """Three volumes of different shapes cut from the MNI152 template, for ``vispos demo --volume``.

    ``mni152``: the whole template shrunk so its longest axis is ``max_size``;
    ``mni152_coarse``: the whole template at 3/4 of that size (a coarser scan);
    ``mni152_superior``: the superior 55% of the brain (a partial field of view) at the first
    one's voxel size.

    Args:
        max_size (int): longest axis of the first volume. Default 64.
        intensity (str | None): see :func:`normalize_intensity`.

    Returns:
        list of ``(name, Tensor[1, D, H, W])``, float32.

    Raises:
        TypeError: ``max_size`` is not an int.
        ValueError: ``max_size`` < 8 or > 256 (the template's longest axis is 233 voxels at 1 mm:
            larger sizes would only interpolate it, and ``max_size=4096`` asked for tens of GB).
    """
    max_size = check_int(max_size, "max_size", minimum=8)
    if max_size > 256:
        raise ValueError(f"max_size must be from 8 to 256 (the template's longest axis is 233), got {max_size}")
    full = mni152_template(intensity=None)
    scale = max_size / max(full.shape[1:])
    depth = full.shape[-1]
    crop = full[..., int(round(0.45 * depth)):]
    vols = [
        ("mni152", resize_volume(full, scale=scale)),
        ("mni152_coarse", resize_volume(full, scale=0.75 * scale)),
        ("mni152_superior", resize_volume(crop, scale=scale)),
    ]
    return [(name, normalize_intensity(v, intensity)) for name, v in vols]
