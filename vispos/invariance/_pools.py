"""Pooling and fills over each item's own cells: a padded batch's padding filled, global and
average pooling that read only valid cells, each item's cell count.

Every function takes the feature map's :class:`~vispos.Padding` (None: no padding, the stock op
runs). A rectangular padding (every batch vispos builds) is read as each item's box, a view that
touches only valid cells; an arbitrary mask falls back to one masked pass over the canvas.

References:
    ``torch.nn.AvgPool2d`` (output size, divisor) and ATen ``AvgPoolKernel.cpp``; Liu et al.,
    Partial Convolution based Padding, 2018 (a window that sees only valid cells).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ..padding import Padding

__all__ = ["box_views", "fill", "filled", "valid_count", "global_pool", "cell_count", "avg_pool"]


def box_views(padding: Padding) -> list[tuple[int, tuple[slice, ...], int]]:
    """``(item, slices of its box, number of cells)`` for every item with a valid cell."""
    out = []
    for b, (start, stop) in enumerate(zip(padding.starts, padding.stops)):
        count = 1
        for s, e in zip(start, stop):
            count *= e - s
        if count:
            out.append((b, tuple(slice(s, e) for s, e in zip(start, stop)), count))
    return out


#: below this many elements one masked write over the map beats two slice writes per item and axis
_STRIPS_FROM = 1 << 20


def fill(x: Tensor, padding: Padding, value: float) -> Tensor:
    """Writes ``value`` into every padded cell of ``x`` **in place**: strip by strip on large maps
    with a box per item (only padded cells are touched), one masked write on small ones or for an
    arbitrary mask. The caller guarantees autograd does not need ``x``'s old values.

    Args:
        x (Tensor[B, C, *S]): features, channels first. padding (Padding): of shape ``(B, *S)``.
        value (float): 0 before a convolution, ``-inf`` before a max pool.

    Returns:
        Tensor[B, C, *S]: ``x`` itself.
    """
    if x.numel() < _STRIPS_FROM or padding.kind == "arbitrary":
        return x.masked_fill_(padding.mask.unsqueeze(1), value)
    n = padding.num_axes
    canvas = padding.spatial
    for b, (start, stop) in enumerate(zip(padding.starts, padding.stops)):
        if any(e == s for s, e in zip(start, stop)):
            x[b].fill_(value)
            continue
        inner: list[slice] = []
        for axis in range(n):  # cells before / after the box on this axis, inside the box before it
            head = (b, slice(None), *inner)
            rest = (slice(None),) * (n - axis - 1)
            if start[axis] > 0:
                x[(*head, slice(0, start[axis]), *rest)] = value
            if stop[axis] < canvas[axis]:
                x[(*head, slice(stop[axis], None), *rest)] = value
            inner.append(slice(start[axis], stop[axis]))
    return x


def filled(x: Tensor, padding: Padding | None, value: float) -> Tensor:
    """A copy of ``x`` with ``value`` in every padded cell (``x`` itself without padding).

    Args:
        x (Tensor[B, C, *S]): features. padding (Padding, optional): of shape ``(B, *S)``.
        value (float): the fill.

    Returns:
        Tensor[B, C, *S]: ``x``'s dtype.
    """
    if padding is None or padding.kind == "none":
        return x
    return x.masked_fill(padding.mask.unsqueeze(1), value)


def valid_count(pad: Tensor, dims: Sequence[int], dtype: torch.dtype) -> Tensor:
    """Number of valid cells over ``dims`` of a mask ``pad`` (True = padding), as ``dtype``, at
    least 1."""
    return (~pad).sum(tuple(dims), keepdim=True, dtype=dtype).clamp_(min=1)


def _l2_norm(x: Tensor, dims: tuple[int, ...], keepdim: bool = False) -> Tensor:
    return torch.linalg.vector_norm(x, 2, dims, keepdim=keepdim)


_REDUCTIONS = {"mean": torch.mean, "sum": torch.sum, "max": torch.amax, "norm": _l2_norm}


def global_pool(x: Tensor, padding: Padding | None, mode: str, dims: Sequence[int], keepdim: bool) -> Tensor:
    """Mean, sum, max or L2 norm of each item over its valid cells (global pooling,
    squeeze-excitation, ConvNeXt V2's global response norm): a reduction per item's box, or a
    masked reduction for an arbitrary mask.

    Args:
        x (Tensor[B, C, *S]): features. padding (Padding, optional): None: the plain reduction.
        mode (str): ``"mean"``, ``"sum"``, ``"max"`` or ``"norm"`` (L2). dims (sequence of int):
        every spatial dim of ``x``. keepdim (bool): keep the reduced dims (size 1).

    Returns:
        Tensor[B, C] (``[B, C, 1, ...]`` with ``keepdim``) in ``x``'s dtype; zeros for an item
        without a valid cell.
    """
    dims = tuple(dims)
    reduce = _REDUCTIONS[mode]
    if padding is None or padding.kind == "none":
        return reduce(x, dims, keepdim=keepdim)
    if padding.kind == "arbitrary":
        pad = padding.mask.unsqueeze(1)
        if mode in ("max", "norm"):
            src = x.masked_fill(pad, float("-inf") if mode == "max" else 0.0)
            return reduce(src, dims, keepdim=keepdim)
        total = x.masked_fill(pad, 0).sum(dims, keepdim=True)
        if mode == "mean":
            total = total / valid_count(pad, dims, total.dtype)
        return total if keepdim else total.flatten(1)
    parts = [x.new_zeros((1, x.shape[1]) + (1,) * len(dims))] * x.shape[0]
    for b, region, _ in box_views(padding):
        parts[b] = reduce(x[(slice(b, b + 1), slice(None), *region)], dims, keepdim=True)
    out = torch.cat(parts, 0)
    return out if keepdim else out.flatten(1)


def cell_count(x: Tensor, padding: Padding | None, dims: Sequence[int], keepdim: bool) -> Tensor:
    """The number of each item's own cells over the spatial ``dims``: what ``H * W`` read from
    the item's own map is, in ``x``'s dtype (exact for any count below 2**24 in float32).

    Returns:
        Tensor[B, 1] (``[B, 1, 1, ...]`` with ``keepdim``); the canvas's count without padding.
    """
    dims = tuple(dims)
    shape = (x.shape[0], 1) + ((1,) * len(dims) if keepdim else ())
    if padding is None:
        count = 1
        for d in dims:
            count *= x.shape[d]
        return x.new_full(shape, count)
    out = x.new_zeros(shape)
    for b, _, count in box_views(padding):
        out[b] = count
    return out


_AVG_POOLS = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


def _edge_divisor(x: Tensor, out: Tensor, padding: Padding, kernel, stride, pad) -> Tensor:
    """Average pooling's divisor with ``ceil_mode=True, count_include_pad=True`` as each item
    alone gets it: torch shortens a window that runs past ``size + padding`` to the cells before
    that edge, ``min(k, size + 2 p - o s)`` per axis (``aten/src/ATen/native/cpu/AvgPoolKernel.cpp``),
    and the edge is the item's, not the canvas's. One line of divisors per axis, their product."""
    n = padding.num_axes
    total = None
    for axis in range(n):
        k, s, p = kernel[axis], stride[axis], pad[axis]
        line = x.new_full((x.shape[0], out.shape[2 + axis]), float(k))
        for b, (start, size) in enumerate(zip(padding.starts, padding.sizes)):
            first = start[axis] // s
            o = max(0, (size[axis] + 2 * p - k) // s + 1)  # the first window past the item's edge
            while size[axis] and first + o < line.shape[1]:
                reach = size[axis] + 2 * p - o * s
                if reach <= 0:
                    break
                if reach < k:
                    line[b, first + o] = float(reach)
                o += 1
        view = [x.shape[0], 1] + [1] * n
        view[2 + axis] = line.shape[1]
        line = line.view(view)
        total = line if total is None else total * line
    return total


def avg_pool(
    x: Tensor,
    padding: Padding | None,
    kernel_size: Sequence[int],
    stride: Sequence[int],
    pad: Sequence[int],
    ceil_mode: bool,
    count_include_pad: bool,
    divisor_override: int | None,
) -> Tensor:
    """Average pooling of a padded batch that divides as each item alone would.

    Zeros in the padding give every window's sum. The divisor: ``divisor_override``, or the
    kernel's size with ``count_include_pad=True`` (shortened at the item's own edge with
    ``ceil_mode``, where torch shortens a window that runs past the input), or the number of the
    item's own cells in the window with ``count_include_pad=False``.

    Args:
        x (Tensor[B, C, *S]): features, channels first.
        padding (Padding, optional): None runs the stock pool.
        kernel_size, stride, pad (sequence of int): per axis. ceil_mode, count_include_pad
            (bool), divisor_override (int, optional): as ``torch.nn.AvgPool2d``.

    Returns:
        Tensor[B, C, *S_out] in ``x``'s dtype.

    Raises:
        ValueError: ``ceil_mode`` with ``count_include_pad`` on an arbitrary mask.

    References:
        ``torch.nn.AvgPool2d`` (output size, divisor), ATen ``AvgPoolKernel.cpp``.
    """
    pool = _AVG_POOLS[x.dim() - 2]
    if padding is None:
        return pool(x, kernel_size, stride, pad, ceil_mode, count_include_pad, divisor_override)
    if padding.kind == "none":
        return pool(x, kernel_size, stride, pad, ceil_mode, count_include_pad, divisor_override)
    mask = padding.mask.unsqueeze(1)
    filled = x.masked_fill(mask, 0)
    if divisor_override is not None or (count_include_pad and not ceil_mode):
        return pool(filled, kernel_size, stride, pad, ceil_mode, count_include_pad, divisor_override)
    total = pool(filled, kernel_size, stride, pad, ceil_mode, True, 1)
    if count_include_pad:
        if padding.kind == "arbitrary":
            raise ValueError(
                "average pooling with ceil_mode=True and count_include_pad=True divides by a window cut at "
                "each item's edge, which an arbitrary mask (no box per item) does not define; got a padding "
                f"of kind {padding.kind!r}"
            )
        return total / _edge_divisor(x, total, padding, kernel_size, stride, pad)
    count = pool((~mask).to(total.dtype), kernel_size, stride, pad, ceil_mode, True, 1)
    return total / count.clamp_(min=1)
