"""Boxes of padding masks: bounding boxes, the boxes a mask is exactly, and masks from boxes.

A *box* is a per-item valid region ``[start_i, stop_i)`` along every axis of a padding mask
(``Tensor[B, *S]``, bool, True = padding): DETR's padding is the box anchored at the origin,
MONAI's symmetric padding centres it. :func:`find_boxes` decides whether a mask is boxes (the
reading behind :meth:`vispos.Padding.from_mask`), :func:`boxes_mask` builds the mask of boxes,
:func:`bounding_boxes` / :func:`box_tensors` give the extent of any mask. The other tensor
algorithms behind :class:`vispos.Padding` live beside this room in :mod:`vispos.padding`:
argument checks (:mod:`~vispos.padding._mask_checks`), origin-anchored sizes
(:mod:`~vispos.padding._mask_origin`, read with NumPy on the host by
:mod:`~vispos.padding._masks_host`), resizing (:mod:`~vispos.padding._mask_resize`) and the views
models consume (:mod:`~vispos.padding._mask_views`). :mod:`vispos.padding` re-exports the public
ones (their documented home); nobody else re-derives these facts.

Empty inputs (an empty batch, a zero-size axis) give empty results of the documented shape.

References:
    Carion et al., End-to-End Object Detection with Transformers, ECCV 2020 (``util/misc.py``);
    detectron2 ``ImageList.image_sizes``; MONAI ``SpatialPad(method="symmetric")``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import chain
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .. import _tracing
from ._mask_checks import Spans, check_spans, check_spatial_mask
from ._masks_host import origin_mismatch

__all__ = ["mask_sizes", "bounding_boxes", "box_tensors", "find_boxes", "boxes_mask", "boxes_masks", "sized_boxes"]


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
    starts, stops = box_tensors(mask)
    table = torch.cat([starts, stops], 1).tolist()  # [B, 2n]: starts, then stops
    return tuple(tuple(r[:n]) for r in table), tuple(tuple(r[n:]) for r in table)


def box_tensors(mask: Tensor) -> tuple[Tensor, Tensor]:
    """:func:`bounding_boxes` on the mask's device, without a synchronisation (for traced calls
    and accelerators): ``(starts, stops)``, each ``Tensor[B, n]`` int64 (both 0 for an item
    without a valid cell or along a zero-size axis)."""
    n = mask.dim() - 1
    if mask.numel() == 0:
        zeros = torch.zeros((mask.shape[0], n), dtype=torch.int64, device=mask.device)
        return zeros, zeros
    valid, starts, stops = ~mask, [], []
    for axis in range(1, n + 1):
        other = [d for d in range(1, n + 1) if d != axis]
        along = valid.any(dim=other) if other else valid  # (B, S_axis)
        found = along.any(1)
        first = along.to(torch.uint8).argmax(1)
        last = along.shape[1] - along.flip(1).to(torch.uint8).argmax(1)
        starts.append(torch.where(found, first, 0))
        stops.append(torch.where(found, last, 0))
    return torch.stack(starts, 1), torch.stack(stops, 1)


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
    sizes, wrong = origin_mismatch(mask, spatial)  # wrong: a cell both padding and in the box
    if not any(wrong):
        empty = tuple(0 for _ in range(n))
        return (empty,) * batch, tuple(empty if 0 in s else tuple(s) for s in sizes)
    origin = mask[(slice(None),) + (0,) * n].tolist()  # origin cell padded, per item
    if any(w and not o for w, o in zip(wrong, origin)):
        return None
    starts, stops = bounding_boxes(mask)
    return (starts, stops) if torch.equal(mask, boxes_mask(starts, stops, spatial, mask.device)) else None


def boxes_mask(
    starts: Spans, stops: Spans, spatial: Sequence[int], device: torch.device | str | None = None,
    *, pin_memory: bool = False,
) -> Tensor:
    """``Tensor[B, *S]`` bool, True outside item ``b``'s box ``[starts[b], stops[b])``, the whole batch
    at once (:func:`boxes_masks` of one mask: a GPU launches a copy and ``n - 1`` kernels for any
    ``B``). While tracing or capturing a CUDA graph (no host values may travel), or into pinned
    memory: all padding, then each box cleared by slicing."""
    device = torch.device("cpu") if device is None else torch.device(device)
    if pin_memory or not _tracing.host_facts(device):
        return _sliced_boxes_mask(starts, stops, tuple(int(s) for s in spatial), device, pin_memory)
    return boxes_masks([(starts, stops, spatial)], device)[0]


def boxes_masks(boxes: Sequence[tuple[Spans, Spans, Sequence[int]]], device: torch.device) -> list[Tensor]:
    """The masks of several boxes at once: for each ``(starts, stops, spatial)``, ``Tensor[B, *S]``
    bool, True outside item ``b``'s box. Per mask and axis a ``(B, S_i)`` table of the cells outside
    each item's span is built on the host (every table of the call in one NumPy comparison); every
    table travels in one transfer (:func:`vispos._tracing.host_arrays`), then each mask is one
    broadcast ``|`` per axis after the first, on the device. On the CPU a small mask (at most
    ``2 ** 16`` cells) is that ``|`` in NumPy, shared as it is (a torch op costs more than the
    cells). No loop over items, no read of the device. The caller checks
    :func:`vispos._tracing.host_facts` (host values may travel).

    Args:
        boxes (sequence of (Spans, Spans, sequence of int)): each mask's per-item starts and stops
            (an empty item: both ``(0, .., 0)``) and its spatial size ``S``.
        device (torch.device): where the masks are built.

    Returns:
        list of Tensor[B, *S], bool: one fresh, contiguous mask per entry.

    References:
        Carion et al., DETR ``util/misc.py`` (mask True = padding).
    """
    shapes, lo, hi = [], [], []
    for starts, stops, spatial in boxes:
        spatial = tuple(int(s) for s in spatial)
        batch, n = len(starts), len(spatial)
        lengths = set(map(len, starts))
        lengths.update(map(len, stops))
        if batch and lengths != {n} or len(stops) != batch:  # NumPy's own error, as it was
            np.asarray(starts, dtype=np.int64).reshape(batch, n)
            np.asarray(stops, dtype=np.int64).reshape(batch, n)
        lo.extend(chain.from_iterable(starts))
        hi.extend(chain.from_iterable(stops))
        shapes.append((batch, spatial))
    # one row per (mask, item, axis): cells 0 .. max S - 1 outside [start, stop); each table a view
    widest = max((size for _, spatial in shapes for size in spatial), default=0)
    cells = np.arange(widest)
    rows = (cells < np.array(lo, dtype=np.int64)[:, None]) | (cells >= np.array(hi, dtype=np.int64)[:, None])
    on_cpu = device.type == "cpu"
    arrays, layout, offset = [], [], 0
    for batch, spatial in shapes:
        n = len(spatial)
        block = rows[offset : offset + batch * n].reshape(batch, n, widest)
        offset += batch * n
        tables = [block[:, axis, : max(size, 0)] for axis, size in enumerate(spatial)]
        if n == 1 or (on_cpu and batch * math.prod(spatial) <= _HOST_CELLS):
            mask = np.ascontiguousarray(tables[0]) if n == 1 else _along(tables[0], 0, n)
            for axis in range(1, n):  # the same broadcast | as on the device, in NumPy
                mask = np.logical_or(mask, _along(tables[axis], axis, n), order="C")
            layout.append(None)
            arrays.append(mask)
        else:
            layout.append(len(tables))
            arrays.extend(tables)
    sent = iter(_tracing.host_arrays(arrays, device))
    masks = []
    for (batch, spatial), count in zip(shapes, layout):
        if count is None:
            masks.append(next(sent))
            continue
        mask = None
        for i in range(count):
            table = next(sent)
            view = table.view((batch,) + tuple(size if j == i else 1 for j, size in enumerate(spatial)))
            mask = view if mask is None else torch.logical_or(mask, view)
        masks.append(mask)
    return masks


#: the most cells of a mask that :func:`boxes_masks` combines with NumPy on the CPU (above: torch)
_HOST_CELLS = 1 << 16


def _along(table: np.ndarray, axis: int, n: int) -> np.ndarray:
    """A ``(B, S_axis)`` table as ``(B, 1, .., S_axis, .., 1)`` over ``n`` axes, ``S_axis`` at
    ``1 + axis`` (the view the device path takes), for a broadcast ``|``."""
    return table.reshape((table.shape[0],) + (1,) * axis + (table.shape[1],) + (1,) * (n - 1 - axis))


def _sliced_boxes_mask(starts: Spans, stops: Spans, spatial: tuple[int, ...], device: torch.device,
                       pin_memory: bool) -> Tensor:
    """:func:`boxes_mask` without host values on the device (while tracing or capturing, or into
    pinned memory): all padding, then each box cleared by slicing (one write per item)."""
    mask = torch.ones((len(starts), *spatial), dtype=torch.bool, device=device, pin_memory=pin_memory)
    for b, (start, stop) in enumerate(zip(starts, stops)):
        if all(e > s for s, e in zip(start, stop)):
            mask[(b, *(slice(s, e) for s, e in zip(start, stop)))] = False
    return mask


def sized_boxes(sizes: Spans, spatial: tuple[int, ...], starts: Any = None) -> tuple[Spans, Spans]:
    """The boxes ``(starts, stops)`` of items of valid ``sizes`` placed at ``starts`` in ``spatial``.

    Args:
        sizes (Spans): each item's valid size per axis (checked spans).
        spatial (tuple of int): ``S``, the padded size.
        starts (Spans-like, "symmetric" or None): the first valid index per item and axis (checked
            here); None: 0 (DETR); ``"symmetric"``: ``(S_i - size) // 2`` (MONAI's ``SpatialPad``).

    Returns:
        (Spans, Spans): starts and stops; an item with a size 0 along some axis gets the one
        canonical empty box ``(0, .., 0)`` twice.

    Raises:
        TypeError: ``starts`` not per-item ints. ValueError: an unknown string, another number of
            items than ``sizes``, a negative size or start, a box that does not fit in ``spatial``.

    References:
        detectron2 ``ImageList.from_tensors``; MONAI ``SpatialPad(method="symmetric")``.
    """
    if isinstance(starts, str):
        if starts != "symmetric":
            raise ValueError(f"starts must be per-item ints or 'symmetric', got {starts!r}")
        starts = tuple(tuple(max(0, (s - v) // 2) for s, v in zip(spatial, size)) for size in sizes)
    elif starts is None:
        starts = tuple(tuple(0 for _ in spatial) for _ in sizes)
    else:
        starts = check_spans(starts, "starts", len(spatial))
        if len(starts) != len(sizes):
            raise ValueError(f"starts has {len(starts)} items but sizes has {len(sizes)}")
    out_starts, out_stops = [], []
    for i, (start, size) in enumerate(zip(starts, sizes)):
        if any(v < 0 for v in size) or any(v < 0 for v in start):
            raise ValueError(f"sizes[{i}] = {size} and starts[{i}] = {start} must be >= 0")
        stop = tuple(s + v for s, v in zip(start, size))
        if any(e > m for e, m in zip(stop, spatial)):
            raise ValueError(f"item {i} (starts {start}, sizes {size}) does not fit in the padded size {spatial}")
        if 0 in size:  # no valid cell: one canonical empty box
            start = stop = tuple(0 for _ in spatial)
        out_starts.append(start)
        out_stops.append(stop)
    return tuple(out_starts), tuple(out_stops)
