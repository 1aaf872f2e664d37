"""Normalisation over each item's valid cells: batch norm (statistics of every item's valid cells,
running statistics updated from them), group and instance norm (each item's own statistics).

Every function takes the feature map's padding: a :class:`~vispos.Padding` (None: no padding,
the stock layer runs) or a bool mask ``Tensor[B, 1, *S]`` (True = padding). Every item's statistics
come from one masked reduction over the canvas (a select keeps the padding's values out, then
sums per channel, or per item and group): no loop over items and no read of the device, the same
for a box per item (every batch vispos builds) and an arbitrary mask (MONAI's decoder). Batch
norm's total count comes from the boxes on the host, or from the mask on the device; its backward
is the closed form. Padded cells of the outputs are meaningless (finite with batch statistics;
in eval with running statistics, the affine map of whatever the padding held).

Both run as torch custom ops (:mod:`vispos.ops.batch_norm`, :mod:`vispos.ops.group_norm`): two
Triton kernels each way on CUDA (the running statistics updated inside the forward's second), the
torch code of :mod:`vispos.ops._norm_reference` on the CPU.

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

from ..._checks import check_int
from ...ops._norm_reference import update_running_stats
from ...ops.batch_norm import batch_norm as masked_batch_norm
from ...ops.group_norm import group_norm as masked_group_norm
from ...padding import Padding
from ._pools import fill

__all__ = ["update_running_stats", "check_sync_batch_norm", "batch_norm", "batch_norm_module", "group_norm"]


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


def _mask_of(x: Tensor, padding: Padding | Tensor, op: str) -> tuple[Tensor, int]:
    """The padding mask ``Tensor[B, 1, *S]`` of ``padding`` for ``x`` (a mask is checked by the op)
    and its valid cells known on the host (0: counted on the device), see
    :meth:`~vispos.Padding._channel_facts`.

    Raises:
        ValueError: a :class:`~vispos.Padding` whose batch or spatial sizes are not ``x``'s.
    """
    if isinstance(padding, Tensor):
        return padding, 0
    shape = x.shape
    if padding.batch != shape[0] or padding.spatial != shape[2:]:
        want = (shape[0], *shape[2:])
        raise ValueError(f"{op}: the padding describes a batch of {padding.batch} with spatial sizes "
                         f"{tuple(padding.spatial)}, but x has shape {tuple(x.shape)} (batch {want[0]}, spatial "
                         f"{want[1:]})")
    return padding._channel_facts()


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
        Tensor[B, C, *S] in ``x``'s dtype; padded cells are padding: finite with batch statistics, in
        eval with running statistics the affine map of what they held,
        zeros with ``zero_padding``.

    Raises:
        ValueError: a :class:`~vispos.Padding` whose batch or spatial sizes are not ``x``'s; in
            training, one valid value per channel (torch's batch norm refuses it too); the argument
            checks of :func:`vispos.ops.batch_norm.batch_norm` (shapes, devices, strides).
        TypeError: a mask that is not bool.

    References:
        Ioffe and Szegedy, ICML 2015; Chan, Golub and LeVeque, 1983.
    """
    use_batch = training or running_mean is None or running_var is None
    if not use_batch or padding is None:
        y = F.batch_norm(x, running_mean, running_var, weight, bias, use_batch, momentum or 0.0, eps)
        if not zero_padding or padding is None:
            return y
        return fill(y, padding, 0.0) if isinstance(padding, Padding) else y.masked_fill(padding, 0.0)
    # the count from the boxes on the host (no map read for them); an arbitrary mask's is counted
    # on the device (0)
    mask, n = _mask_of(x, padding, "batch norm")
    if not training:  # batch statistics without running ones: nothing to update
        running_mean = running_var = num_batches_tracked = None
    return masked_batch_norm(x, weight, bias, mask, n, eps, zero_padding, momentum, running_mean, running_var,
                                num_batches_tracked)


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
    # parameters and buffers read from their dicts: nn.Module.__getattr__ costs a microsecond each,
    # and a network calls this for every batch norm of every step
    params, buffers, training = bn._parameters, bn._buffers, bn.training
    running_mean = buffers.get("running_mean")
    track = training and bn.track_running_stats
    use_running = not training and running_mean is not None
    keep = track or use_running
    return batch_norm(
        x, padding, running_mean if keep else None, buffers.get("running_var") if keep else None,
        params.get("weight"), params.get("bias"), training, bn.momentum, bn.eps,
        buffers.get("num_batches_tracked") if track else None, zero_padding,
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
        TypeError: ``num_groups`` is not an int.
        ValueError: ``num_groups`` is below 1; a box of one cell with one channel per group (torch
            refuses the item alone); a padding whose batch or spatial sizes are not ``x``'s.

    References:
        Wu and He, Group Normalization, ECCV 2018.
    """
    num_groups = check_int(num_groups, "num_groups", minimum=1)
    if padding is None or (isinstance(padding, Padding) and padding.kind == "none"):
        return F.group_norm(x, num_groups, weight, bias, eps)  # every cell is valid
    if x.shape[1] // num_groups == 1 and isinstance(padding, Padding) and padding.kind == "rectangular":
        for item, size in enumerate(padding.sizes):
            if math.prod(size) == 1:  # torch's group norm refuses the item alone
                raise ValueError(
                    f"group norm: item {item} has 1 valid cell and {num_groups} groups of 1 channel, so 1 value "
                    "per group; torch's group norm expects more than 1 value per group"
                )
    mask = _mask_of(x, padding, "group norm")[0]
    return masked_group_norm(x, weight, bias, mask, num_groups, eps)
