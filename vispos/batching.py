"""Padded batches from items of different sizes: DETR's ``nested_tensor_from_tensor_list`` and collates.

:func:`nested_tensor_from_tensor_list` pads a list of images or volumes into a
:class:`~vispos.NestedTensor` whose :class:`~vispos.Padding` is rectangular and known on the
host; :func:`collate_fn` and :class:`PaddedCollate` do the same for a ``DataLoader``'s
``(image, target)`` pairs. Their earlier home, :mod:`vispos.nested_tensor`, still resolves the
three names for one release, with a ``DeprecationWarning``.

References:
    Carion et al., End-to-End Object Detection with Transformers, ECCV 2020 (``util/misc.py``:
    ``collate_fn``); detectron2 ``ImageList.from_tensors``; MONAI ``SpatialPad``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from . import _tracing
from ._checks import MAX_SPATIAL, check_choice, check_fits, check_int, check_number, count
from .nested_tensor import NestedTensor
from .padding import Padding

__all__ = ["nested_tensor_from_tensor_list", "PaddedCollate", "collate_fn"]


def _check_pad_value(pad_value: Any, dtype: torch.dtype) -> None:
    """``pad_value`` (a real number, checked by the caller) must be a value ``dtype`` holds:
    no wrap-around (-1 -> 255 in uint8), no silent rounding (0.5 -> 0), no overflow to inf
    (1e6 in float16), compared exactly (Python ints are never rounded through a float)."""
    if dtype.is_floating_point or dtype.is_complex:
        try:
            value = float(pad_value)
            fits = not math.isfinite(value) or bool(torch.isfinite(torch.tensor(value, dtype=torch.float64).to(dtype)))
        except OverflowError:
            fits = False
        want = f"a value that does not overflow {dtype} (|value| < about {torch.finfo(dtype.to_real()).max:.4g})"
    elif dtype == torch.bool:
        fits, want = pad_value in (0, 1), "0 or 1"
    else:
        info = torch.iinfo(dtype)
        integral = isinstance(pad_value, int) or (math.isfinite(pad_value) and float(pad_value).is_integer())
        fits = integral and info.min <= pad_value <= info.max
        want = f"an integer in [{info.min}, {info.max}]"
    if not fits:
        raise ValueError(f"pad_value={pad_value!r} cannot be stored in the items' dtype {dtype}: expected {want}")


def _channels_last_hint(*items: Tensor) -> str:
    """A hint for an image or volume that looks channels-last (its last axis 1, 3 or 4, its
    first not): items are channels-first ``(C, H, W)`` / ``(C, D, H, W)``."""
    for t in items:
        if t.dim() >= 3 and t.shape[-1] in (1, 3, 4) and t.shape[0] not in (1, 3, 4):
            return (f"; items are channels-first (C, H, W) or (C, D, H, W), and shape {tuple(t.shape)} looks "
                    "channels-last: pass t.movedim(-1, 0) (for an (H, W, C) image: t.permute(2, 0, 1))")
    return ""


def _warn_nan(tensors: Sequence[Tensor]) -> None:
    """Warns (``UserWarning``, once per call site under Python's default filter) when a floating
    item holds NaN: the batch would carry it into the model (the mask marks padding, not NaN).
    The values are read on the host only (CPU items, outside tracing), where the read costs one
    pass over the items and no synchronisation; items on an accelerator are not read."""
    first = tensors[0]
    if not first.is_floating_point() or not _tracing.host_side(first.device) or _tracing.tracing():
        return
    for i, t in enumerate(tensors):
        if bool(torch.isnan(t).any()):
            warnings.warn(
                f"tensors[{i}] (shape {tuple(t.shape)}, {t.dtype}) holds NaN values: the padded batch carries "
                "them into the model (padding is marked by the mask, not by NaN); replace them first, e.g. "
                "torch.nan_to_num(t)",
                UserWarning,
                stacklevel=3,
            )
            return


def _check_fits(padded: Sequence[int], first: Tensor, batch: int, divisor: int, sizes: Sequence) -> None:
    """Refuses, before allocating, a batch that no machine of this kind could hold
    (:func:`vispos._checks.check_fits`, the guard the encoders' outputs share)."""
    need = batch * math.prod(padded) * (first.shape[0] * first.element_size() + 1)  # tensors + the bool mask
    unrounded = [max(axis) for axis in zip(*sizes)]
    culprit = "size_divisibility" if divisor > 1 and padded != unrounded else "tensors"
    value = f"size_divisibility={divisor}" if culprit == "size_divisibility" else f"tensors (largest item {tuple(unrounded)})"
    check_fits(need, first.device, f"{value} pads the batch to {tuple(padded)} cells: {batch} x {count(first.shape[0], 'channel')} of "
               f"{first.dtype}", "use a smaller size_divisibility" if culprit == "size_divisibility" else "use smaller items")


def nested_tensor_from_tensor_list(
    tensors: Sequence[Tensor],
    size_divisibility: int = 0,
    pad_value: float = 0.0,
    *,
    method: str = "end",
) -> NestedTensor:
    """Pads a list of images ``(C, H, W)`` or volumes ``(C, D, H, W)`` into a :class:`NestedTensor`.

    The padded size is the largest size along each axis, rounded up to a multiple of
    ``size_divisibility`` when it is > 0. Items with one spatial axis ``(C, L)`` are accepted
    too. The inputs are not modified; the result's padding is rectangular.

    Args:
        tensors (sequence of Tensor[C, *S_i]): same rank, channel count, dtype and device.
        size_divisibility (int): pad every spatial axis to a multiple of this (0: no rounding).
        pad_value (int or float): value written into the padding of ``tensors`` (an int is
            stored exactly, also beyond 2**53 in int64).
        method (str, keyword-only): ``"end"`` (default, DETR): items at the origin, padded at the
            end of every axis; ``"symmetric"`` (MONAI's ``SpatialPad``): items centred, the
            extra cell of an odd margin at the end.

    Returns:
        NestedTensor: ``tensors`` ``(B, C, *S_max)`` in the items' dtype, ``mask`` ``(B, *S_max)``
        bool with True = padding, ``image_sizes`` the items' own sizes.

    Raises:
        TypeError: ``tensors`` is not a list/tuple, an item is not a tensor,
            ``size_divisibility`` is not an int, ``pad_value`` is not a number, ``method`` is not
            a str.
        ValueError: empty list; an item with another rank, channel count, dtype or device than
            item 0; a zero-size axis; negative ``size_divisibility``; ``pad_value`` cannot be
            stored in the items' dtype (e.g. -1, 0.5 or 300 for ``uint8``, 1e6 for ``float16``);
            ``size_divisibility`` (or the items) make a batch larger than the device's memory or
            than torch can address (checked before allocating); an unknown ``method``. An item
            of another channel count that looks channels-last (``(H, W, 3)``) gets a hint.

    Warns:
        UserWarning: a floating item holds NaN (checked on the CPU only, where reading the
            values costs one pass and no synchronisation; once per call site).

    References:
        DETR ``util/misc.py`` (``nested_tensor_from_tensor_list``); detectron2 ``ImageList``;
        MONAI ``SpatialPad``.
    """
    if isinstance(tensors, Tensor) or not isinstance(tensors, Sequence):
        raise TypeError(
            "tensors must be a list or tuple of tensors shaped (C, *S), "
            f"got {type(tensors).__name__}"
        )
    if len(tensors) == 0:
        raise ValueError("tensors must hold at least one tensor, got an empty sequence")
    divisor = check_int(size_divisibility, "size_divisibility", minimum=0)
    pad_value = check_number(pad_value, "pad_value", finite=False)
    method = check_choice(method, ("end", "symmetric"), "method")
    for i, t in enumerate(tensors):
        if not isinstance(t, Tensor):
            raise TypeError(f"tensors[{i}] must be a torch.Tensor shaped (C, *S), got {type(t).__name__}")
    first = tensors[0]
    _check_pad_value(pad_value, first.dtype)
    if not 2 <= first.dim() <= 1 + MAX_SPATIAL:
        raise ValueError(
            "tensors[0] must have shape (C, H, W), (C, D, H, W) or (C, L), "
            f"got shape {tuple(first.shape)}"
        )
    for i, t in enumerate(tensors):
        if t.dim() != first.dim():
            raise ValueError(
                f"tensors[{i}] has shape {tuple(t.shape)} ({t.dim()} dims) but tensors[0] has "
                f"shape {tuple(first.shape)} ({first.dim()} dims); all items need the same rank"
            )
        if t.shape[0] != first.shape[0]:
            raise ValueError(
                f"tensors[{i}] has {count(t.shape[0], 'channel')} (shape {tuple(t.shape)}) but tensors[0] "
                f"has {first.shape[0]} (shape {tuple(first.shape)}){_channels_last_hint(t, first)}"
            )
        if t.dtype != first.dtype:
            raise ValueError(f"tensors[{i}] has dtype {t.dtype} but tensors[0] has {first.dtype}")
        if t.device != first.device:
            raise ValueError(f"tensors[{i}] is on {t.device} but tensors[0] is on {first.device}")
        if any(s == 0 for s in t.shape[1:]):
            raise ValueError(f"tensors[{i}] has a zero-size spatial axis: shape {tuple(t.shape)}")

    _warn_nan(tensors)
    sizes = [tuple(t.shape[1:]) for t in tensors]
    padded = [max(axis) for axis in zip(*sizes)]
    if divisor > 1:
        padded = [-(-s // divisor) * divisor for s in padded]
    _check_fits(padded, first, len(tensors), divisor, sizes)
    padding = Padding.from_sizes(sizes, padded, starts="symmetric" if method == "symmetric" else None, device=first.device)
    batch = first.new_full((len(tensors), first.shape[0], *padded), pad_value)
    for i, t in enumerate(tensors):
        batch[(i, slice(None), *padding.region(i))].copy_(t)
    padding.mask  # noqa: B018 - built now, in the collating process (DataLoader workers)
    return NestedTensor(batch, padding)


# ------------------------------------------------------------------------ reading encoder input
class PaddedCollate:
    """Builds a collate with your settings (``size_divisibility``, ``pad_value``, ``method``) for
    a ``DataLoader``: it pads ``(image, target)`` pairs into a batch.

    With the defaults it equals :func:`collate_fn`, DETR's function with fixed settings; build a
    ``PaddedCollate`` when you need size rounding, another padding value or symmetric padding.
    Follows DETR's contract (``util/misc.py``, ``collate_fn``): a list of ``(image, target)``
    pairs in, ``(NestedTensor, tuple_of_targets)`` out. Images are 2D ``(C, H, W)`` or 3D
    ``(C, D, H, W)`` (1D ``(C, L)`` too), each at its own size; they are padded by
    :func:`nested_tensor_from_tensor_list`, so the batch's padding is rectangular and known on
    the host. Targets are passed through untouched (any object: a dict of tensors, a
    ``tv_tensors.BoundingBoxes``, ``None``). A plain class instance, so it pickles into
    ``DataLoader`` worker processes under every start method.

    Args:
        size_divisibility (int): pad every spatial axis to a multiple of this (0: no rounding).
        pad_value (int or float): value written into the padding of the images, kept as given
            (an int is stored exactly in integer batches, also beyond 2**53).
        method (str, keyword-only): ``"end"`` (DETR, default) or ``"symmetric"`` (MONAI's
            ``SpatialPad``), see :func:`nested_tensor_from_tensor_list`.

    Shape:
        - input: ``list[(Tensor[C, *S_i], target_i)]``, ``B`` pairs, same rank, channels, dtype.
        - output: ``(NestedTensor(Tensor[B, C, *S_max], mask Tensor[B, *S_max] bool), tuple of B
          targets)``.

    Raises:
        TypeError: (construction) a non-int ``size_divisibility``, a non-number ``pad_value``, a
            non-str ``method``; (call) ``batch`` is not a list/tuple of ``(image, target)``
            pairs, or an image is not a tensor.
        ValueError: (construction) negative ``size_divisibility``, an unknown ``method``; (call)
            an empty batch, a pair of another length than 2, images that cannot be padded
            together (rank, channels, dtype, device, a zero-size axis), a ``pad_value`` the
            images' dtype cannot hold, or a padded batch larger than the device's memory (see
            :func:`nested_tensor_from_tensor_list`).

    References:
        Carion et al., End-to-End Object Detection with Transformers, ECCV 2020
        (``util/misc.py``: ``collate_fn``); detectron2 ``ImageList.from_tensors``.
    """

    def __init__(self, size_divisibility: int = 0, pad_value: float = 0.0, *, method: str = "end") -> None:
        size_divisibility = check_int(size_divisibility, "size_divisibility", minimum=0)
        pad_value = check_number(pad_value, "pad_value", finite=False)
        self.size_divisibility = size_divisibility
        self.pad_value = pad_value
        self.method = check_choice(method, ("end", "symmetric"), "method")

    def __call__(self, batch: Sequence[tuple[Tensor, Any]]) -> tuple[NestedTensor, tuple[Any, ...]]:
        if isinstance(batch, (str, bytes, Tensor)) or not isinstance(batch, Sequence):
            raise TypeError(
                f"batch must be a list of (image, target) pairs, got {type(batch).__name__}"
            )
        if len(batch) == 0:
            raise ValueError("batch must hold at least one (image, target) pair, got an empty sequence")
        images, targets = [], []
        for i, pair in enumerate(batch):
            if isinstance(pair, (str, bytes, Tensor)) or not isinstance(pair, Sequence):
                raise TypeError(
                    f"batch[{i}] must be an (image, target) pair, got {type(pair).__name__}; "
                    "a Dataset for this collate returns `image, target`"
                )
            if len(pair) != 2:
                raise ValueError(f"batch[{i}] must be an (image, target) pair, got {len(pair)} elements")
            image, target = pair
            if not isinstance(image, Tensor):
                raise TypeError(
                    f"batch[{i}][0] (the image) must be a torch.Tensor (C, *S), got {type(image).__name__}"
                )
            images.append(image.as_subclass(Tensor) if type(image) is not Tensor else image)
            targets.append(target)
        nested = nested_tensor_from_tensor_list(
            images, self.size_divisibility, self.pad_value, method=self.method
        )
        return nested, tuple(targets)

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.__dict__.setdefault("method", "end")  # pickles from before ``method`` existed

    def __repr__(self) -> str:
        method = "" if self.method == "end" else f", method={self.method!r}"
        return f"PaddedCollate(size_divisibility={self.size_divisibility}, pad_value={self.pad_value!r}{method})"


def collate_fn(batch: Sequence[tuple[Tensor, Any]]) -> tuple[NestedTensor, tuple[Any, ...]]:
    """DETR's ``collate_fn`` (a drop-in for ``util.misc.collate_fn``), fixed settings: pairs ->
    ``(NestedTensor, tuple_of_targets)``.

    No size rounding, zero padding, items at the origin: equal to ``PaddedCollate()(batch)``. For
    other settings build a :class:`PaddedCollate`. A module-level function, so it pickles into
    ``DataLoader`` workers.

    Args:
        batch (list of (Tensor[C, *S_i], target)): images or volumes each at its own size.

    Returns:
        tuple: ``(NestedTensor(Tensor[B, C, *S_max], mask Tensor[B, *S_max] bool, True =
        padding), tuple of the B targets)``.

    Raises:
        TypeError, ValueError: as :class:`PaddedCollate`.

    References:
        Carion et al., End-to-End Object Detection with Transformers, ECCV 2020 (``util/misc.py``).
    """
    return _DEFAULT_COLLATE(batch)


_DEFAULT_COLLATE = PaddedCollate()
