"""Normalisation over each item's valid cells: batch norm (statistics of every item's valid cells,
running statistics updated from them), group and instance norm (each item's own statistics).

Every function takes the feature map's padding: a :class:`~vispos.Padding` (None: no padding,
the stock layer runs) or a bool mask ``Tensor[B, 1, *S]`` (True = padding). Every item's statistics
come from one masked reduction over the canvas (a select keeps the padding's values out, then
sums per channel, or per item and group): no loop over items and no read of the device, the same
for a box per item (every batch vispos builds) and an arbitrary mask (MONAI's decoder). Batch
norm's total count comes from the boxes on the host, or from the mask on the device; its backward
is the closed form. Padded cells of the outputs are finite and meaningless.

References:
    Ioffe and Szegedy, Batch Normalization, ICML 2015 (statistics, backward; unbiased running
    variance as ``torch.nn.BatchNorm2d``); Chan, Golub and LeVeque, Algorithms for computing the
    sample variance, 1983; Wu and He, Group Normalization, ECCV 2018; Ulyanov et al., Instance
    Normalization, 2016.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..padding import Padding
from ._pools import fill, item_counts, valid_cells, valid_total

__all__ = ["update_running_stats", "check_sync_batch_norm", "batch_norm", "batch_norm_module", "group_norm"]

_LOW_PRECISION = (torch.float16, torch.bfloat16)


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
    if not (isinstance(bn, nn.SyncBatchNorm) and bn.training):
        return
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        raise ValueError(
            "padding_invariant=True does not synchronise masked batch statistics across processes: "
            "use BatchNorm2d per process (the statistics of each process's valid cells) or frozen "
            "batch norm instead of SyncBatchNorm"
        )


def _channel_sums(t: Tensor) -> Tensor:
    """``t.sum`` over every axis but the channels (``Tensor[B, C, *S]`` -> ``Tensor[C]``): along
    each contiguous row first (faster on the CPU than one reduction over axes 0, 2, ...)."""
    if t.is_contiguous():
        return t.view(t.shape[0], t.shape[1], -1).sum(2).sum(0)
    return t.sum((0, *range(2, t.dim())))


def _channel_dots(a: Tensor, b: Tensor) -> Tensor:
    """``(a * b).sum`` over every axis but the channels, ``Tensor[C]``: one batched dot product
    per item and channel (no product map) when both are contiguous."""
    if a.is_contiguous() and b.is_contiguous():
        rows = a.shape[0] * a.shape[1]
        return torch.bmm(a.view(rows, 1, -1), b.view(rows, -1, 1)).view(a.shape[0], a.shape[1]).sum(0)
    return (a * b).sum((0, *range(2, a.dim())))


#: the integer dtype as wide as each statistics dtype (the select below works on the bits)
_BITS = {torch.float32: torch.int32, torch.float64: torch.int64}


def _select_bits(valid: Tensor, dtype: torch.dtype) -> Tensor | None:
    """The mask of :func:`_valid_part` for statistics in ``dtype``: ``Tensor[B, 1, *S]`` of the
    integer type as wide as ``dtype``, every bit set on valid cells, none on padded ones (None for
    a dtype without one)."""
    bits = _BITS.get(dtype)
    return None if bits is None else valid.to(bits).neg_()


def _valid_part(t: Tensor, valid: Tensor, bits: Tensor | None, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """``torch.where(valid, t.to(dtype), 0)`` bit for bit (whatever the padding holds, NaN
    included, is never read), and its per-channel sums ``Tensor[C]``.

    In float32 / float64 the select is a bitwise and of ``t``'s bits with ``bits``
    (:func:`_select_bits`; +0.0 in the padding): torch's ``where`` with a mask broadcast over the
    channels is 4-5x slower on the CPU, a bitwise and as fast as a product."""
    if bits is None:
        zeroed = torch.where(valid, t.to(dtype), 0.0)
    elif t.dtype == dtype:
        zeroed = torch.bitwise_and(t.view(bits.dtype), bits).view(dtype)
    else:
        zeroed = t.to(dtype)
        zeroed.view(bits.dtype).bitwise_and_(bits)
    return zeroed, _channel_sums(zeroed)


class _ValidBatchNorm(torch.autograd.Function):
    """``y = a (x - mean) + bias`` on valid cells and ``y = bias`` on padded cells (0 with
    ``zero_padding``, where the bias then gets no gradient from the padding), with
    ``a = weight / sqrt(var + eps)``, ``mean`` and (biased) ``var`` over every item's valid cells,
    the whole batch in one masked reduction (no loop over items).

    Forward: ``xz = x`` with zeros in its padding (a select, :func:`_valid_part`: whatever the
    padding holds, NaN included, is never read), ``mean = sum(xz) / n``, ``xc = xz - valid * mean``
    (zeros in the padding), ``var = sum(xc^2) / n``, ``y = a xc + bias``; ``xc`` is kept for the
    backward (one map, as torch's batch norm keeps its input). Backward: batch norm's closed form
    with the sums over valid cells (the gradient's padding selected out, ``xc``'s is 0; the sum of
    the product ``dy * xc`` as batched dot products, without the product map), written into the
    buffer of the selected gradient: one new map, as torch's backward; zeros in the padding of the
    input's gradient. Once differentiable: a second derivative (``create_graph=True``, a gradient
    penalty) raises ``RuntimeError``.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, valid, n, eps, zero_padding):
        c = x.shape[1]
        shape = (1, c) + (1,) * (x.dim() - 2)
        dims = (0, *range(2, x.dim()))
        stat_dtype = torch.float32 if x.dtype in _LOW_PRECISION else x.dtype
        weights = valid.to(stat_dtype)
        bits = _select_bits(valid, stat_dtype)
        xc, sums = _valid_part(x, valid, bits, stat_dtype)
        mean = sums / n
        xc.addcmul_(weights, mean.view(shape), value=-1)
        if xc.is_contiguous():  # a norm along each contiguous row: one pass, no temporary map
            var = torch.linalg.vector_norm(xc.view(xc.shape[0], c, -1), dim=2).square_().sum(0) / n
        else:
            var = (xc * xc).sum(dims) / n
        invstd = torch.rsqrt(var + eps)
        a = invstd if weight is None else invstd * weight.to(stat_dtype)
        y = xc * a.view(shape)  # 0 in the padding, where xc is 0
        if bias is not None and zero_padding:  # the bias on valid cells only
            y.addcmul_(weights, bias.to(stat_dtype).view(shape))
        elif bias is not None:  # in place: an addcmul whose first operand broadcasts is slower on the CPU
            y.add_(bias.to(stat_dtype).view(shape))
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(xc, invstd, a, valid, weights, bits)
        ctx.zero_padding = bool(zero_padding)
        ctx.n, ctx.has_weight, ctx.has_bias = n, weight is not None, bias is not None
        ctx.dtype, ctx.param_dtype = x.dtype, (weight if weight is not None else x).dtype
        ctx.mark_non_differentiable(mean, var)
        return y.to(x.dtype), mean, var

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy, _dmean, _dvar):
        if dy is None:  # y took no part in the loss
            return None, None, None, None, None, None, None
        xc, invstd, a, valid, weights, bits = ctx.saved_tensors
        c = xc.shape[1]
        shape = (1, c) + (1,) * (xc.dim() - 2)
        need_x, need_w = ctx.needs_input_grad[0], ctx.has_weight and ctx.needs_input_grad[1]
        need_b = ctx.has_bias and ctx.needs_input_grad[2]
        grad_x = grad_w = grad_b = sum_dz = None
        if need_x or need_w or (need_b and ctx.zero_padding):
            dz, sum_dz = _valid_part(dy, valid, bits, xc.dtype)
        if need_x or need_w:
            # sum of dz * xc per channel without the product map (xc is 0 in the padding)
            projected = _channel_dots(dz, xc)
            if need_w:
                grad_w = (projected * invstd).to(ctx.param_dtype)
            if need_x:
                # a (dy - mean(dy) - xc invstd^2 mean(dy xc)), means over valid cells, 0 in the padding,
                # written into dz's buffer
                mean_dy = sum_dz / ctx.n
                grad_x = dz.mul_(a.view(shape))
                grad_x.addcmul_(xc, (a * invstd.square() * projected / ctx.n).view(shape), value=-1)
                grad_x.addcmul_(weights, (a * mean_dy).view(shape), value=-1)
                grad_x = grad_x.to(ctx.dtype)
        if need_b:
            # the padding holds 0 with zero_padding, not the bias: only valid cells count
            grad_b = sum_dz if ctx.zero_padding else _channel_sums(dy.to(xc.dtype))
            grad_b = grad_b.to(ctx.param_dtype)
        return grad_x, grad_w, grad_b, None, None, None, None


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
    zero_padding: bool = False,
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
        zero_padding (bool): zeros in the output's padding (what the next layer that reads
            neighbours needs), written by the same call.

    Returns:
        Tensor[B, C, *S] in ``x``'s dtype; padded cells hold finite values (they are padding),
        zeros with ``zero_padding``.

    References:
        Ioffe and Szegedy, ICML 2015; Chan, Golub and LeVeque, 1983.
    """
    use_batch = training or running_mean is None or running_var is None
    if not use_batch or padding is None:
        y = F.batch_norm(x, running_mean, running_var, weight, bias, use_batch, momentum or 0.0, eps)
        if not zero_padding or padding is None:
            return y
        return fill(y, padding, 0.0) if isinstance(padding, Padding) else y.masked_fill(padding, 0.0)
    valid = valid_cells(padding)
    n = valid_total(padding, valid)
    if isinstance(n, Tensor):  # counted on the device: in the statistics' dtype
        n = n.to(torch.float32 if x.dtype in _LOW_PRECISION else x.dtype)
    y, mean, var = _ValidBatchNorm.apply(x, weight, bias, valid, n, eps, bool(zero_padding))
    if training:
        update_running_stats(running_mean, running_var, num_batches_tracked, momentum, mean, var, n)
    return y


def batch_norm_module(x: Tensor, padding: Padding | Tensor | None, bn: nn.Module,
                      zero_padding: bool = False) -> Tensor:
    """A batch-norm module (``BatchNorm1d/2d/3d``, ``SyncBatchNorm`` on one process) on a padded
    batch: :func:`batch_norm` with the module's parameters, buffers and mode; only the
    normalisation (timm's ``BatchNormAct2d`` adds its activation after). The module itself without
    padding, or when it is not a batch norm (a frozen one swapped in after a graph was built).
    ``zero_padding``: zeros in the output's padding (see :func:`batch_norm`).

    Raises:
        ValueError: a ``SyncBatchNorm`` in training across several processes.
    """
    if padding is None or not isinstance(bn, nn.modules.batchnorm._BatchNorm):
        y = bn(x)
        return fill(y, padding, 0.0) if zero_padding and isinstance(padding, Padding) else y
    check_sync_batch_norm(bn)
    track = bn.training and bn.track_running_stats
    use_running = not bn.training and bn.running_mean is not None
    return batch_norm(
        x, padding,
        bn.running_mean if track or use_running else None,
        bn.running_var if track or use_running else None,
        bn.weight, bn.bias, bn.training, bn.momentum, bn.eps,
        bn.num_batches_tracked if track else None, zero_padding,
    )


def group_norm(
    x: Tensor, padding: Padding | Tensor | None, num_groups: int, weight: Tensor | None, bias: Tensor | None,
    eps: float,
) -> Tensor:
    """GroupNorm (InstanceNorm: ``num_groups = C``) with each item's statistics over its valid cells,
    every item and group in one masked reduction (a box per item or an arbitrary mask alike).

    Args:
        x (Tensor[B, C, *S]): features.
        padding (Padding or Tensor[B, 1, *S] bool, optional): True = padding; None: ``F.group_norm``.
        num_groups (int): divides ``C``.
        weight, bias (Tensor[C], optional): the affine map.
        eps (float): added to the variance.

    Returns:
        Tensor[B, C, *S] in ``x``'s dtype; zeros in the padding.

    Raises:
        ValueError: a box of one cell with one channel per group (torch refuses the item alone).

    References:
        Wu and He, Group Normalization, ECCV 2018.
    """
    if padding is None or (isinstance(padding, Padding) and padding.kind == "none"):
        return F.group_norm(x, num_groups, weight, bias, eps)  # every cell is valid
    b, c = x.shape[:2]
    spatial = x.shape[2:]
    if c // num_groups == 1 and isinstance(padding, Padding) and padding.kind == "rectangular":
        for item, size in enumerate(padding.sizes):
            if math.prod(size) == 1:  # torch's group norm refuses the item alone
                raise ValueError(
                    f"group norm: item {item} has 1 valid cell and {num_groups} groups of 1 channel, so 1 value "
                    "per group; torch's group norm expects more than 1 value per group"
                )
    stat_dtype = torch.float32 if x.dtype in _LOW_PRECISION else x.dtype
    valid = valid_cells(padding)
    group = (b, num_groups, c // num_groups, -1)
    weights = valid.to(stat_dtype).view(b, 1, 1, -1)
    n = (item_counts(valid, stat_dtype) * (c // num_groups)).clamp_(min=1).view(b, 1, 1, 1)
    centred = torch.where(valid, x.to(stat_dtype), 0.0).reshape(group)
    mean = centred.sum((2, 3), keepdim=True) / n
    centred = torch.addcmul(centred, weights, mean, value=-1)  # zeros stay in the padding
    var = (centred * centred).sum((2, 3), keepdim=True) / n
    out = (centred * torch.rsqrt(var + eps)).reshape(b, c, *spatial)
    shape = (1, c) + (1,) * len(spatial)
    if weight is not None:
        out = out * weight.to(stat_dtype).view(shape)
    if bias is not None:
        out = out + bias.to(stat_dtype).view(shape)
    return torch.where(valid, out, 0.0).to(x.dtype)
