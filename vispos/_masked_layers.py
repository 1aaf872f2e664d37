"""Layers that mix cells, restricted to each item's valid cells: the math behind padding invariance.

A layer that mixes cells gives an item of a padded batch, on its own cells, what it gives the item
alone when (1) a convolution or average pool sees zeros outside the item (what its own zero
padding gives alone), a max pool sees ``-inf``, and (2) every statistic (batch norm in training,
group / instance norm, global pooling) is taken over valid cells only. These functions do (1)
and (2) given a padding mask broadcastable to the input, ``Tensor[B, 1, *S]`` bool, **True =
padding** (DETR's convention); ``None`` means no padding and calls the stock layer.

Used by :mod:`vispos.backbones._invariant` (padding-invariant backbones), the
:class:`~vispos.backbones.Joiner`'s input projections and :mod:`vispos.monai` (UNETR's decoder).
Private module: the public switch is ``padding_invariant=True``.

References:
    Ioffe and Szegedy, Batch Normalization, ICML 2015 (statistics; unbiased running variance as
    ``torch.nn.BatchNorm2d``); Wu and He, Group Normalization, ECCV 2018; Ulyanov et al.,
    Instance Normalization, 2016; Liu et al., Partial Convolution based Padding, 2018 (a
    convolution that sees only valid cells).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "update_running_stats",
    "check_sync_batch_norm",
    "fill_padding",
    "masked_batch_norm",
    "masked_batch_norm_module",
    "masked_group_norm",
    "masked_global_pool",
    "masked_avg_pool",
]

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def fill_padding(x: Tensor, pad: Tensor | None, value: float, inplace: bool = False) -> Tensor:
    """``x`` with every padded cell set to ``value`` (0 before a convolution, ``-inf`` before a
    max pool). NaN or inf left in the padding by earlier layers is replaced too.

    Args:
        x (Tensor[B, C, *S]): features.
        pad (Tensor[B, 1, *S] bool, optional): True = padding; None returns ``x`` itself.
        value (float): the fill.
        inplace (bool): write into ``x`` when autograd does not track it (no grad, or ``x`` does not
            require grad). The caller guarantees that ``x`` is not a tensor the user handed in.

    Returns:
        Tensor[B, C, *S]: ``x``'s dtype.
    """
    if pad is None:
        return x
    if inplace and not (torch.is_grad_enabled() and x.requires_grad):
        return x.masked_fill_(pad, value)
    return x.masked_fill(pad, value)


def _valid_count(pad: Tensor, dims: Sequence[int], dtype: torch.dtype) -> Tensor:
    """Number of valid cells over ``dims`` of ``pad`` (as ``dtype``, at least 1)."""
    return (~pad).sum(tuple(dims), keepdim=True, dtype=dtype).clamp_(min=1)


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


def masked_batch_norm(
    x: Tensor,
    pad: Tensor,
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

    With ``training`` (or without running statistics) the per-channel mean and biased variance are
    those of the valid cells of every item; the running statistics (when given) are updated from
    them as ``torch.nn.BatchNorm2d`` does (momentum, or the cumulative average when ``momentum``
    is None, with the unbiased variance ``var * n / (n - 1)``). With running statistics in eval
    mode the layer is a per-cell affine map and ``pad`` is not used.

    Args:
        x (Tensor[B, C, *S]): features, any floating dtype (statistics in float32 for 16-bit).
        pad (Tensor[B, 1, *S] bool): True = padding.
        running_mean, running_var (Tensor[C], optional): updated in place in training.
        weight, bias (Tensor[C], optional): the affine map.
        training (bool): use (and update) batch statistics.
        momentum (float, optional): running-average factor; None: cumulative average.
        eps (float): added to the variance.
        num_batches_tracked (Tensor[], optional): incremented in training.

    Returns:
        Tensor[B, C, *S] in ``x``'s dtype; padded cells hold ``bias`` (they are padding).

    References:
        Ioffe and Szegedy, ICML 2015; ``torch.nn.modules.batchnorm._BatchNorm.forward``.
    """
    use_batch = training or running_mean is None or running_var is None
    if not use_batch:
        return F.batch_norm(x, running_mean, running_var, weight, bias, False, 0.0, eps)
    stat_dtype = torch.float32 if x.dtype in _LOW_PRECISION else x.dtype
    xf = x.to(stat_dtype)
    dims = (0, *range(2, x.dim()))
    n = _valid_count(pad, dims, stat_dtype)  # (1, 1, ...): the same count for every channel
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


