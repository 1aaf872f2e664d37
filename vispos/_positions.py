"""DETR's positions of a padded batch: line tables for boxes, per-cell counts for any mask.

Pure functions from a :class:`~vispos.Padding` to the positions the sine core embeds. DETR
counts valid cells along every axis with a cumulative sum (the first valid cell is 1, padding
repeats the last count, 0 before any valid cell) and, with ``normalize``, maps a count ``p`` to
``(p + offset) / (p_last + eps) * scale`` where ``p_last`` is the line's final count
(:class:`PositionRule`). In physical units (a per-item ``spacing``, mm per cell along each
axis) a count becomes a length, ``(p + offset) * s``, normalised by the line's own length
``p_last * s`` or by one ``extent`` common to every axis; spacing 1 gives the cell numbers bit
for bit. Three shapes of the same numbers, bit for bit:

* no padding: one broadcastable ``arange`` per axis (:func:`grid_positions`);
* boxes (rectangular padding): every line that crosses item ``b``'s box holds the same
  positions, and every other line one value, so a table ``[B, n, max S + 1]`` holds them all
  (:func:`line_table`; column 0 is the padding-only line, column ``1 + c`` cell ``c``);
* any mask: the counts cell by cell (:func:`cumulative_positions`), or, where a block takes
  few distinct values, those values and an index (:func:`distinct_positions`).

Encoders that place an item from its own box rather than by counting (SAM's random Fourier
features with ``frame="item"``, the mask-aware RT-DETR table) take each item's box
instead: :func:`item_boxes` (the box of a rectangular padding, the bounding box of the valid
cells of any other mask) and the offsets ``i - start`` of every index from it.

Which one a call takes is decided by the padding's ``kind`` and by ``host`` (may host facts be
used, :func:`vispos._tracing.host_facts`), nothing else.

References:
    Carion et al., End-to-End Object Detection with Transformers, ECCV 2020
    (``PositionEmbeddingSine.forward``); Zhu et al., Deformable DETR, ICLR 2021 (``offset=-0.5``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from . import _tracing
from .padding._mask_checks import check_mask
from .padding._mask_origin import rectangular_sizes
from .padding._masks import box_tensors
from .padding import Padding

__all__ = [
    "PositionRule",
    "cumulative_positions",
    "grid_positions",
    "LineTable",
    "line_table",
    "box_positions",
    "detr_positions",
    "distinct_positions",
    "item_boxes",
]


class PositionRule(NamedTuple):
    """DETR's map from a 1-based valid count to a position (see the module docstring).

    ``extent`` (optional, with ``normalize``): the length mapped to ``scale``, the same for
    every axis and item, instead of each line's own valid length.
    """

    normalize: bool = False
    scale: float = 2 * math.pi
    offset: float = 0.0
    eps: float = 1e-6
    extent: float | None = None

    def __call__(self, count: Tensor, last: Tensor | None, spacing: Tensor | None = None) -> Tensor:
        """Positions of ``count`` (float32) in lines whose final count is ``last``. ``spacing``
        (float32, broadcastable to ``count`` and ``last``): the size of a cell, so that positions
        are lengths ``(count + offset) * spacing`` (multiplying by 1 is exact: spacing 1 gives
        the cell numbers bit for bit). Float32 NumPy arrays work too, with the same bits: a
        Python number meets a float32 array as a float32 in NumPy and in torch alike."""
        if self.offset:  # counts are >= 0, so ``count + 0.0`` would be ``count`` bit for bit: skipped
            count = count + self.offset
        if spacing is not None:
            count = count * spacing
        if not self.normalize:
            return count
        if self.extent is not None:
            return count / self.extent * self.scale
        denominator = (last if spacing is None else last * spacing) + self.eps
        return count / denominator * self.scale


def cumulative_positions(
    mask: Tensor,
    *,
    normalize: bool = False,
    scale: float = 2 * math.pi,
    offset: float = 0.0,
    eps: float = 1e-6,
    extent: float | None = None,
    spacing: Tensor | None = None,
) -> list[Tensor]:
    """DETR's positions: a cumulative count of valid cells along every spatial axis.

    Along axis ``i`` the position of a cell is the number of valid cells up to and including it
    in its line (the first valid cell is 1; padding repeats the last count, or 0 before any valid
    cell). With ``normalize`` it becomes ``(p + offset) / (p_last + eps) * scale`` where
    ``p_last`` is the count at the line's end; otherwise ``p + offset``. With ``spacing`` the
    counts are lengths: ``(p + offset) * s`` and ``(p + offset) * s / (p_last * s + eps) * scale``
    (or ``/ extent * scale``).

    Args:
        mask (Tensor[B, *S], bool): True marks padding.
        normalize, scale, offset, eps, extent: as in :class:`~vispos.PositionEmbeddingSine`.
        spacing (Tensor[B, n], float32, optional): each item's cell size along each axis (mm),
            on ``mask``'s device.

    Returns:
        list of Tensor[B, *S], float32: one per spatial axis, in tensor axis order.

    Raises:
        TypeError: ``mask`` is not a bool tensor (with a hint on how to convert).

    References:
        DETR ``PositionEmbeddingSine.forward``; Deformable DETR for ``offset=-0.5``.
    """
    check_mask(mask)
    rule = PositionRule(normalize, scale, offset, eps, extent)
    not_mask = ~mask
    n = mask.dim() - 1
    out = []
    for axis in range(1, mask.dim()):
        count = not_mask.cumsum(axis, dtype=torch.float32)
        s = None if spacing is None else spacing[:, axis - 1].reshape(-1, *([1] * n))
        out.append(rule(count, count.narrow(axis, count.shape[axis] - 1, 1), spacing=s))
    return out


def grid_positions(spatial: Sequence[int], device: torch.device, rule: PositionRule) -> list[Tensor]:
    """No padding: axis ``i`` gets ``arange(1, S_i + 1)`` through ``rule``, shaped
    ``(1, .., S_i, .., 1)`` (rank ``1 + n``, broadcastable; sizes stay symbolic when traced)."""
    n = len(spatial)
    out = []
    for i, size in enumerate(spatial):
        count = torch.arange(1, size + 1, device=device, dtype=torch.float32)
        view = [1] * (n + 1)
        view[i + 1] = size
        out.append(rule(count, count[-1:]).view(view))
    return out


class LineTable(NamedTuple):
    """The positions of a rectangular (or unpadded) batch, as :func:`~vispos._sincos.sincos_embed_lines`
    takes them.

    Attributes:
        lines (Tensor[B', n, M], float32): column 0 the padding-only line, ``1 + c`` cell ``c``.
        valid (Tensor[B', n, M - 1] bool or None): cell ``c`` of axis ``j`` lies in item ``b``'s
            box; None where ``spans`` replace it (CPU) or in 1D (rows are whole lines).
        spans (tuple or None): host ``(starts, stops)`` of the items in ``lines``; None when
            host facts may not be used.
        window (tuple of int or None), rows (Tensor[B - W] int64 or None): 1D items that share
            a row (see :func:`~vispos._sincos.sincos_embed_lines`).
    """

    lines: Tensor
    valid: Tensor | None
    spans: tuple | None
    window: tuple[int, int] | None = None
    rows: Tensor | None = None


def _host_lines(
    starts: Sequence[Sequence[int]], stops: Sequence[Sequence[int]], spatial: Sequence[int],
    at_origin: bool, rule: PositionRule, with_valid: bool,
) -> list[np.ndarray]:
    """:func:`line_table`'s ``lines`` (and ``valid``) computed on the host with NumPy, from boxes
    known there: float32 throughout, the same IEEE operations in the same order as the device
    form (a Python number meets a float32 array as float32, NumPy's rule for scalars, as torch
    does), hence the same bits. A few microseconds per call where torch dispatches five ops."""
    shape = (len(starts), len(spatial))
    first = np.asarray(starts, dtype=np.float32).reshape(shape)[..., None]  # [B, n, 1]
    last = np.asarray(stops, dtype=np.float32).reshape(shape)[..., None] - first
    count = np.arange(max(spatial) + 1, dtype=np.float32)
    shifted = count if at_origin else np.maximum(count - first, np.float32(0))
    capped = np.minimum(shifted, last)  # DETR's count: 1-based, stopped at the last valid cell
    if rule.normalize and rule.offset:  # see line_table: the padding-only column has length 0
        lines = rule(capped, last * np.minimum(count, np.float32(1)))
    else:
        lines = rule(capped, last)
    out = [np.ascontiguousarray(lines, dtype=np.float32)]  # [B, n, M], as ``capped``
    if with_valid:
        cells = count[1:]
        valid = cells <= last if at_origin else (cells > first) & (cells <= first + last)
        out.append(np.ascontiguousarray(valid))
    return out


def _shortest_window(values: Sequence) -> tuple[int, int]:
    """The shortest range ``[start, stop)`` of ``values`` that holds each distinct value."""
    need = len(set(values))
    seen: dict = {}
    best = (0, len(values))
    start = 0
    for stop, v in enumerate(values, 1):
        seen[v] = seen.get(v, 0) + 1
        while seen[values[start]] > 1:
            seen[values[start]] -= 1
            start += 1
        if len(seen) == need and stop - start < best[1] - best[0]:
            best = (start, stop)
    return best


def line_table(
    padding: Padding,
    host: bool,
    rule: PositionRule,
    *,
    selects: bool = False,
    share_rows: bool = False,
    spacing: Tensor | None = None,
) -> LineTable:
    """The line table of a ``"none"`` / ``"rectangular"`` padding.

    With ``host`` the boxes come from the padding's host values: in cells (no ``spacing``, no
    ``extent``) the whole table is computed there with NumPy (:func:`_host_lines`, the same
    bits) and travels in one small copy, none on the CPU; otherwise the sizes travel and the
    table is computed on the device. No synchronisation either way. Without it (tracing, CUDA graph capture) only boxes at the origin
    are supported: their sizes are read from the mask on the device, so a graph stays dynamic
    in them. ``selects``: always build ``valid`` (else only where host spans cannot replace it);
    ``share_rows``: 1D items of one box share a row (``window`` / ``rows``; not with a
    ``spacing``, ``Tensor[B, n]`` float32 on the padding's device, which makes every item's
    lines its own).
    """
    spatial, device = padding.spatial, padding.device
    n = len(spatial)
    window = rows = starts_f = spans = None
    if host:
        starts, stops = padding.starts, padding.stops
        outside = None
        if n == 1 and share_rows and spacing is None:  # 1-D: items with one box share their line
            keys = list(zip(starts, stops))
            begin, end = _shortest_window(keys)
            if end - begin < len(keys):
                first: dict = {}
                for k in range(begin, end):
                    first.setdefault(keys[k], k - begin)
                outside = [first[key] for k, key in enumerate(keys) if not begin <= k < end]
                starts, stops, window = starts[begin:end], stops[begin:end], (begin, end)
        spans = (starts, stops)
        with_valid = n > 1 and (selects or not _tracing.host_side(device))
        if spacing is None and rule.extent is None:  # cells: the whole table from the host
            arrays = _host_lines(starts, stops, spatial, padding.at_origin, rule, with_valid)
            if outside is not None:
                arrays.append(np.asarray(outside, dtype=np.int64))
            moved = _tracing.host_arrays(arrays, device)  # one copy for all, none on the CPU
            valid = moved[1] if with_valid else None
            return LineTable(moved[0], valid, spans, window, moved[-1] if outside is not None else None)
        if outside is not None:
            rows = _tracing.host_tensor(outside, torch.int64, device)
        host_rows = [[[e - s for s, e in zip(a, b)] for a, b in zip(starts, stops)]]
        if not padding.at_origin:
            host_rows.append([list(s) for s in starts])
        table = _tracing.host_tensor(host_rows, torch.float32, device)  # one copy for all
        sizes_f = table[0]
        if not padding.at_origin:
            starts_f = table[-1].unsqueeze(-1)
    else:
        if not padding.at_origin:
            raise ValueError("boxes away from the origin need host facts; embed the mask instead")
        sizes_f = rectangular_sizes(padding.mask).to(torch.float32)
    count = torch.arange(max(spatial) + 1, device=device, dtype=torch.float32)
    last = sizes_f.unsqueeze(-1)  # [B, n, 1]
    shifted = count if starts_f is None else (count - starts_f).clamp_(min=0)
    capped = torch.minimum(shifted, last)  # DETR's count: 1-based, stopped at the last valid cell
    per_cell = None if spacing is None else spacing.unsqueeze(-1)  # [B, n, 1]
    if rule.normalize and rule.offset:
        # the padding-only column (count 0) has a valid length of 0; with offset 0 its
        # position is 0 over any length, so the item's own length gives the same bits
        lines = rule(capped, last * count.clamp(max=1), spacing=per_cell)
    else:
        lines = rule(capped, last, spacing=per_cell)
    valid = None
    if n > 1 and (selects or spans is None or not _tracing.host_side(device)):
        cells = count[1:]
        valid = cells <= last if starts_f is None else (cells > starts_f) & (cells <= starts_f + last)
    return LineTable(lines, valid, spans, window, rows)


def box_positions(table: LineTable, spatial: Sequence[int]) -> list[Tensor]:
    """Per-axis positions ``Tensor[B, *S]`` (broadcast) of a line table built with ``selects``:
    the crossing line where every other axis is inside the box, the padding-only value
    elsewhere. For embedders that take position tensors (:func:`~vispos._sincos.sincos_embed`)."""
    lines, valid = table.lines, table.valid
    batch, n = lines.shape[0], len(spatial)
    out = []
    for i, size in enumerate(spatial):
        view = [batch] + [1] * n
        view[1 + i] = size
        line = lines[:, i, 1 : 1 + size].reshape(view)
        inside = None
        for j in range(n):
            if j != i:
                v = [batch] + [1] * n
                v[1 + j] = spatial[j]
                c = valid[:, j, : spatial[j]].reshape(v)
                inside = c if inside is None else inside & c
        outside = lines[:, i, :1].reshape([batch] + [1] * n)
        out.append(line if inside is None else torch.where(inside, line, outside))
    return out


def detr_positions(padding: Padding, host: bool, rule: PositionRule, spacing: Tensor | None = None) -> list[Tensor]:
    """DETR's positions of ``padding``, one broadcastable float32 tensor per axis: the
    generic form, for embedders over :func:`~vispos._sincos.sincos_embed`. ``spacing``
    (``Tensor[B, n]``, float32): per-item cell sizes; a ``"none"`` padding then has one item
    per row of it (the caller makes it rectangular)."""
    if padding.kind == "none" and spacing is None:
        return grid_positions(padding.spatial, padding.device, rule)
    if padding.kind != "arbitrary" and (host or padding.at_origin):
        return box_positions(line_table(padding, host, rule, selects=True, spacing=spacing), padding.spatial)
    return cumulative_positions(
        padding.mask, normalize=rule.normalize, scale=rule.scale, offset=rule.offset, eps=rule.eps,
        extent=rule.extent, spacing=spacing,
    )


def distinct_positions(
    valid: np.ndarray, axis: int, rule: PositionRule
) -> tuple[Tensor, Tensor] | None:
    """A block's positions as ``(values[K] float32, index[B, *S] int64)`` (CPU tensors) when its
    cells take few distinct values (at most ``S_i + 1`` counts per valid length), or None when
    there are too many to pay off. Reads a mask on the host: ``valid`` is its NumPy form
    (True = valid), and the counts, lengths and index are found with NumPy (no torch op; the
    positions by the same float32 steps as on a device, hence the same bits)."""
    size = valid.shape[axis]
    count = np.cumsum(valid, axis=axis, dtype=np.int64)  # 1-based
    counts = np.arange(size + 1, dtype=np.float32)
    if rule.normalize:  # the position depends on the count and on the line's valid length
        last = count.take([size - 1], axis=axis)
        lengths, inverse = np.unique(last, return_inverse=True)
        if 4 * lengths.size * (size + 1) > count.size:
            return None
        values = rule(counts, lengths.astype(np.float32)[:, None])
        index = inverse.reshape(last.shape) * (size + 1) + count
    else:
        if 4 * (size + 1) > count.size:
            return None
        values, index = rule(counts, None), count
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)), torch.from_numpy(index)


def item_boxes(
    padding: Padding, host: bool, dtype: torch.dtype = torch.float32
) -> tuple[list[Tensor], Tensor] | None:
    """Each item's own origin and extent: ``(offsets, sizes)``, or None for a ``"none"`` padding
    (every item is the whole grid).

    An item's box is its valid box for ``"rectangular"`` padding (at the origin or not: MONAI's
    symmetric padding centres it) and the bounding box of its valid cells for ``"arbitrary"``
    (an item without a valid cell: start 0, size 0). With ``host`` the boxes known on the host
    travel in one small copy (no synchronisation; an arbitrary mask on the CPU is read there);
    otherwise they are found on the mask's device (:func:`~vispos.padding._masks.box_tensors`).

    Args:
        padding (Padding): the batch's padding.
        host (bool): host facts may be used (:func:`vispos._tracing.host_facts`).
        dtype (torch.dtype): of the results (float32 or float64).

    Returns:
        ``offsets``: per spatial axis ``a``, ``Tensor[B, S_a]``, the index ``i`` less the item's
        first valid index (negative before the box, ``>= size`` after it); ``sizes``:
        ``Tensor[B, n]``, the box's size along each axis. Both on the padding's device.
    """
    if padding.kind == "none":
        return None
    spatial, device = padding.spatial, padding.device
    if host and (padding.kind == "rectangular" or _tracing.host_side(device)):
        starts, sizes = _tracing.host_tensor([list(padding.starts), list(padding.sizes)], dtype, device)
    else:
        first, stop = box_tensors(padding.mask)
        starts, sizes = first.to(dtype), (stop - first).to(dtype)
    offsets = [
        torch.arange(size, device=device, dtype=dtype) - starts[:, axis : axis + 1]
        for axis, size in enumerate(spatial)
    ]
    return offsets, sizes
