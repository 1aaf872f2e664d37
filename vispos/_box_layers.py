"""Statistics over valid cells when each item's valid cells are a box: per-item views instead of
masked passes over the padded canvas.

:mod:`vispos._masked_layers` handles any mask with full-canvas masked passes. When the padding is
rectangular (every batch vispos builds: :class:`~vispos.Padding` of kind ``"rectangular"``),
the statistics can be read from each item's box as a view, which touches only valid cells and
keeps torch's fused kernels: batch norm's per-item ``var_mean`` combined exactly (Chan et al.'s
parallel formula), group / instance norm run by ``F.group_norm`` on each item's view, global means
per item. Padded cells of the outputs are finite and meaningless (padding).

:func:`box_batch_norm` is an ``autograd.Function`` with batch norm's closed-form backward: the
forward applies one per-channel affine map to the whole canvas (``y = a (x - mean) + bias``), so
its exact gradient has torch's batch-norm form with the two sums taken over every cell of the
output gradient and the mean/variance terms over the valid cells only.

References:
    Ioffe and Szegedy, Batch Normalization, ICML 2015 (statistics, backward); Chan, Golub and
    LeVeque, Algorithms for computing the sample variance, 1983 (combining per-part means and
    variances); Wu and He, Group Normalization, ECCV 2018.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._masked_layers import check_sync_batch_norm, update_running_stats
from .padding import Padding

__all__ = [
    "box_views", "box_fill", "box_batch_norm", "box_batch_norm_module", "box_group_norm", "box_global_pool",
    "box_avg_pool", "box_cell_count",
]

_LOW_PRECISION = (torch.float16, torch.bfloat16)


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


def box_fill(x: Tensor, padding: Padding, value: float) -> Tensor:
    """Writes ``value`` into every padded cell of ``x`` **in place**: strip by strip on large maps
    (only padded cells are touched), one masked write on small ones (fewer operations). The caller
    guarantees autograd does not need ``x``'s old values."""
    if x.numel() < _STRIPS_FROM:
        return x.masked_fill_(padding.mask.unsqueeze(1), value)
    n = padding.n_spatial
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


def _valid_mean(x: Tensor, views, n: int, stat_dtype: torch.dtype) -> Tensor:
    """Per-channel mean over every item's box (a sum per item view)."""
    dims = tuple(range(1, x.dim() - 1))
    total = None
    for b, region, _ in views:
        part = x[(b, slice(None), *region)].sum(dims, dtype=stat_dtype)
        total = part if total is None else total + part
    return total / n