def masked_batch_norm_module(x: Tensor, pad: Tensor | None, bn: nn.modules.batchnorm._BatchNorm) -> Tensor:
    """A batch-norm module (``BatchNorm1d/2d/3d``, ``SyncBatchNorm`` on one process) on a padded
    batch: :func:`masked_batch_norm` with the module's parameters, buffers and mode; the module
    itself when there is no padding or it uses its running statistics.

    Returns:
        Tensor[B, C, *S] in ``x``'s dtype.

    Raises:
        ValueError: a ``SyncBatchNorm`` in training across several processes.
    """
    if pad is None or not isinstance(bn, nn.modules.batchnorm._BatchNorm):
        return bn(x)  # no padding, or a frozen batch norm swapped in after the graph was built
    uses_batch = bn.training or bn.running_mean is None or bn.running_var is None
    if not uses_batch:  # the batch norm alone (timm's BatchNormAct2d adds its activation after)
        return F.batch_norm(x, bn.running_mean, bn.running_var, bn.weight, bn.bias, False, 0.0, bn.eps)
    check_sync_batch_norm(bn)
    track = bn.training and bn.track_running_stats
    return masked_batch_norm(
        x, pad,
        bn.running_mean if track or not bn.training else None,
        bn.running_var if track or not bn.training else None,
        bn.weight, bn.bias, True, bn.momentum, bn.eps,
        bn.num_batches_tracked if track else None,
    )


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


def masked_group_norm(
    x: Tensor, pad: Tensor | None, num_groups: int, weight: Tensor | None, bias: Tensor | None, eps: float
) -> Tensor:
    """GroupNorm (InstanceNorm: ``num_groups = C``) with each item's statistics over its valid cells.

    Args:
        x (Tensor[B, C, *S]): features.
        pad (Tensor[B, 1, *S] bool, optional): True = padding; None: ``F.group_norm``.
        num_groups (int): divides ``C``.
        weight, bias (Tensor[C], optional): the affine map.
        eps (float): added to the variance.

    Returns:
        Tensor[B, C, *S] in ``x``'s dtype.

    References:
        Wu and He, Group Normalization, ECCV 2018.
    """
    if pad is None:
        return F.group_norm(x, num_groups, weight, bias, eps)
    b, c = x.shape[:2]
    spatial = x.shape[2:]
    stat_dtype = torch.float32 if x.dtype in _LOW_PRECISION else x.dtype
    xg = x.to(stat_dtype).reshape(b, num_groups, c // num_groups, *spatial)
    pg = pad.reshape(b, 1, 1, *spatial)
    dims = tuple(range(2, xg.dim()))
    n = _valid_count(pg, dims, stat_dtype) * (c // num_groups)
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


def masked_global_pool(x: Tensor, pad: Tensor | None, mode: str, dims: Sequence[int], keepdim: bool) -> Tensor:
    """Mean, sum or max over the spatial ``dims`` of each item's valid cells (global average pooling,
    squeeze-and-excitation).

    Args:
        x (Tensor[B, C, *S]): features.
        pad (Tensor[B, 1, *S] bool, optional): True = padding; None: the plain reduction.
        mode (str): ``"mean"``, ``"sum"`` or ``"max"``.
        dims (sequence of int): every spatial dim of ``x``.
        keepdim (bool): keep the reduced dims (size 1).

    Returns:
        Tensor[B, C] (or ``[B, C, 1, ...]`` with ``keepdim``) in ``x``'s dtype.
    """
    dims = tuple(dims)
    if mode == "max":
        src = x if pad is None else x.masked_fill(pad, float("-inf"))
        return src.amax(dims, keepdim=keepdim)
    if pad is None:
        return x.mean(dims, keepdim=keepdim) if mode == "mean" else x.sum(dims, keepdim=keepdim)
    total = x.masked_fill(pad, 0).sum(dims, keepdim=True)
    if mode == "mean":
        total = total / _valid_count(pad, dims, total.dtype)
    return total if keepdim else total.flatten(1)


_POOL_FN = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


def masked_avg_pool(
    x: Tensor,
    pad: Tensor | None,
    kernel_size: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    ceil_mode: bool,
    count_include_pad: bool,
    divisor_override: int | None,
) -> Tensor:
    """Average pooling of a padded batch that divides as the item alone would.

    With ``count_include_pad=True`` (no ``ceil_mode``) or a ``divisor_override`` the divisor does not
    depend on where the item ends, so zeros in the padding suffice. With
    ``count_include_pad=False`` the divisor is the number of the item's own cells in the window:
    the window sum of the zero-filled features over the window count of valid cells.

    Args:
        x (Tensor[B, C, *S]): features. pad (Tensor[B, 1, *S] bool, optional): True = padding.
        kernel_size, stride, padding (sequence of int): per axis. ceil_mode, count_include_pad
        (bool), divisor_override (int, optional): as ``torch.nn.AvgPool2d``.

    Returns:
        Tensor[B, C, *S_out] in ``x``'s dtype.
    """
    pool = _POOL_FN[x.dim() - 2]
    if pad is None:
        return pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
    filled = x.masked_fill(pad, 0)
    if count_include_pad or divisor_override is not None:
        return pool(filled, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
    total = pool(filled, kernel_size, stride, padding, ceil_mode, True, 1)
    count = pool((~pad).to(total.dtype), kernel_size, stride, padding, ceil_mode, True, 1)
    return total / count.clamp_(min=1)
