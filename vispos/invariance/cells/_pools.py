"""Pooling and fills over each item's own cells: a padded batch's padding filled, global and
average pooling that read only valid cells, each item's cell count.

Every function takes the feature map's :class:`~vispos.Padding` (None: no padding, the stock op
runs). Reductions take every item at once: a select keeps the padding out, then one reduction over
the canvas, each item's count from the mask on its device (no loop over items, no read of the
device), for a box per item and an arbitrary mask alike. Fills are one masked write each (one
kernel on an accelerator; on large host maps, strips of each item's padding, where a masked write
is 3-20x slower), as one autograd node.

References:
    ``torch.nn.AvgPool2d`` (output size, divisor) and ATen ``AvgPoolKernel.cpp``; Liu et al.,
    Partial Convolution based Padding, 2018 (a window that sees only valid cells).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ... import _tracing
from ...ops._norm_reference import item_counts
from ...padding import Padding

__all__ = [
    "valid_cells", "item_counts", "valid_total", "fill", "filled", "valid_count", "global_pool", "cell_count",
    "avg_pool", "item_boxes", "adaptive_pool", "pool_bins",
]


def valid_cells(padding: Padding | Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """Every item's valid cells as one map: ``Tensor[B, 1, *S]``, bool (True = valid) or, with
    ``dtype``, 1 on valid cells and 0 on padded ones (the weights of a masked reduction).

    Args:
        padding (Padding or Tensor[B, 1, *S] bool): a padding, or a mask with True = padding.
        dtype (torch.dtype, optional): the weights' dtype; None: bool.
    """
    valid = ~padding if isinstance(padding, Tensor) else padding.valid.unsqueeze(1)
    return valid if dtype is None else valid.to(dtype)


def valid_total(padding: Padding | Tensor, valid: Tensor) -> int | Tensor:
    """The number of valid cells of the whole batch: a host int from the boxes of a rectangular
    padding (no device read), else ``Tensor[]`` (int64) counted on the device, at least 1."""
    if isinstance(padding, Padding) and padding.kind == "none":
        return max(padding.batch * math.prod(padding.spatial), 1)
    if isinstance(padding, Padding) and padding.kind == "rectangular":
        return max(sum(math.prod(size) for size in padding.sizes), 1)
    return valid.sum().clamp_(min=1)


#: on the host, from this many elements per item, writes strip by strip (only padded cells) beat
#: one masked write (3-20x on the CPU: a mask broadcast over the channels is not vectorised there)
_STRIPS_FROM = 1 << 14


def _on_host_strips(x: Tensor, padding: Padding) -> bool:
    """Whether :func:`_write_padding` writes ``x``'s padding strip by strip: a box per item, a map
    on the host (an op costs a microsecond there, and a strip touches only padded cells) that is
    large enough, outside a trace. On an accelerator, and while tracing, one masked write (one
    kernel for any batch)."""
    return (padding.kind == "rectangular" and _tracing.host_side(x.device) and not _tracing.tracing()
            and x.shape[0] > 0 and x.numel() >= _STRIPS_FROM * x.shape[0])


def _write_padding(x: Tensor, padding: Padding, value: float) -> Tensor:
    """``value`` into every padded cell of ``x`` in place, with no autograd bookkeeping (the
    caller's): one masked write, the mask broadcast over the channels; on large host maps with a
    box per item, strip by strip (:func:`_on_host_strips`)."""
    if padding.kind == "none":  # no padded cell: nothing to write (and no mask to build)
        return x
    if not _on_host_strips(x, padding):
        return x.masked_fill_(padding.mask.unsqueeze(1), value)
    n, canvas = padding.num_axes, padding.spatial
    for b, (start, stop) in enumerate(zip(padding.starts, padding.stops)):
        if any(e == s for s, e in zip(start, stop)):
            x[b].fill_(value)
            continue
        inner: list[slice] = []
        for axis in range(n):  # cells before / after the box on this axis, inside the box before it
            head = (b, slice(None), *inner)
            rest = (slice(None),) * (n - axis - 1)
            if start[axis] > 0:
                x[(*head, slice(0, start[axis]), *rest)].fill_(value)
            if stop[axis] < canvas[axis]:
                x[(*head, slice(stop[axis], None), *rest)].fill_(value)
            inner.append(slice(start[axis], stop[axis]))
    return x


def _zero_padding_copy(grad: Tensor, padding: Padding) -> Tensor:
    """A copy of ``grad`` with zeros in the padding: one masked copy (one kernel), or a copy and
    strips on large host maps (:func:`_on_host_strips`)."""
    if _on_host_strips(grad, padding):
        return _write_padding(grad.clone(), padding, 0.0)
    return grad.masked_fill(padding.mask.unsqueeze(1), 0.0)


class _FillPadding(torch.autograd.Function):
    """``value`` written into the padding in place under autograd: one node whose backward is the
    gradient with zeros in the padding (one masked copy; the strips of a plain slice write would
    each copy the whole gradient)."""

    @staticmethod
    def forward(ctx, x, padding, value):
        ctx.padding = padding
        ctx.mark_dirty(x)
        with torch.no_grad():
            _write_padding(x, padding, value)
        return x

    @staticmethod
    def backward(ctx, grad):
        return _zero_padding_copy(grad, ctx.padding), None, None


def fill(x: Tensor, padding: Padding, value: float) -> Tensor:
    """Writes ``value`` into every padded cell of ``x`` **in place**: one masked write (one kernel
    for any batch on an accelerator; strips of a box per item on large host maps), under autograd
    one node, whose backward zeroes the gradient's padding. The caller guarantees autograd does not
    need ``x``'s old values.

    Args:
        x (Tensor[B, C, *S]): features, channels first. padding (Padding): of shape ``(B, *S)``.
        value (float): 0 before a convolution, ``-inf`` before a max pool.

    Returns:
        Tensor[B, C, *S]: ``x`` itself.
    """
    if torch.is_grad_enabled() and x.requires_grad:
        return _FillPadding.apply(x, padding, value)
    return _write_padding(x, padding, value)


def filled(x: Tensor, padding: Padding | None, value: float) -> Tensor:
    """A copy of ``x`` with ``value`` in every padded cell (``x`` itself without padding): one
    masked copy (one kernel; a copy and strips on large host maps), whose gradient is the output's
    with zeros in the padding.

    Args:
        x (Tensor[B, C, *S]): features. padding (Padding, optional): of shape ``(B, *S)``.
        value (float): the fill.

    Returns:
        Tensor[B, C, *S]: ``x``'s dtype.
    """
    if padding is None or padding.kind == "none":
        return x
    if _on_host_strips(x, padding):
        return fill(x.clone(), padding, value)
    return x.masked_fill(padding.mask.unsqueeze(1), value)


def valid_count(pad: Tensor, dims: Sequence[int], dtype: torch.dtype) -> Tensor:
    """Number of valid cells over ``dims`` of a mask ``pad`` (True = padding), as ``dtype``, at
    least 1."""
    return (~pad).sum(tuple(dims), keepdim=True, dtype=dtype).clamp_(min=1)


def _stock_pool(x: Tensor, mode: str, dims: tuple[int, ...], keepdim: bool) -> Tensor:
    """The plain reduction of :func:`global_pool`'s ``mode`` over ``dims`` (no padding)."""
    kind, _, arg = mode.partition(":")
    if kind == "norm":
        return torch.linalg.vector_norm(x, float(arg or 2), dims, keepdim=keepdim)
    if kind in ("var", "std"):
        return (torch.var if kind == "var" else torch.std)(x, dims, correction=float(arg), keepdim=keepdim)
    return {"mean": torch.mean, "sum": torch.sum, "max": torch.amax, "min": torch.amin}[kind](x, dims, keepdim=keepdim)


def global_pool(x: Tensor, padding: Padding | None, mode: str, dims: Sequence[int], keepdim: bool) -> Tensor:
    """Each item's statistics over its valid cells (global pooling, squeeze-excitation, ConvNeXt
    V2's global response norm, a style's standard deviation), every item in one masked reduction
    (a box per item or an arbitrary mask alike).

    Args:
        x (Tensor[B, C, *S]): features. padding (Padding, optional): None: the plain reduction.
        mode (str): ``"mean"``, ``"sum"``, ``"max"``, ``"min"``, ``"norm"`` (L2), ``"norm:1"``,
            ``"norm:inf"``, ``"var:c"`` or ``"std:c"`` (``c``: the correction, ``torch.var``'s).
        dims (sequence of int): every spatial dim of ``x``. keepdim (bool): keep the reduced dims
            (size 1).

    Returns:
        Tensor[B, C] (``[B, C, 1, ...]`` with ``keepdim``) in ``x``'s dtype; zeros for an item
        without a valid cell (a variance over no more cells than the correction is inf or NaN, as
        torch's).
    """
    dims = tuple(dims)
    if padding is None or padding.kind == "none":
        return _stock_pool(x, mode, dims, keepdim)
    kind, _, arg = mode.partition(":")
    valid = valid_cells(padding)
    any_cell = valid.flatten(1).any(1).view((-1,) + (1,) * (x.dim() - 1))
    if kind in ("max", "min") or mode == "norm:inf":
        big = float("-inf") if kind != "min" else float("inf")
        values = x.abs() if kind == "norm" else x
        extreme = torch.where(valid, values, big)
        out = extreme.amin(dims, keepdim=True) if kind == "min" else extreme.amax(dims, keepdim=True)
        out = torch.where(any_cell, out, 0.0)
    elif kind == "norm":
        out = torch.linalg.vector_norm(torch.where(valid, x, 0.0), float(arg or 2), dims, keepdim=True)
    else:
        out = torch.where(valid, x, 0.0).sum(dims, keepdim=True)
        if kind != "sum":
            count = item_counts(valid, out.dtype).view((-1,) + (1,) * (x.dim() - 1))
            out = out / count.clamp(min=1)
        if kind in ("var", "std"):
            squares = torch.where(valid, (x - out) ** 2, 0.0).sum(dims, keepdim=True)
            out = squares / (count - float(arg)).clamp(min=0)
            out = torch.where(any_cell, out.sqrt() if kind == "std" else out, 0.0)
    return out if keepdim else out.flatten(1)


def item_boxes(padding: Padding, device: torch.device) -> tuple[Tensor, Tensor]:
    """Each item's box as tensors: ``(starts, sizes)``, each ``Tensor[B, num_axes]`` (int64) on
    ``device``. From the host boxes of a rectangular padding (one transfer); while compiling or
    tracing (where the graph gets each map's box as its mask alone) or capturing a CUDA graph, from
    the mask on the device (its bounding box along every axis; no host read).

    Raises:
        ValueError: an arbitrary padding mask outside a trace (no box per item).
    """
    n = padding.num_axes
    if padding.kind == "arbitrary" and not _tracing.tracing():
        raise ValueError("padding_invariant=True: resizing or pooling each item over its own bins needs each "
                         "item's box (a rectangular padding), got an arbitrary padding mask")
    if padding.kind == "arbitrary" or not _tracing.host_facts(device):
        valid = padding.valid
        starts, sizes = [], []
        for axis in range(n):
            others = tuple(1 + a for a in range(n) if a != axis)
            line = valid.any(dim=others) if others else valid
            sizes.append(line.sum(1))
            starts.append(line.to(torch.uint8).argmax(1))  # the first valid cell (0 for an empty item)
        return torch.stack(starts, 1).to(device), torch.stack(sizes, 1).to(device)
    box = np.asarray([list(a) + list(z) for a, z in zip(padding.starts, padding.sizes)], dtype=np.int64)
    box = box.reshape(padding.batch, 2 * n)
    (box,) = _tracing.host_arrays([box], device)
    return box[:, :n], box[:, n:]


def pool_bins(x: Tensor, dim: int, mode: str, bins: Tensor, size: Tensor, count: Any, start: Tensor) -> Tensor:
    """Along ``dim``, output cell ``j`` of item ``b`` is the mean or max of its adaptive bin
    ``bins[b, j]`` of ``count`` bins over its ``size`` cells from ``start`` (ATen's ``start_index``
    / ``end_index``: ``floor(i * n / o)`` to ``ceil((i + 1) * n / o)``): one bin table for the
    batch, a matrix product (mean) or a masked max.

    Args:
        x (Tensor[B, C, *S]): features, zeros (mean) or ``-inf`` (max) outside the items.
        dim (int): the axis. mode (str): ``"mean"`` or ``"max"``.
        bins (Tensor[B, M], int64): each output cell's bin on its item (``0 .. count - 1``).
        size, start (Tensor[B, 1], int64): each item's cells along ``dim``.
        count (int or Tensor[B, 1]): each item's number of bins.

    Returns:
        Tensor: ``x`` with ``M`` cells along ``dim``.
    """
    cells, m = x.shape[dim], bins.shape[1]
    count = count.clamp(min=1) if isinstance(count, Tensor) else count
    lo = (bins * size).div(count, rounding_mode="floor") + start  # (B, M)
    hi = ((bins + 1) * size + count - 1).div(count, rounding_mode="floor") + start
    k = torch.arange(cells, device=x.device)[None, None]
    inside = (k >= lo[..., None]) & (k < hi[..., None])  # (B, M, cells)
    moved = x.movedim(dim, -1)  # (B, C, ..., cells)
    lead = [x.shape[0]] + [1] * (moved.dim() - 2)  # the batch, then one per other axis
    if mode == "mean":
        weights = inside.to(x.dtype) / (hi - lo).clamp(min=1)[..., None].to(x.dtype)
        out = moved @ weights.transpose(1, 2).reshape(*lead[:-1], cells, m)
    else:
        out = torch.where(inside.reshape(*lead, m, cells), moved.unsqueeze(-2), float("-inf")).amax(-1)
    return out.movedim(-1, dim)


def adaptive_pool(x: Tensor, padding: Padding | None, mode: str, output_size: Sequence[int]) -> Tensor:
    """A fixed-size adaptive pool (VGG's and AlexNet's ``AdaptiveAvgPool2d((7, 7))``) of each item
    over its own bins: along every axis, bin ``i`` of an item of ``n`` cells covers its cells
    ``floor(i * n / o)`` to ``ceil((i + 1) * n / o)`` (ATen's ``start_index`` / ``end_index``), as
    alone; one table of bins per axis for the whole batch (no loop over items), applied axis after
    axis (a box's mean or max is the mean or max of its lines').

    Args:
        x (Tensor[B, C, *S]): features. padding (Padding, optional): None: the stock pool.
        mode (str): ``"mean"`` or ``"max"``. output_size (sequence of int): ``o`` per axis.

    Returns:
        Tensor[B, C, *output_size] in ``x``'s dtype: every item's own pool (no padding); zeros for
        an item without a cell. Differentiable (a padded cell gets no gradient).

    Raises:
        ValueError: an arbitrary padding mask outside a trace (:func:`item_boxes`).
    """
    n = x.dim() - 2
    if padding is None or padding.kind == "none":
        pool = {"mean": (F.adaptive_avg_pool1d, F.adaptive_avg_pool2d, F.adaptive_avg_pool3d),
                "max": (F.adaptive_max_pool1d, F.adaptive_max_pool2d, F.adaptive_max_pool3d)}[mode][n - 1]
        return pool(x, tuple(output_size))
    starts, sizes = item_boxes(padding, x.device)
    valid = valid_cells(padding)
    x = torch.where(valid, x, 0.0 if mode == "mean" else float("-inf"))
    for axis in range(n):
        o = int(output_size[axis])
        bins = torch.arange(o, device=x.device)[None].expand(x.shape[0], o)
        x = pool_bins(x, 2 + axis, mode, bins, sizes[:, axis : axis + 1], o, starts[:, axis : axis + 1])
    if mode == "max":  # an item without a cell: zeros, not -inf
        any_cell = valid.flatten(1).any(1).view((-1,) + (1,) * (x.dim() - 1))
        x = torch.where(any_cell, x, 0.0)
    return x


def cell_count(x: Tensor, padding: Padding | None, dims: Sequence[int], keepdim: bool) -> Tensor:
    """The number of each item's own cells over the spatial ``dims``: what ``H * W`` read from
    the item's own map is, in ``x``'s dtype (exact for any count below 2**24 in float32), counted
    on ``x``'s device from the padding's mask.

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
    return item_counts(valid_cells(padding), x.dtype).view(shape)


_AVG_POOLS = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


def _edge_divisor(x: Tensor, out: Tensor, padding: Padding, kernel, stride, pad) -> Tensor:
    """Average pooling's divisor with ``ceil_mode=True, count_include_pad=True`` as each item
    alone gets it: torch shortens a window that runs past ``size + padding`` to the cells before
    that edge, ``min(k, size + 2 p - o s)`` per axis (``aten/src/ATen/native/cpu/AvgPoolKernel.cpp``),
    and the edge is the item's, not the canvas's. One line of divisors per axis and item, built on
    the host from the boxes for the whole batch and sent in one transfer, then their product."""
    n = padding.num_axes
    starts, sizes = np.asarray(padding.starts, dtype=np.int64), np.asarray(padding.sizes, dtype=np.int64)
    lines = []
    for axis in range(n):
        k, s, p = kernel[axis], stride[axis], pad[axis]
        size = sizes[:, axis : axis + 1]
        o = np.arange(out.shape[2 + axis]) - starts[:, axis : axis + 1] // s  # window index on the item
        reach = size + 2 * p - o * s  # the cells the window covers before the item's edge
        past = (o >= np.maximum(0, (size + 2 * p - k) // s + 1)) & (reach > 0) & (reach < k) & (size > 0)
        lines.append(np.where(past, reach, k).astype(np.float64))
    total = None
    for axis, line in enumerate(_tracing.host_arrays(lines, x.device)):
        view = [x.shape[0], 1] + [1] * n
        view[2 + axis] = line.shape[1]
        line = line.to(x.dtype).view(view)
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
