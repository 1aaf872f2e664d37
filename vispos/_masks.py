"""Tensor algorithms on padding masks (True = padding), the machinery behind :class:`vispos.Padding`.

A padding mask is a ``bool`` tensor ``Tensor[B, *S]`` (1 to 3 spatial axes) where **True marks
padding**, as in DETR. A *box* is a per-item valid region ``[start_i, stop_i)`` along every
axis (DETR's padding is the box anchored at the origin; MONAI's symmetric padding centres it).
The functions here check masks, find boxes, build a mask from boxes, resize masks and boxes by
DETR's nearest rule and measure valid ratios. :mod:`vispos.padding` re-exports the public ones
(their documented home) and :class:`vispos.Padding` is built on them; nobody else re-derives
these facts.

Empty inputs (an empty batch, a zero-size axis) give empty results of the documented shape.

References:
    Carion et al., End-to-End Object Detection with Transformers, ECCV 2020 (``util/misc.py``,
    ``models/backbone.py``); Zhu et al., Deformable DETR, ICLR 2021 (``get_valid_ratio``);
    MONAI ``SpatialPad(method="symmetric")``.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ._checks import MAX_SPATIAL, check_int

Spans = tuple[tuple[int, ...], ...]  # per item, one int per axis


def check_mask(mask: Any, name: str = "mask", peer: str = "pixel_mask", cells: str = "pixels") -> Tensor:
    """Validates a padding mask's type: a ``bool`` tensor. Returns it.

    Args:
        mask (Tensor[B, *S], bool): True marks padding.
        name (str): the parameter's name in messages.
        peer, cells (str): the transformers-style "1 = valid" mask the hint mentions
            (``pixel_mask`` / pixels for images, ``attention_mask`` / tokens for sequences).

    Returns:
        Tensor: ``mask`` itself (not copied).

    Raises:
        TypeError: not a tensor; not ``torch.bool`` (with a hint on how to convert).

    References:
        DETR's convention (True = padding); transformers' ``pixel_mask`` is its inverse.
    """
    if not isinstance(mask, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of dtype torch.bool, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(
            f"{name} must have dtype torch.bool with True marking padding, got {mask.dtype}. "
            f"Convert with `{name}.bool()` if nonzero marks padding, or `~{peer}.bool()` for a "
            f"transformers-style {peer} where 1 marks valid {cells}."
        )
    return mask


def check_spatial_mask(mask: Any, name: str = "mask") -> Tensor:
    """:func:`check_mask`, and 1 to 3 spatial axes (ValueError otherwise). Returns ``mask``."""
    check_mask(mask, name)
    if not 1 <= mask.dim() - 1 <= MAX_SPATIAL:
        raise ValueError(
            f"{name} must have shape (B, *S) with 1 to {MAX_SPATIAL} spatial axes, got {tuple(mask.shape)}"
        )
    return mask


def check_spatial_size(size: Any, n: int, name: str = "size", *, minimum: int = 1) -> tuple[int, ...]:
    """A spatial size for ``n`` axes: one int (for every axis) or ``n`` ints ``>= minimum``.

    Raises:
        TypeError: not an int or a sequence of ints. ValueError: wrong length or an entry below
            ``minimum``.
    """
    if isinstance(size, int) and not isinstance(size, bool):
        size = (size,) * n
    if isinstance(size, torch.Size):
        size = tuple(size)
    if isinstance(size, (str, bytes)) or not isinstance(size, Sequence):
        raise TypeError(f"{name} must be an int or a sequence of {n} ints, got {size!r}")
    try:
        size = tuple(check_int(s, name) for s in size)
    except TypeError:
        raise TypeError(f"{name} must be an int or a sequence of {n} ints, got {size!r}") from None
    if len(size) != n or any(s < minimum for s in size):
        what = "positive" if minimum == 1 else f">= {minimum}"
        raise ValueError(f"{name} must hold {n} {what} ints, got {size}")
    return size


def check_spans(values: Any, name: str, n: int) -> Spans:
    """Per-item sequences of ``n`` ints (or an integer ``Tensor[B, n]``, read on the host) as a
    tuple of tuples."""
    if isinstance(values, Tensor):
        if values.is_floating_point() or values.is_complex() or values.dtype == torch.bool:
            raise TypeError(f"{name} must hold integers, got a tensor of dtype {values.dtype}")
        if values.dim() != 2 or values.shape[1] != n:
            raise ValueError(f"{name} must have shape (B, {n}), got {tuple(values.shape)}")
        return tuple(tuple(row) for row in values.tolist())
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"{name} must be a sequence of per-item sizes (sequences of ints), got {type(values).__name__}")
    out = []
    for i, item in enumerate(values):
        if isinstance(item, (str, bytes)) or not isinstance(item, (Sequence, torch.Size)):
            raise TypeError(f"{name}[{i}] must be a sequence of {n} ints (one per spatial axis), got {item!r}")
        try:
            entries = tuple(int(check_int(v, f"{name}[{i}]")) for v in item)
        except TypeError:
            raise TypeError(f"{name}[{i}] must hold ints, got {tuple(item)!r}") from None
        if len(entries) != n:
            raise ValueError(f"{name}[{i}] = {entries} must have {n} entries (one per spatial axis)")
        out.append(entries)
    return tuple(out)


# --------------------------------------------------------------------------- extents, boxes
def mask_sizes(mask: Tensor) -> list[tuple[int, ...]]:
    """Each item's valid extent, on the host: along every axis, one past the last valid index.

    For an origin-anchored rectangular mask this is the item's size. Reads the mask on the host
    (one synchronisation).

    Args:
        mask (Tensor[B, *S], bool): True marks padding.

    Returns:
        list of ``B`` tuples of ``len(S)`` ints (0 along every axis for a fully padded item; an
        empty list for an empty batch; 0 along a zero-size axis).

    Raises:
        TypeError: ``mask`` is not a bool tensor. ValueError: not 1 to 3 spatial axes.

    References:
        detectron2 ``ImageList.image_sizes``; DETR ``util/misc.py``.
    """
    check_spatial_mask(mask)
    return [tuple(item) for item in bounding_boxes(mask)[1]]


def bounding_boxes(mask: Tensor) -> tuple[Spans, Spans]:
    """``(starts, stops)``: per item and axis, the first valid index and one past the last
    (both 0 for an item without a valid cell). Host values; one synchronisation."""
    batch, n = mask.shape[0], mask.dim() - 1
    if batch == 0:
        return (), ()
    if mask.numel() == 0:
        empty = tuple(0 for _ in range(n))
        return (empty,) * batch, (empty,) * batch
    valid = ~mask
    rows = []
    for axis in range(1, n + 1):
        other = [d for d in range(1, n + 1) if d != axis]
        along = valid.any(dim=other) if other else valid  # (B, S_axis)
        found = along.any(1)
        first = along.to(torch.uint8).argmax(1)
        last = along.shape[1] - along.flip(1).to(torch.uint8).argmax(1)
        rows += [torch.where(found, first, 0), torch.where(found, last, 0)]
    table = torch.stack(rows, 1).tolist()  # [B, 2n]: start, stop of axis 0, then axis 1, ...
    return tuple(tuple(r[0::2]) for r in table), tuple(tuple(r[1::2]) for r in table)


def rectangular_sizes(mask: Tensor) -> Tensor:
    """Per-item valid sizes of an origin-anchored rectangular padding mask, on its device.

    Reads the line through the origin along every axis (no host synchronisation).

    Args:
        mask (Tensor[B, *S], bool): True marks padding.

    Returns:
        Tensor[B, n], int64: valid cells along each axis (0 for a fully padded item or along a
        zero-size axis). Only meaningful for origin-anchored rectangular masks.

    Raises:
        Nothing beyond torch's own errors: callers validate ``mask`` with :func:`check_mask`
        first (this runs on the hot path).

    References:
        The padding of DETR's ``nested_tensor_from_tensor_list`` (items at the origin).
    """
    if 0 in mask.shape[1:]:
        return torch.zeros((mask.shape[0], mask.dim() - 1), dtype=torch.int64, device=mask.device)
    valid = ~mask
    sizes = []
    for axis in range(1, mask.dim()):
        line = valid
        for other in range(mask.dim() - 1, 0, -1):
            if other != axis:
                line = line.select(other, 0)
        sizes.append(line.sum(1))
    return torch.stack(sizes, 1)


def rectangular_valid(sizes: Tensor, spatial: Sequence[int]) -> list[Tensor]:
    """Per axis ``i``, the bool table ``(c < sizes[b, i])`` of shape ``(B, S_i)`` (True = valid).

    Args:
        sizes (Tensor[B, n], int): per-item valid sizes of an origin-anchored box.
        spatial (sequence of int): ``S``.

    Returns:
        list of Tensor[B, S_i], bool.

    Raises:
        Nothing beyond torch's own errors (an internal helper; inputs come from
        :func:`rectangular_sizes`).

    References:
        The padding of DETR's ``nested_tensor_from_tensor_list`` (items at the origin).
    """
    return [torch.arange(s, device=sizes.device) < sizes[:, i : i + 1] for i, s in enumerate(spatial)]


def matches_rectangle(mask: Tensor, sizes: Tensor) -> bool:
    """True when ``mask`` equals "item ``b`` valid on ``[0, sizes[b])`` along every axis".

    Args:
        mask (Tensor[B, *S], bool): True marks padding.
        sizes (Tensor[B, n], int): candidate valid sizes (usually :func:`rectangular_sizes`).

    Returns:
        bool (reads one value on the host).

    Raises:
        Nothing beyond torch's own errors (callers validate ``mask`` with :func:`check_mask`).

    References:
        The padding of DETR's ``nested_tensor_from_tensor_list`` (items at the origin).
    """
    return bool(torch.equal(~mask, origin_boxes(sizes, tuple(mask.shape[1:])).expand_as(mask)))


def origin_boxes(sizes: Tensor, spatial: Sequence[int]) -> Tensor:
    """``Tensor[B, 1 or S_0, ..]`` bool, True inside item ``b``'s box ``[0, sizes[b])``
    (broadcastable to ``(B, *S)``; device ops only)."""
    n = len(spatial)
    valid = None
    for i, a in enumerate(rectangular_valid(sizes, spatial)):
        view = [a.shape[0]] + [1] * n
        view[1 + i] = spatial[i]
        valid = a.view(view) if valid is None else valid & a.view(view)
    return valid


def is_rectangular(mask: Tensor) -> bool:
    """True when ``mask`` is origin-anchored rectangular padding (reads the mask on the host).

    Args:
        mask (Tensor[B, *S], bool): True marks padding.

    Returns:
        bool: the mask equals "item ``b`` valid on ``[0, size_b)`` along every axis". (A box
        away from the origin is rectangular for :class:`vispos.Padding`, not here.)

    Raises:
        TypeError: ``mask`` is not a bool tensor.

    References:
        The padding of DETR's ``nested_tensor_from_tensor_list``.
    """
    check_mask(mask)
    return matches_rectangle(mask, rectangular_sizes(mask))


def find_boxes(mask: Tensor) -> tuple[Spans, Spans] | None:
    """The per-item boxes ``(starts, stops)`` that ``mask`` is exactly, or None (not boxes).

    Origin-anchored boxes (DETR) are recognised from the lines through the origin and one
    comparison; a mismatch in an item whose origin cell is valid proves the mask is not boxes
    (a box holding the origin starts there). Only when the mismatches are in items padded at
    the origin are the bounding boxes of the valid cells compared (symmetric padding). Reads
    the mask on the host (a few synchronisations on an accelerator). Empty
    items get ``(0, .., 0)`` twice.
    """
    batch, n = mask.shape[0], mask.dim() - 1
    if batch == 0 or mask.numel() == 0:
        return bounding_boxes(mask)
    spatial = tuple(mask.shape[1:])
    sizes = rectangular_sizes(mask)
    wrong = (mask == origin_boxes(sizes, spatial)).flatten(1).any(1).tolist()  # a cell both padding and in the box
    if not any(wrong):
        empty = tuple(0 for _ in range(n))
        return (empty,) * batch, tuple(empty if 0 in s else tuple(s) for s in sizes.tolist())
    origin = mask[(slice(None),) + (0,) * n].tolist()  # origin cell padded, per item
    if any(w and not o for w, o in zip(wrong, origin)):
        return None
    starts, stops = bounding_boxes(mask)
    return (starts, stops) if torch.equal(mask, boxes_mask(starts, stops, spatial, mask.device)) else None


def boxes_mask(
    starts: Spans, stops: Spans, spatial: Sequence[int], device: torch.device | str | None = None,
    *, pin_memory: bool = False,
) -> Tensor:
    """``Tensor[B, *S]`` bool, True outside item ``b``'s box ``[starts[b], stops[b])``: all
    padding, then each box cleared by slicing (no tensor is built from host values, so it runs
    under CUDA graph capture too)."""
    mask = torch.ones((len(starts), *spatial), dtype=torch.bool, device=device, pin_memory=pin_memory)
    for b, (start, stop) in enumerate(zip(starts, stops)):
        if all(e > s for s, e in zip(start, stop)):
            mask[(b, *(slice(s, e) for s, e in zip(start, stop)))] = False
    return mask


# --------------------------------------------------------------------------------- resizing
def interpolate_mask(mask: Tensor, size: int | Sequence[int]) -> Tensor:
    """Resizes a padding mask to a feature map's spatial size (nearest neighbour, as DETR does).

    Args:
        mask (Tensor[B, *S], bool): True marks padding; 1 to 3 spatial axes. An empty batch gives
            an empty result; a mask with a zero-size axis (no valid cell) gives all padding.
        size (int or sequence of int): the target spatial size ``S'`` (one int per spatial axis,
            or one int for all).

    Returns:
        Tensor[B, *S'], bool: the resized mask (a new tensor).

    Raises:
        TypeError: ``mask`` is not a bool tensor; ``size`` holds non-integers.
        ValueError: ``mask`` has no or more than 3 spatial axes; ``size`` has the wrong length or
            a non-positive entry.

    References:
        DETR ``models/backbone.py`` (``F.interpolate(m[None].float(), size).to(torch.bool)[0]``).
    """
    check_spatial_mask(mask)
    size = check_spatial_size(size, mask.dim() - 1)
    return _interpolate(mask, size)


def _interpolate(mask: Tensor, size: tuple[int, ...]) -> Tensor:
    if mask.numel() == 0:  # empty batch, or no valid cell at all: nothing to interpolate
        return torch.ones((mask.shape[0], *size), dtype=torch.bool, device=mask.device)
    return F.interpolate(mask[None].float(), size=size, mode="nearest")[0].to(torch.bool)


@functools.lru_cache(maxsize=512)
def _nearest_sources(old: int, new: int) -> tuple[int, ...]:
    """For each of ``new`` cells, the source index that DETR's nearest resize copies from
    ``old`` cells: torch's own kernel applied to the line ``0 .. old - 1`` (nearest
    interpolation is separable, and every axis uses the same index rule)."""
    line = torch.arange(old, dtype=torch.float32).view(1, 1, old)
    return tuple(int(v) for v in F.interpolate(line, size=(new,), mode="nearest").view(-1).tolist())


def resize_boxes(
    starts: Spans, stops: Spans, old: Sequence[int], new: Sequence[int]
) -> tuple[Spans, Spans]:
    """Boxes after DETR's nearest resize from ``old`` to ``new`` cells, on the host.

    A cell of the new grid is valid when the cell it copies from is valid, and the source index
    never decreases along an axis, so a box stays a box: the new box holds the cells whose
    source lies in ``[start, stop)``. Exactly what :func:`interpolate_mask` gives (tested).
    Empty boxes (and boxes that vanish) become ``(0, .., 0)`` twice.
    """
    n = len(old)
    out_starts, out_stops = [], []
    for start, stop in zip(starts, stops):
        s2, e2 = [], []
        for axis in range(n):
            if old[axis] == 0 or new[axis] == 0:
                s2.append(0)
                e2.append(0)
                continue
            src = _nearest_sources(old[axis], new[axis])
            s2.append(bisect.bisect_left(src, start[axis]))
            e2.append(bisect.bisect_left(src, stop[axis]))
        if any(e <= s for s, e in zip(s2, e2)):
            s2 = e2 = [0] * n
        out_starts.append(tuple(s2))
        out_stops.append(tuple(e2))
    return tuple(out_starts), tuple(out_stops)


def resize_image_sizes(
    image_sizes: Sequence[Sequence[int]], old: Sequence[int], new: Sequence[int]
) -> list[tuple[int, ...]]:
    """Valid sizes after a nearest resize of an origin-anchored padding mask from ``old`` to ``new``.

    Computed on the host with the rule :func:`interpolate_mask` uses (see
    :meth:`vispos.Padding.resize`); no device tensor is read.

    Args:
        image_sizes (sequence of tuples): each item's valid size in the old grid.
        old, new (sequence of int): the old and new spatial sizes.

    Returns:
        list of tuples: each item's valid size in the new grid (0 along every axis of an item
        that has no valid cell left).

    Raises:
        ValueError: ``old`` and ``new`` have different lengths.

    References:
        DETR ``models/backbone.py`` (masks resized with nearest interpolation).
    """
    if len(old) != len(new):
        raise ValueError(f"old {tuple(old)} and new {tuple(new)} must have the same number of axes")
    zeros = tuple(0 for _ in old)
    starts = tuple(zeros for _ in image_sizes)
    _, stops = resize_boxes(starts, tuple(tuple(s) for s in image_sizes), tuple(old), tuple(new))
    return list(stops)


# ---------------------------------------------------------------------------- valid ratios
def ratios(counts: Tensor, spatial: Sequence[int], dtype: torch.dtype) -> Tensor:
    """``counts[:, i] / S_i`` in ``dtype``, last axis first (0 along a zero-size axis): the one
    formula behind :func:`valid_ratios` and :meth:`vispos.Padding.valid_ratios`."""
    counts = counts.to(dtype)
    out = [counts[:, i] / spatial[i] if spatial[i] else counts[:, i] for i in range(len(spatial))]
    return torch.stack(out[::-1], -1)


def valid_ratios(mask: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """Deformable-DETR's ``get_valid_ratio`` for 1 to 3 spatial axes.

    Along axis ``i`` the valid length is the number of valid cells in the line through index 0 of
    every other axis (Deformable-DETR's items sit at the origin), divided by the padded size
    ``S_i``.

    Args:
        mask (Tensor[B, *S], bool): True = padding.
        dtype (torch.dtype): of the result.

    Returns:
        Tensor[B, n]: ratios in **reversed** axis order (``(w, h)`` in 2D), as Deformable-DETR.
        0 along a zero-size axis.

    Raises:
        TypeError: ``mask`` is not a bool tensor.
        ValueError: ``mask`` has no spatial axis.

    References:
        Zhu et al., Deformable DETR, ICLR 2021 (``DeformableTransformer.get_valid_ratio``).
    """
    check_mask(mask)
    if mask.dim() < 2:
        raise ValueError(f"mask must have shape (B, *S) with at least one spatial axis, got {tuple(mask.shape)}")
    return ratios(rectangular_sizes(mask), tuple(mask.shape[1:]), dtype)
