"""MONAI dict batches as :class:`~vispos.NestedTensor`: a padding mask rebuilt from MONAI's records.

MONAI pads volumes of different sizes (``SpatialPad``, ``DivisiblePad``, ``BorderPad``,
``ResizeWithPadOrCrop``, ``PadListDataCollate``) and records only the pad widths, in each
``MetaTensor``'s ``applied_operations``; no mask reaches the model. Here the records are replayed
(:func:`recorded_padding_mask`) and :class:`NestedPadCollate` pads a list of MONAI dict samples into
one batch whose image key(s) are a ``NestedTensor`` with ``mask`` True wherever a cell is padding:
padding added by the collate itself (at the end of every axis by default) and padding that MONAI
transforms added earlier (symmetric, anywhere). :func:`decollate_nested_batch` is the inverse.

References:
    MONAI ``monai/transforms/croppad/batch.py`` (``PadListDataCollate``), ``monai/data/utils.py``
    (``list_data_collate``, ``decollate_batch``); Carion et al., DETR, ECCV 2020 (mask True = padding).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from monai.data import MetaTensor, decollate_batch, list_data_collate
from monai.transforms import SpatialCrop, SpatialPad
from monai.transforms.inverse import InvertibleTransform
from monai.utils import TraceKeys
from torch import Tensor

from .._checks import check_choice, check_int, is_int
from ..nested_tensor import NestedTensor
from ..padding import Padding

__all__ = ["NestedPadCollate", "decollate_nested_batch", "recorded_padding_mask"]

_METHODS = ("end", "symmetric")
_FLIPS = ("Flip",)
_ROTATIONS = ("Rotate90",)


# ------------------------------------------------------------------------- replaying the records
def _pad(valid: Tensor | None, padded: Sequence[Sequence[int]], before: Sequence[int]) -> Tensor | None:
    """``valid`` after a pad of ``padded`` widths (MONAI's ``((0, 0), (b0, a0), ...)``)."""
    widths = [tuple(int(w) for w in pair) for pair in list(padded)[-len(before):]]
    if valid is None:
        if not any(b or a for b, a in widths):
            return None
        valid = torch.ones(tuple(before), dtype=torch.bool)
    out = torch.zeros(tuple(s + b + a for s, (b, a) in zip(valid.shape, widths)), dtype=torch.bool)
    out[tuple(slice(b, b + s) for s, (b, _) in zip(valid.shape, widths))] = valid
    return out


def _crop(valid: Tensor | None, cropped: Sequence[int]) -> Tensor | None:
    """``valid`` after a crop of ``cropped`` widths (MONAI's ``[b0, a0, b1, a1, ...]``)."""
    if valid is None:
        return None
    c = [int(v) for v in cropped]
    return valid[tuple(slice(c[2 * i], s - c[2 * i + 1]) for i, s in enumerate(valid.shape))]


def _replay(op: Mapping, valid: Tensor | None, where: str) -> Tensor | None:
    """The valid cells after one recorded operation (``None``: every cell valid)."""
    if not op.get(TraceKeys.DO_TRANSFORM, True):
        return valid
    info = op.get(TraceKeys.EXTRA_INFO) or {}
    if TraceKeys.CLASS_NAME in info:  # a wrapper recording the transform it ran (RandFlip -> Flip)
        return _replay(info, valid, where)
    before = tuple(int(s) for s in op.get(TraceKeys.ORIG_SIZE, ()))
    handled = False
    if "cropped" in info:  # SpatialCrop, CenterSpatialCrop, RandSpatialCrop, CropForeground ...
        valid, handled = _crop(valid, info["cropped"]), True
    if isinstance(info.get("crop_info"), Mapping):  # ResizeWithPadOrCrop: crop, then pad
        valid, handled = _replay(info["crop_info"], valid, where), True
    if "padded" in info:  # Pad, SpatialPad, BorderPad, DivisiblePad
        valid, handled = _pad(valid, info["padded"], before if valid is None else valid.shape), True
    if isinstance(info.get("pad_info"), Mapping):  # CropForeground, ResizeWithPadOrCrop
        valid, handled = _replay(info["pad_info"], valid, where), True
    if handled or valid is None:
        return valid
    name = op.get(TraceKeys.CLASS_NAME)
    if name in _FLIPS:
        axes = info.get("axes")
        dims = range(valid.dim()) if axes is None else ([axes] if is_int(axes) else list(axes))
        return torch.flip(valid, [int(a) for a in dims])
    if name in _ROTATIONS:
        return torch.rot90(valid, int(info.get("k", 1)), [int(a) for a in info.get("axes", (0, 1))])
    if bool(valid.all()):
        return None
    raise ValueError(
        f"{where}: the padding recorded earlier cannot be followed through {name!r}, which moves or "
        "resamples voxels; apply resampling transforms (Spacing, Orientation, Zoom, Affine ...) "
        "before padding ones (SpatialPad, DivisiblePad ...), as MONAI's recipes do"
    )


def _recorded_valid(img: Any, where: str) -> Tensor | None:
    """Valid cells of one item ``Tensor[C, *S]`` from its records (``None``: no padding)."""
    if not isinstance(img, MetaTensor):
        return None
    if img.pending_operations:
        raise ValueError(
            f"{where} has {len(img.pending_operations)} pending lazy operations; apply them first "
            "(monai.transforms.apply_pending or Compose(lazy=False))"
        )
    valid = None
    for op in img.applied_operations:
        valid = _replay(op, valid, where)
    spatial = tuple(img.shape[1:])
    if valid is not None and tuple(valid.shape) != spatial:
        raise ValueError(
            f"{where}: the recorded operations give a spatial shape {tuple(valid.shape)} but the "
            f"tensor has {spatial}; a transform changed the shape without recording it"
        )
    return valid


def recorded_padding_mask(img: Tensor) -> Tensor:
    """The padding that MONAI transforms recorded on one item, as a DETR mask.

    Replays ``img.applied_operations`` (``MetaTensor``) from the first record: pads
    (``Pad``, ``SpatialPad``, ``BorderPad``, ``DivisiblePad``, ``ResizeWithPadOrCrop``,
    ``CropForeground``'s padding, ``PadListDataCollate``), crops (``SpatialCrop``,
    ``CenterSpatialCrop``, ``RandSpatialCrop`` ...), flips and ``Rotate90`` move the padding as they
    moved the voxels, random wrappers (``RandFlip`` ...) are read through, and skipped random
    transforms (``do_transforms=False``) change nothing. A transform that resamples voxels
    (``Spacing``, ``Orientation``, ``Zoom``, ``Affine`` ...) is accepted before any padding and
    refused after it (its output cannot be placed cell by cell).

    Args:
        img (Tensor[C, *S]): one item (not a batch). A plain tensor, or a ``MetaTensor`` with no
            records, has no recorded padding.

    Returns:
        Tensor[*S], bool: True where the cell is padding (on the CPU, a new tensor).

    Raises:
        TypeError: ``img`` is not a tensor.
        ValueError: ``img`` has no spatial axis; pending lazy operations; a resampling transform
            after a pad; records that do not end at ``img``'s shape.

    References:
        MONAI ``TraceKeys`` / ``InvertibleTransform`` records (``extra_info['padded']``,
        ``['cropped']``); DETR's mask convention (True = padding).
    """
    if not isinstance(img, Tensor):
        raise TypeError(f"img must be a torch.Tensor (C, *S), got {type(img).__name__}")
    if img.dim() < 2:
        raise ValueError(f"img must have shape (C, *S) with at least one spatial axis, got {tuple(img.shape)}")
    valid = _recorded_valid(img, "img")
    if valid is None:
        return torch.zeros(tuple(img.shape[1:]), dtype=torch.bool)
    return ~valid


# --------------------------------------------------------------------------------- the collate
def _is_array(value: Any) -> bool:
    return isinstance(value, (Tensor, np.ndarray))


class NestedPadCollate(InvertibleTransform):
    """A ``collate_fn`` for MONAI dict samples: image key(s) -> :class:`~vispos.NestedTensor`.

    A drop-in for MONAI's ``pad_list_data_collate`` / ``PadListDataCollate`` that keeps the
    padding as a mask. Every array key whose items differ in size is padded to the largest size
    (rounded up to ``size_divisibility``) with MONAI's ``SpatialPad``, and each padding is recorded
    in the item's ``applied_operations`` as ``PadListDataCollate`` records it (so the batch inverts).
    Then MONAI's ``list_data_collate`` collates everything as MONAI does (``MetaTensor`` batches
    keep their metadata, ``applied_operations`` and affine per item). Each of ``keys`` is then
    returned as ``NestedTensor(tensors, mask)``: ``tensors`` the collated (``Meta``)tensor, ``mask``
    True wherever a cell is padding, whether the collate or an earlier MONAI transform (symmetric
    ``SpatialPad`` / ``DivisiblePad`` ..., replayed by :func:`recorded_padding_mask`) put it there.
    The keys of ``keys`` are padded and masked even when all items have one size. The mask
    becomes the batch's :class:`~vispos.Padding` (read once, here on the host): per-item boxes,
    at the origin or not (end padding, symmetric padding), give ``kind == "rectangular"`` with the
    boxes known on the host, so vispos' encoders take their fast path and ``batch[key][b]`` is
    item ``b``'s valid region.

    A plain class with picklable attributes: it runs in ``DataLoader`` worker processes, and
    ``pin_memory=True`` pins the ``NestedTensor`` (tensors and mask) as any batch.

    Args:
        keys (str or sequence of str): the image key(s) to return as ``NestedTensor``. Default
            ``"image"``.
        method (str): where the collate pads: ``"end"`` (default; DETR, detectron2) or
            ``"symmetric"`` (MONAI's default). Earlier MONAI padding is masked either way.
        mode (str): MONAI / torch pad mode (``"constant"``, ``"reflect"``, ``"edge"`` ...). The
            padding is masked whatever it holds.
        size_divisibility (int): pad every spatial axis to a multiple of this (0: no rounding),
            e.g. the patch size of a ViT.
        **pad_kwargs: passed to ``SpatialPad`` (e.g. ``value`` for the constant mode).

    Shape:
        - input: ``list`` of ``B`` dicts; ``item[key]`` ``Tensor[C, *S_b]`` (1 to 3 spatial axes).
        - output: a dict; ``out[key]`` ``NestedTensor(Tensor[B, C, *S], mask Tensor[B, *S] bool)``
          for each of ``keys``; other keys as ``list_data_collate`` returns them.

    Raises:
        TypeError: (construction) ``keys`` not strings (a number, e.g. ``NestedPadCollate(32)``
            meant as :class:`~vispos.PaddedCollate`'s ``size_divisibility``, is named as such);
            a non-int ``size_divisibility``; (call)
            ``batch`` not a sequence of mappings; a value of ``keys`` that is not an array.
        ValueError: (construction) ``method`` not ``"end"`` / ``"symmetric"``; negative
            ``size_divisibility``; (call) an empty batch; a missing key; items of one key with
            another rank or channel count; records that cannot be replayed (see
            :func:`recorded_padding_mask`).

    References:
        MONAI ``PadListDataCollate`` and ``list_data_collate``; Carion et al., DETR, ECCV 2020
        (``NestedTensor``, mask True = padding); detectron2 ``ImageList`` (``size_divisibility``).
    """

    def __init__(
        self,
        keys: str | Sequence[str] = "image",
        method: str = "end",
        mode: str = "constant",
        size_divisibility: int = 0,
        **pad_kwargs: Any,
    ) -> None:
        if isinstance(keys, (int, float)) and not isinstance(keys, bool):
            raise TypeError(
                f"keys must be the image key(s) of MONAI dict samples (default 'image'), got {keys!r} "
                f"({type(keys).__name__}): NestedPadCollate's first argument is keys, as in MONAI's dict "
                f"transforms; pass size_divisibility={keys!r} by keyword (PaddedCollate({keys!r}), which "
                "collates (image, target) pairs, takes it first)"
            )
        keys = (keys,) if isinstance(keys, str) else keys
        if not isinstance(keys, Sequence) or not keys or any(not isinstance(k, Hashable) or isinstance(k, bool) for k in keys):
            raise TypeError(f"keys must be a key or a non-empty sequence of keys, got {keys!r}")
        self.keys = tuple(keys)
        self.method = check_choice(method, _METHODS, "method")
        if not isinstance(mode, str):
            raise TypeError(f"mode must be a MONAI pad mode name (str), got {mode!r}")
        self.mode = mode
        self.size_divisibility = check_int(size_divisibility, "size_divisibility", minimum=0)
        self.pad_kwargs = dict(pad_kwargs)

    def __repr__(self) -> str:
        extra = "".join(f", {k}={v!r}" for k, v in self.pad_kwargs.items())
        return (
            f"NestedPadCollate(keys={self.keys!r}, method={self.method!r}, mode={self.mode!r}, "
            f"size_divisibility={self.size_divisibility}{extra})"
        )

    def _target(self, shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
        target = [max(axis) for axis in zip(*shapes)]
        k = self.size_divisibility
        return tuple(int(math.ceil(s / k) * k) if k > 1 else s for s in target)

    def __call__(self, batch: Sequence[Mapping]) -> dict:
        if isinstance(batch, (str, bytes, Mapping, Tensor)) or not isinstance(batch, Sequence):
            raise TypeError(f"batch must be a list of dict samples, got {type(batch).__name__}")
        if len(batch) == 0:
            raise ValueError("batch must hold at least one sample, got an empty sequence")
        for i, item in enumerate(batch):
            if not isinstance(item, Mapping):
                raise TypeError(
                    f"batch[{i}] must be a dict sample (MONAI dict transforms), got {type(item).__name__}"
                )
        items = [dict(item) for item in batch]  # the caller's dicts are not modified
        valid: dict[Hashable, list] = {}
        for key in self.keys:
            for i, item in enumerate(items):
                if key not in item:
                    raise ValueError(f"batch[{i}] has no key {key!r} (keys: {list(item)})")
                value = item[key]
                if not _is_array(value):
                    raise TypeError(f"batch[{i}][{key!r}] must be a tensor (C, *S), got {type(value).__name__}")
                if not 2 <= value.ndim <= 4:
                    raise ValueError(
                        f"batch[{i}][{key!r}] must have shape (C, *S) with 1 to 3 spatial axes, got "
                        f"{tuple(value.shape)}"
                    )
                first = items[0][key]
                if value.ndim != first.ndim or value.shape[0] != first.shape[0]:
                    raise ValueError(
                        f"batch[{i}][{key!r}] has shape {tuple(value.shape)} but batch[0][{key!r}] has "
                        f"{tuple(first.shape)}: items need one rank and channel count"
                    )
            valid[key] = [_recorded_valid(item[key], f"batch[{i}][{key!r}]") for i, item in enumerate(items)]
        for key in items[0]:
            values = [item.get(key) for item in items]
            if not all(_is_array(v) and v.ndim >= 2 for v in values) or len({v.ndim for v in values}) > 1:
                continue
            shapes = [tuple(v.shape[1:]) for v in values]
            if key not in self.keys and len(set(shapes)) == 1:
                continue  # as MONAI: nothing to pad
            padder = SpatialPad(self._target(shapes), method=self.method, mode=self.mode, **self.pad_kwargs)
            for i, item in enumerate(items):
                widths = padder.compute_pad_width(shapes[i])
                item[key] = padder(item[key])
                if isinstance(item[key], MetaTensor) and item[key].applied_operations:
                    # as PadListDataCollate: the pad recorded under this collate's name, for the inverse
                    last = self.pop_transform(item, key, check=False)
                    self.push_transform(item, key, orig_size=shapes[i], extra_info=last)
                if key in valid:
                    valid[key][i] = _pad(valid[key][i], widths, shapes[i])
        out = list_data_collate(items)
        for key in self.keys:
            tensors = out[key]
            spatial = tuple(tensors.shape[2:])
            mask = torch.stack([torch.zeros(spatial, dtype=torch.bool) if v is None else ~v for v in valid[key]])
            # one pass over the mask on the host finds per-item boxes (kind "rectangular")
            out[key] = NestedTensor(tensors, Padding.from_mask(mask.to(tensors.device)))
        return out

    @staticmethod
    def inverse(data: Mapping, masks: Mapping[Hashable, Tensor] | None = None) -> dict:
        """Undoes the collate's padding on one decollated sample (as ``PadListDataCollate.inverse``).

        A ``MetaTensor`` whose last record is this collate's padding is cropped back by the
        recorded widths and the record is removed, so MONAI's ``Invertd`` can undo the earlier
        transforms. A plain tensor (no records) under a key of ``masks`` is cropped to the box of
        its valid cells (the collate's padding is the only padding known for it).

        Args:
            data (Mapping): one sample from ``decollate_batch``.
            masks (Mapping[key, Tensor[*S] bool], optional): the item's masks, for plain tensors.

        Returns:
            dict: a new dict; cropped values are new tensors.

        Raises:
            TypeError: ``data`` is not a mapping.

        References:
            MONAI ``PadListDataCollate.inverse``.
        """
        if not isinstance(data, Mapping):
            raise TypeError(f"data must be a dict sample, got {type(data).__name__}")
        d = dict(data)
        for key, value in d.items():
            if isinstance(value, MetaTensor) and value.applied_operations:
                last = value.applied_operations[-1]
                if isinstance(last, Mapping) and last.get(TraceKeys.CLASS_NAME) == NestedPadCollate.__name__:
                    value = value.clone()
                    op = value.applied_operations.pop()
                    padded = op[TraceKeys.EXTRA_INFO][TraceKeys.EXTRA_INFO]["padded"]
                    start = [int(p[0]) for p in list(padded)[1:]]
                    end = [s + int(o) for s, o in zip(start, op[TraceKeys.ORIG_SIZE])]
                    cropper = SpatialCrop(roi_start=start, roi_end=end)
                    with cropper.trace_transform(False):
                        d[key] = cropper(value)
                    continue
            if masks is not None and key in masks and isinstance(value, Tensor):
                padding = Padding.from_mask(masks[key].unsqueeze(0))
                if padding.sizes[0] and all(padding.sizes[0]):
                    d[key] = value[(slice(None), *padding.region(0))]
        return d


def decollate_nested_batch(batch: Mapping, detach: bool = True) -> list[dict]:
    """The inverse of :class:`NestedPadCollate`: a batch back to its samples at their own sizes.

    ``NestedTensor`` values are unwrapped, MONAI's ``decollate_batch`` splits the batch (each
    ``MetaTensor`` gets its metadata and ``applied_operations`` back), and
    :meth:`NestedPadCollate.inverse` crops away the collate's padding. The samples then have the
    sizes they had when they entered the collate (padding from earlier MONAI transforms included,
    so ``Invertd`` can undo those transforms).

    Args:
        batch (Mapping): a batch from :class:`NestedPadCollate` (or model outputs added to it
            under keys whose values are batched like the images).
        detach (bool): as ``decollate_batch``.

    Returns:
        list of ``B`` dicts.

    Raises:
        TypeError: ``batch`` is not a mapping.

    References:
        MONAI ``decollate_batch``, ``PadListDataCollate.inverse``.
    """
    if not isinstance(batch, Mapping):
        raise TypeError(f"batch must be a dict from NestedPadCollate, got {type(batch).__name__}")
    plain = dict(batch)
    masks = {}
    for key, value in batch.items():
        if isinstance(value, NestedTensor):
            plain[key] = value.tensors
            if value.mask is not None:
                masks[key] = value.mask.cpu()
    items = decollate_batch(plain, detach=detach)
    return [
        NestedPadCollate.inverse(item, {k: m[i] for k, m in masks.items()}) for i, item in enumerate(items)
    ]