class _BoxBatchNorm(torch.autograd.Function):
    """``y = a (x - mean) + bias`` on valid cells and ``y = bias`` on padded cells, with
    ``a = weight / sqrt(var + eps)``, ``mean`` and (biased) ``var`` over the boxes' cells.

    Forward: one sum per item view, then ``xc = x - mean`` with zeros written into its padding,
    ``var = |xc|^2 / n`` and ``y = a xc + bias`` over the canvas; ``xc`` is kept for the backward
    (one map, as torch's batch norm keeps its input). Backward: batch norm's closed form with the
    sums over valid cells (zeros in the padding of ``a dy`` and of ``xc``).
    """

    @staticmethod
    def forward(ctx, x, weight, bias, padding, eps):
        views = box_views(padding)
        n = sum(count for _, _, count in views)
        c = x.shape[1]
        shape = (1, c) + (1,) * (x.dim() - 2)
        dims = (0, *range(2, x.dim()))
        stat_dtype = torch.float32 if x.dtype in _LOW_PRECISION else x.dtype
        mean = _valid_mean(x, views, n, stat_dtype)
        xc = x.to(stat_dtype) - mean.view(shape)
        box_fill(xc, padding, 0.0)
        var = torch.linalg.vector_norm(xc, dim=dims).square_() / n
        invstd = torch.rsqrt(var + eps)
        a = invstd if weight is None else invstd * weight.to(stat_dtype)
        if bias is None:
            y = xc * a.view(shape)
        else:
            y = torch.addcmul(bias.to(stat_dtype).view(shape), xc, a.view(shape))
        ctx.save_for_backward(xc, invstd, a, weight)
        ctx.padding, ctx.n, ctx.has_bias, ctx.dtype = padding, n, bias is not None, x.dtype
        ctx.mark_non_differentiable(mean, var)
        return y.to(x.dtype), mean, var

    @staticmethod
    def backward(ctx, dy, _dmean, _dvar):
        xc, invstd, a, weight = ctx.saved_tensors
        c = xc.shape[1]
        shape = (1, c) + (1,) * (xc.dim() - 2)
        dims = (0, *range(2, xc.dim()))
        dyf = dy if dy.dtype == xc.dtype else dy.to(xc.dtype)
        projected = (dyf * xc).sum(dims)  # over valid cells: xc is 0 in the padding
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = box_fill(dyf * a.view(shape), ctx.padding, 0.0)
            mean_dy = grad_x.sum(dims) / ctx.n  # a * mean of dy over valid cells
            coef = (a * invstd.square() * projected / ctx.n).view(shape)
            grad_x.sub_(mean_dy.view(shape)).addcmul_(xc, coef, value=-1)
            grad_x = box_fill(grad_x, ctx.padding, 0.0).to(ctx.dtype)
        if weight is not None and ctx.needs_input_grad[1]:
            grad_w = (projected * invstd).to(weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = dyf.sum(dims).to(weight.dtype if weight is not None else ctx.dtype)
        return grad_x, grad_w, grad_b, None, None


def box_batch_norm(
    x: Tensor,
    padding: Padding,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    weight: Tensor | None,
    bias: Tensor | None,
    training: bool,
    momentum: float | None,
    eps: float,
    num_batches_tracked: Tensor | None = None,
) -> Tensor:
    """``F.batch_norm`` with batch statistics over the items' boxes (rectangular padding).

    Same contract as :func:`vispos._masked_layers.masked_batch_norm` (running statistics updated
    with the unbiased variance of the valid cells), at the cost of torch's own kernels: one
    ``var_mean`` per item over its box, one affine pass over the canvas; a closed-form backward.

    Args:
        x (Tensor[B, C, *S]): features. padding (Padding): rectangular, of shape ``(B, *S)``.
        running_mean, running_var (Tensor[C], optional), weight, bias (Tensor[C], optional),
        training (bool), momentum (float, optional), eps (float), num_batches_tracked (Tensor[],
        optional): as ``torch.nn.functional.batch_norm`` / ``BatchNorm2d``.

    Returns:
        Tensor[B, C, *S] in ``x``'s dtype.

    References:
        Ioffe and Szegedy, ICML 2015; Chan, Golub and LeVeque, 1983.
    """
    use_batch = training or running_mean is None or running_var is None
    if not use_batch:
        return F.batch_norm(x, running_mean, running_var, weight, bias, False, 0.0, eps)
    y, mean, var = _BoxBatchNorm.apply(x, weight, bias, padding, eps)
    if training:
        n = sum(count for _, _, count in box_views(padding))
        update_running_stats(running_mean, running_var, num_batches_tracked, momentum, mean, var, n)
    return y


def box_batch_norm_module(x: Tensor, padding: Padding | None, bn: nn.Module) -> Tensor:
    """A batch-norm module on a padded batch (see :func:`vispos._masked_layers.masked_batch_norm_module`),
    statistics over the items' boxes; only the normalisation (timm's ``BatchNormAct2d`` adds its
    activation after)."""
    if padding is None or not isinstance(bn, nn.modules.batchnorm._BatchNorm):
        return bn(x)
    check_sync_batch_norm(bn)
    track = bn.training and bn.track_running_stats
    use_running = not bn.training and bn.running_mean is not None
    return box_batch_norm(
        x, padding,
        bn.running_mean if track or use_running else None,
        bn.running_var if track or use_running else None,
        bn.weight, bn.bias, bn.training, bn.momentum, bn.eps,
        bn.num_batches_tracked if track else None,
    )


def box_group_norm(
    x: Tensor, padding: Padding | None, num_groups: int, weight: Tensor | None, bias: Tensor | None, eps: float
) -> Tensor:
    """GroupNorm (InstanceNorm: ``num_groups = C``) of each item over its own box: ``F.group_norm``
    on every item's view, zeros in the padding.

    Returns:
        Tensor[B, C, *S] in ``x``'s dtype.
    """
    if padding is None:
        return F.group_norm(x, num_groups, weight, bias, eps)
    out = x.new_zeros(x.shape)
    for b, region, _ in box_views(padding):
        index = (slice(b, b + 1), slice(None), *region)
        out[index] = F.group_norm(x[index], num_groups, weight, bias, eps)
    return out


def _l2_norm(x: Tensor, dims: tuple[int, ...], keepdim: bool = False) -> Tensor:
    return torch.linalg.vector_norm(x, 2, dims, keepdim=keepdim)


_REDUCTIONS = {"mean": torch.mean, "sum": torch.sum, "max": torch.amax, "norm": _l2_norm}


def box_global_pool(x: Tensor, padding: Padding | None, mode: str, dims: Sequence[int], keepdim: bool) -> Tensor:
    """Mean, sum, max or L2 norm of each item over its box (global pooling, squeeze-excitation,
    ConvNeXt V2's global response norm).

    Returns:
        Tensor[B, C] (``[B, C, 1, ...]`` with ``keepdim``) in ``x``'s dtype; zeros for an item
        without a valid cell.
    """
    dims = tuple(dims)
    reduce = _REDUCTIONS[mode]
    if padding is None:
        return reduce(x, dims, keepdim=keepdim)
    parts = [x.new_zeros((1, x.shape[1]) + (1,) * len(dims))] * x.shape[0]
    for b, region, _ in box_views(padding):
        parts[b] = reduce(x[(slice(b, b + 1), slice(None), *region)], dims, keepdim=True)
    out = torch.cat(parts, 0)
    return out if keepdim else out.flatten(1)


def box_cell_count(x: Tensor, padding: Padding | None, dims: Sequence[int], keepdim: bool) -> Tensor:
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
    n = padding.n_spatial
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


def box_avg_pool(
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
        padding (Padding, optional): rectangular; None runs the stock pool.
        kernel_size, stride, pad (sequence of int): per axis. ceil_mode, count_include_pad
            (bool), divisor_override (int, optional): as ``torch.nn.AvgPool2d``.

    Returns:
        Tensor[B, C, *S_out] in ``x``'s dtype.

    References:
        ``torch.nn.AvgPool2d`` (output size, divisor), ATen ``AvgPoolKernel.cpp``.
    """
    pool = _AVG_POOLS[x.dim() - 2]
    if padding is None:
        return pool(x, kernel_size, stride, pad, ceil_mode, count_include_pad, divisor_override)
    mask = padding.mask.unsqueeze(1)
    filled = x.masked_fill(mask, 0)
    if divisor_override is not None or (count_include_pad and not ceil_mode):
        return pool(filled, kernel_size, stride, pad, ceil_mode, count_include_pad, divisor_override)
    total = pool(filled, kernel_size, stride, pad, ceil_mode, True, 1)
    if count_include_pad:
        return total / _edge_divisor(x, total, padding, kernel_size, stride, pad)
    count = pool((~mask).to(total.dtype), kernel_size, stride, pad, ceil_mode, True, 1)
    return total / count.clamp_(min=1)
