"""The masked norms in plain torch: the CPU path of their custom ops, the reference of their kernels.

Batch and group norm over valid cells, forward and closed-form backward. Each function is one
masked computation over the whole batch (no loop over items, no read of the device). A select keeps
the padding's values out of every statistic (whatever it holds, NaN and +-inf included, is never
read); statistics are taken in float32 for 16-bit inputs (float64 stays float64). The ops of
:mod:`.batch_norm` and :mod:`.group_norm` run these on the CPU (and wherever Triton does not run);
the tests compare the kernels of :mod:`._batch_norm_kernels` and :mod:`._group_norm_kernels`
against them.

References:
    Ioffe and Szegedy, Batch Normalization, ICML 2015 (statistics, backward; unbiased running
    variance as ``torch.nn.BatchNorm2d``); Wu and He, Group Normalization, ECCV 2018.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["item_counts", "stat_dtype", "update_running_stats", "batch_norm_forward", "batch_norm_centred",
           "batch_norm_backward", "group_norm_forward", "group_norm_centred", "group_norm_backward"]

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def item_counts(valid: Tensor, dtype: torch.dtype) -> Tensor:
    """Each item's number of valid cells, ``Tensor[B]`` in ``dtype``: a reduction of the valid map
    ``Tensor[B, 1, *S]`` on its device (exact below 2**24 cells in float32)."""
    return valid.flatten(1).sum(1, dtype=dtype)


def stat_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype statistics are taken in for inputs of ``dtype``: float32 for float16 / bfloat16,
    else ``dtype`` itself (float32, float64)."""
    return torch.float32 if dtype in _LOW_PRECISION else dtype


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
            if momentum is None:  # in the statistics' dtype, as torch's float(1 / num_batches_tracked)
                factor = num_batches_tracked.to(running_mean.dtype).reciprocal()
        unbiased = var * (n / (n - 1).clamp(min=1) if isinstance(n, Tensor) else n / max(n - 1, 1))
        running_mean.mul_(1 - factor).add_(mean.to(running_mean.dtype) * factor)
        running_var.mul_(1 - factor).add_(unbiased.to(running_var.dtype) * factor)


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


def _select(t: Tensor, valid: Tensor, bits: Tensor | None, dtype: torch.dtype) -> Tensor:
    """``torch.where(valid, t.to(dtype), 0)`` bit for bit: whatever the padding holds, NaN
    included, is never read.

    In float32 / float64 the select is a bitwise and of ``t``'s bits with ``bits``
    (:func:`_select_bits`; +0.0 in the padding): torch's ``where`` with a mask broadcast over the
    channels is 4-5x slower on the CPU, a bitwise and as fast as a product."""
    if bits is None:
        return torch.where(valid, t.to(dtype), 0.0)
    if t.dtype == dtype:
        return torch.bitwise_and(t.view(bits.dtype), bits).view(dtype)
    zeroed = t.to(dtype)
    zeroed.view(bits.dtype).bitwise_and_(bits)
    return zeroed


