"""Normalisation over each item's valid cells: batch norm (statistics of every item's valid cells,
running statistics updated from them), group and instance norm (each item's own statistics).

Every function takes the feature map's padding: a :class:`~vispos.Padding` (None: no padding,
the stock layer runs) or a bool mask ``Tensor[B, 1, *S]`` (True = padding). A rectangular padding
(every batch vispos builds) is read as each item's box, a view that touches only valid cells and
keeps torch's fused kernels: batch norm's statistics with a closed-form backward, group norm by
``F.group_norm`` on each item's view. An arbitrary mask (or a mask tensor: MONAI's decoder) falls
back to masked passes over the canvas. Padded cells of the outputs are finite and meaningless.

References:
    Ioffe and Szegedy, Batch Normalization, ICML 2015 (statistics, backward; unbiased running
    variance as ``torch.nn.BatchNorm2d``); Chan, Golub and LeVeque, Algorithms for computing the
    sample variance, 1983; Wu and He, Group Normalization, ECCV 2018; Ulyanov et al., Instance
    Normalization, 2016.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..padding import Padding
from ._pools import box_views, fill, valid_count

__all__ = ["update_running_stats", "check_sync_batch_norm", "batch_norm", "batch_norm_module", "group_norm"]

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _mask_of(padding: Padding | Tensor) -> Tensor:
    """``Tensor[B, 1, *S]`` bool, True = padding."""
    return padding if isinstance(padding, Tensor) else padding.mask.unsqueeze(1)


def _is_box(padding: Padding | Tensor) -> bool:
    """A box per item (a rectangular padding, or none at all): statistics from per-item views."""
    return isinstance(padding, Padding) and padding.kind != "arbitrary"


def update_running_stats(
    running_mean: Tensor | None,
    running_var: Tensor | None,
    num_batches_tracked: Tensor | None,
    momentum: float | None,
    mean: Tensor,
    var: Tensor,
    n: Tensor | int,
) -> None:
    """Batch norm's running statistics after a training step, as ``torch.nn.BatchNorm2d`` updates
    them: ``num_batches_tracked += 1``; ``momentum`` (or, when None, the cumulative average
    ``1 / num_batches_tracked``); the running variance from the unbiased variance ``var * n / (n -
    1)`` of the ``n`` cells the biased ``var`` was taken over. Nothing happens without running
    statistics."""
    if running_mean is None or running_var is None:
        return
    factor: float | Tensor = 0.0 if momentum is None else momentum
    with torch.no_grad():
        if num_batches_tracked is not None:
            num_batches_tracked.add_(1)
            if momentum is None:
                factor = 1.0 / num_batches_tracked
        unbiased = var * (n / (n - 1).clamp(min=1) if isinstance(n, Tensor) else n / max(n - 1, 1))
        running_mean.mul_(1 - factor).add_(mean.to(running_mean.dtype) * factor)
        running_var.mul_(1 - factor).add_(unbiased.to(running_var.dtype) * factor)


def check_sync_batch_norm(bn: nn.Module) -> None:
    """Raises ``ValueError`` for a ``SyncBatchNorm`` training across processes: statistics over valid
    cells are not synchronised between processes."""
    dist = torch.distributed
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if isinstance(bn, nn.SyncBatchNorm) and bn.training and world > 1:
        raise ValueError(
            "padding_invariant=True does not synchronise masked batch statistics across processes: "
            "use BatchNorm2d per process (the statistics of each process's valid cells) or frozen "
            "batch norm instead of SyncBatchNorm"
        )


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
        fill(xc, padding, 0.0)
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
            grad_x = fill(dyf * a.view(shape), ctx.padding, 0.0)
            mean_dy = grad_x.sum(dims) / ctx.n  # a * mean of dy over valid cells
            coef = (a * invstd.square() * projected / ctx.n).view(shape)
            grad_x.sub_(mean_dy.view(shape)).addcmul_(xc, coef, value=-1)
            grad_x = fill(grad_x, ctx.padding, 0.0).to(ctx.dtype)
        if weight is not None and ctx.needs_input_grad[1]:
            grad_w = (projected * invstd).to(weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = dyf.sum(dims).to(weight.dtype if weight is not None else ctx.dtype)
        return grad_x, grad_w, grad_b, None, None


def batch_norm(
    x: Tensor,
    padding: Padding | Tensor | None,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    weight: Tensor | None,
    bias: Tensor | None,
    training: bool,
    momentum: float | None,
    eps: float,
    num_batches_tracked: Tensor | None = None,
) -> Tensor:
    """``torch.nn.functional.batch_norm`` with batch statistics over valid cells only.

    With ``training`` (or without running statistics, ``track_running_stats=False``, in eval too)
    the per-channel mean and biased variance are those of the valid cells of every item; the
    running statistics (when given) are updated from them as ``torch.nn.BatchNorm2d`` does
    (momentum, or the cumulative average when ``momentum`` is None, with the unbiased variance
    ``var * n / (n - 1)``). With running statistics in eval the layer is a per-cell affine map.

    Args:
        x (Tensor[B, C, *S]): features, any floating dtype (statistics in float32 for 16-bit).
        padding (Padding or Tensor[B, 1, *S] bool, optional): True = padding; None: the stock op.
        running_mean, running_var (Tensor[C], optional): updated in place in training.
        weight, bias (Tensor[C], optional): the affine map.
        training (bool): use (and update) batch statistics.
        momentum (float, optional): running-average factor; None: cumulative average.
        eps (float): added to the variance.
        num_batches_tracked (Tensor[], optional): incremented in training.

    Returns:
        Tensor[B, C, *S] in ``x``'s dtype; padded cells hold finite values (they are padding).

    References:
        Ioffe and Szegedy, ICML 2015; Chan, Golub and LeVeque, 1983.
    """
    use_batch = training or running_mean is None or running_var is None
    if not use_batch or padding is None:
        return F.batch_norm(x, running_mean, running_var, weight, bias, use_batch, momentum or 0.0, eps)
    if not _is_box(padding):
        return _masked_batch_norm(x, _mask_of(padding), running_mean, running_var, weight, bias, training,
                                  momentum, eps, num_batches_tracked)
    y, mean, var = _BoxBatchNorm.apply(x, weight, bias, padding, eps)
    if training:
        n = sum(count for _, _, count in box_views(padding))
        update_running_stats(running_mean, running_var, num_batches_tracked, momentum, mean, var, n)
    return y


def batch_norm_module(x: Tensor, padding: Padding | Tensor | None, bn: nn.Module) -> Tensor:
    """A batch-norm module (``BatchNorm1d/2d/3d``, ``SyncBatchNorm`` on one process) on a padded
    batch: :func:`batch_norm` with the module's parameters, buffers and mode; only the
    normalisation (timm's ``BatchNormAct2d`` adds its activation after). The module itself without
    padding, or when it is not a batch norm (a frozen one swapped in after a graph was built).

    Raises:
        ValueError: a ``SyncBatchNorm`` in training across several processes.
    """
    if padding is None or not isinstance(bn, nn.modules.batchnorm._BatchNorm):
        return bn(x)
    check_sync_batch_norm(bn)
    track = bn.training and bn.track_running_stats
    use_running = not bn.training and bn.running_mean is not None
    return batch_norm(
        x, padding,
        bn.running_mean if track or use_running else None,
        bn.running_var if track or use_running else None,
        bn.weight, bn.bias, bn.training, bn.momentum, bn.eps,
        bn.num_batches_tracked if track else None,
    )


def _masked_batch_norm(x, pad, running_mean, running_var, weight, bias, training, momentum, eps,
                       num_batches_tracked):
    """Batch statistics over the unmasked cells, by masked passes over the canvas."""
    stat_dtype = torch.float32 if x.dtype in _LOW_PRECISION else x.dtype
    xf = x.to(stat_dtype)
    dims = (0, *range(2, x.dim()))
    n = valid_count(pad, dims, stat_dtype)  # (1, 1, ...): the same count for every channel
    mean = xf.masked_fill(pad, 0).sum(dims, keepdim=True) / n
    centred = (xf - mean).masked_fill_(pad, 0)
    var = centred.square().sum(dims, keepdim=True) / n
    if training:
        update_running_stats(running_mean, running_var, num_batches_tracked, momentum,
                             mean.reshape(-1), var.reshape(-1), n.reshape(()))
    scale = torch.rsqrt(var + eps)
    shape = (1, x.shape[1]) + (1,) * (x.dim() - 2)
    if weight is not None:
        scale = scale * weight.to(stat_dtype).view(shape)
    out = centred * scale
    if bias is not None:
        out = out + bias.to(stat_dtype).view(shape)
    return out.to(x.dtype)


def group_norm(
    x: Tensor, padding: Padding | Tensor | None, num_groups: int, weight: Tensor | None, bias: Tensor | None,
    eps: float,
) -> Tensor:
    """GroupNorm (InstanceNorm: ``num_groups = C``) with each item's statistics over its valid cells:
    ``F.group_norm`` on each item's box, or masked passes for an arbitrary mask.

    Args:
        x (Tensor[B, C, *S]): features.
        padding (Padding or Tensor[B, 1, *S] bool, optional): True = padding; None: ``F.group_norm``.
        num_groups (int): divides ``C``.
        weight, bias (Tensor[C], optional): the affine map.
        eps (float): added to the variance.

    Returns:
        Tensor[B, C, *S] in ``x``'s dtype; zeros in the padding of a box.

    References:
        Wu and He, Group Normalization, ECCV 2018.
    """
    if padding is None or (isinstance(padding, Padding) and padding.kind == "none"):
        return F.group_norm(x, num_groups, weight, bias, eps)  # every cell is valid
    if _is_box(padding):
        out = x.new_zeros(x.shape)
        for b, region, _ in box_views(padding):
            index = (slice(b, b + 1), slice(None), *region)
            out[index] = F.group_norm(x[index], num_groups, weight, bias, eps)
        return out
    pad = _mask_of(padding)
    b, c = x.shape[:2]
    spatial = x.shape[2:]
    stat_dtype = torch.float32 if x.dtype in _LOW_PRECISION else x.dtype
    xg = x.to(stat_dtype).reshape(b, num_groups, c // num_groups, *spatial)
    pg = pad.reshape(b, 1, 1, *spatial)
    dims = tuple(range(2, xg.dim()))
    n = valid_count(pg, dims, stat_dtype) * (c // num_groups)
    mean = xg.masked_fill(pg, 0).sum(dims, keepdim=True) / n
    centred = (xg - mean).masked_fill_(pg, 0)
    var = centred.square().sum(dims, keepdim=True) / n
    out = (centred * torch.rsqrt(var + eps)).reshape(b, c, *spatial)
    shape = (1, c) + (1,) * len(spatial)
    if weight is not None:
        out = out * weight.to(stat_dtype).view(shape)
    if bias is not None:
        out = out + bias.to(stat_dtype).view(shape)
    return out.to(x.dtype)