def _valid_part(t: Tensor, valid: Tensor, bits: Tensor | None, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """:func:`_select` and its per-channel sums ``Tensor[C]``."""
    zeroed = _select(t, valid, bits, dtype)
    return zeroed, _channel_sums(zeroed)


def _shape(t: Tensor) -> tuple[int, ...]:
    """``(1, C, 1, ...)``: a per-channel vector broadcast over ``t`` (``Tensor[B, C, *S]``)."""
    return (1, t.shape[1]) + (1,) * (t.dim() - 2)


def batch_norm_forward(
    x: Tensor, weight: Tensor | None, bias: Tensor | None, valid: Tensor, n: Tensor | int, eps: float,
    zero_padding: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Batch norm with statistics over every item's valid cells: ``y = a (x - mean) + bias`` on
    valid cells, ``bias`` on padded ones (0 with ``zero_padding``), ``a = weight / sqrt(var + eps)``.

    ``xc = x`` with zeros in its padding (a select), ``mean = sum(xc) / n``, then ``xc -= valid *
    mean`` (zeros stay in the padding), ``var = sum(xc^2) / n`` (two passes, no cancellation).

    Args:
        x (Tensor[B, C, *S]): features, any floating dtype, any memory format.
        weight, bias (Tensor[C], optional): the affine map.
        valid (Tensor[B, 1, *S], bool): True on valid cells.
        n (int or Tensor[]): the number of valid cells (a Tensor in the statistics' dtype).
        eps (float): added to the variance. zero_padding (bool): zeros in the output's padding.

    Returns:
        ``(y, mean, var, invstd, xc)``: ``y`` (Tensor[B, C, *S]) in ``x``'s dtype; ``mean``, the
        biased ``var`` and ``invstd`` (Tensor[C]) and the centred input ``xc`` (Tensor[B, C, *S],
        zeros in the padding, what the backward reads) in the statistics' dtype.
    """
    c = x.shape[1]
    shape = _shape(x)
    dtype = stat_dtype(x.dtype)
    bits = _select_bits(valid, dtype)
    xc, sums = _valid_part(x, valid, bits, dtype)
    mean = sums / n
    weights = valid.to(dtype)
    xc.addcmul_(weights, mean.view(shape), value=-1)
    if xc.is_contiguous():  # a norm along each contiguous row: one pass, no temporary map
        var = torch.linalg.vector_norm(xc.view(xc.shape[0], c, -1), dim=2).square_().sum(0) / n
    else:
        var = (xc * xc).sum((0, *range(2, x.dim()))) / n
    invstd = torch.rsqrt(var + eps)
    a = invstd if weight is None else invstd * weight.to(dtype)
    y = xc * a.view(shape)  # 0 in the padding, where xc is 0
    if bias is not None and zero_padding:  # the bias on valid cells only
        y.addcmul_(weights, bias.to(dtype).view(shape))
    elif bias is not None:  # in place: an addcmul whose first operand broadcasts is slower on the CPU
        y.add_(bias.to(dtype).view(shape))
    return y.to(x.dtype), mean, var, invstd, xc


def batch_norm_centred(x: Tensor, valid: Tensor, mean: Tensor) -> Tensor:
    """``x - mean`` on valid cells, zeros in the padding (never read), in the statistics' dtype:
    the ``xc`` of :func:`batch_norm_forward` from its ``mean`` (``Tensor[C]``)."""
    dtype = mean.dtype
    xc = _select(x, valid, _select_bits(valid, dtype), dtype)
    return xc.addcmul_(valid.to(dtype), mean.view(_shape(x)), value=-1)


def batch_norm_backward(
    dy: Tensor, xc: Tensor, valid: Tensor, weight: Tensor | None, invstd: Tensor, n: Tensor | int,
    zero_padding: bool, need_x: bool, need_weight: bool, need_bias: bool, dtype: torch.dtype,
    param_dtype: torch.dtype,
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """The closed-form backward of :func:`batch_norm_forward` with sums over valid cells: the
    gradient's padding selected out (``xc``'s is 0), the sum of ``dy * xc`` as batched dot products
    (no product map), ``grad_x`` written into the buffer of the selected gradient (one new map, as
    torch's backward) with zeros in its padding. Without ``zero_padding`` the bias's gradient
    sums the padding too (the padding holds the bias there).

    Args:
        dy (Tensor[B, C, *S]): the output's gradient. xc (Tensor[B, C, *S]): the centred input.
        valid (Tensor[B, 1, *S], bool): True on valid cells. weight (Tensor[C], optional).
        invstd (Tensor[C]): ``1 / sqrt(var + eps)``. n (int or Tensor[]): the number of valid cells.
        zero_padding (bool): as in the forward. need_x, need_weight, need_bias (bool): which
        gradients to compute. dtype, param_dtype (torch.dtype): of ``grad_x``, of the parameters'.

    Returns:
        ``(grad_x, grad_weight, grad_bias)``, None where not needed.
    """
    shape = _shape(xc)
    grad_x = grad_w = grad_b = sum_dz = None
    if need_x or need_weight or (need_bias and zero_padding):
        dz, sum_dz = _valid_part(dy, valid, _select_bits(valid, xc.dtype), xc.dtype)
    if need_x or need_weight:
        projected = _channel_dots(dz, xc)  # sum of dz * xc per channel (xc is 0 in the padding)
        if need_weight:
            grad_w = (projected * invstd).to(param_dtype)
        if need_x:
            # a (dy - mean(dy) - xc invstd^2 mean(dy xc)), means over valid cells, 0 in the padding
            a = invstd if weight is None else invstd * weight.to(xc.dtype)
            grad_x = dz.mul_(a.view(shape))
            grad_x.addcmul_(xc, (a * invstd.square() * projected / n).view(shape), value=-1)
            grad_x.addcmul_(valid.to(xc.dtype), (a * sum_dz / n).view(shape), value=-1)
            grad_x = grad_x.to(dtype)
    if need_bias:
        grad_b = (sum_dz if zero_padding else _channel_sums(dy.to(xc.dtype))).to(param_dtype)
    return grad_x, grad_w, grad_b


def _group_counts(valid: Tensor, group_size: int, dtype: torch.dtype) -> Tensor:
    """Each item's number of values per group, ``Tensor[B, 1, 1, 1]`` (at least 1)."""
    return (item_counts(valid, dtype) * group_size).clamp_(min=1).view(-1, 1, 1, 1)


def group_norm_forward(
    x: Tensor, weight: Tensor | None, bias: Tensor | None, valid: Tensor, num_groups: int, eps: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Group norm (instance norm: ``num_groups = C``) with each item's statistics over its valid
    cells, every item and group in one masked reduction; zeros in the output's padding.

    Args:
        x (Tensor[B, C, *S]): features. weight, bias (Tensor[C], optional): the affine map.
        valid (Tensor[B, 1, *S], bool): True on valid cells. num_groups (int): divides ``C``.
        eps (float): added to the variance.

    Returns:
        ``(y, mean, rstd, centred)``: ``y`` (Tensor[B, C, *S]) in ``x``'s dtype, zeros in the
        padding; ``mean`` and ``rstd`` (Tensor[B, G]) and ``centred`` (Tensor[B, G, C / G, S1 * ...],
        ``x - mean`` with zeros in the padding, what the backward reads) in the statistics' dtype.
    """
    b, c = x.shape[:2]
    dtype = stat_dtype(x.dtype)
    group = (b, num_groups, c // num_groups, -1)
    weights = valid.to(dtype).reshape(b, 1, 1, -1)
    n = _group_counts(valid, c // num_groups, dtype)
    centred = torch.where(valid, x.to(dtype), 0.0).reshape(group)
    mean = centred.sum((2, 3), keepdim=True) / n
    centred = torch.addcmul(centred, weights, mean, value=-1)  # zeros stay in the padding
    var = (centred * centred).sum((2, 3), keepdim=True) / n
    rstd = torch.rsqrt(var + eps)
    out = (centred * rstd).reshape(x.shape)
    shape = _shape(x)
    if weight is not None:
        out = out * weight.to(dtype).view(shape)
    if bias is not None:
        out = out + bias.to(dtype).view(shape)
    return torch.where(valid, out, 0.0).to(x.dtype), mean.view(b, num_groups), rstd.view(b, num_groups), centred


def group_norm_centred(x: Tensor, valid: Tensor, mean: Tensor) -> Tensor:
    """``x - mean`` on valid cells, zeros in the padding (never read), ``Tensor[B, G, C / G, S1 *
    ...]`` in the statistics' dtype: the ``centred`` of :func:`group_norm_forward` from its ``mean``
    (``Tensor[B, G]``)."""
    b, c = x.shape[:2]
    g = mean.shape[1]
    centred = torch.where(valid, x.to(mean.dtype), 0.0).reshape(b, g, c // g, -1)
    return centred.addcmul_(valid.to(mean.dtype).reshape(b, 1, 1, -1), mean.view(b, g, 1, 1), value=-1)


def group_norm_backward(
    dy: Tensor, centred: Tensor, valid: Tensor, weight: Tensor | None, rstd: Tensor, num_groups: int,
    need_x: bool, need_weight: bool, need_bias: bool, dtype: torch.dtype, param_dtype: torch.dtype,
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """The closed-form backward of :func:`group_norm_forward`: with ``g = dy * weight`` on valid
    cells (the padding's gradient selected out) and ``xhat = centred * rstd``, ``grad_x = rstd (g -
    mean(g) - xhat mean(g xhat))``, means over each item and group's valid cells; zeros in the
    padding. The parameters' gradients sum valid cells only (the padding holds 0).

    Args:
        dy (Tensor[B, C, *S]): the output's gradient. centred (Tensor[B, G, C / G, S1 * ...]): as
        returned by the forward. valid (Tensor[B, 1, *S], bool). weight (Tensor[C], optional).
        rstd (Tensor[B, G]). num_groups (int). need_x, need_weight, need_bias (bool): which
        gradients to compute. dtype, param_dtype (torch.dtype): of ``grad_x``, of the parameters'.

    Returns:
        ``(grad_x, grad_weight, grad_bias)``, None where not needed.
    """
    b, c = dy.shape[:2]
    size = c // num_groups
    st = centred.dtype
    dz = torch.where(valid, dy.to(st), 0.0).reshape(centred.shape)
    xhat = centred * rstd.view(b, num_groups, 1, 1)
    grad_x = grad_w = grad_b = None
    if need_weight:
        grad_w = (dz * xhat).sum((0, 3)).reshape(c).to(param_dtype)
    if need_bias:
        grad_b = dz.sum((0, 3)).reshape(c).to(param_dtype)
    if need_x:
        g = dz if weight is None else dz * weight.to(st).view(1, num_groups, size, 1)
        n = _group_counts(valid, size, st)
        mean_g = g.sum((2, 3), keepdim=True) / n
        mean_gx = (g * xhat).sum((2, 3), keepdim=True) / n
        gx = g.addcmul_(valid.to(st).reshape(b, 1, 1, -1), mean_g, value=-1).addcmul_(xhat, mean_gx, value=-1)
        grad_x = gx.mul_(rstd.view(b, num_groups, 1, 1)).reshape(dy.shape).to(dtype)
    return grad_x, grad_w, grad_b
