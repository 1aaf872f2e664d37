"""Frozen batch norm for 2D (torchvision, timm) or 3D backbones: fixed statistics, fixed affine.

Private module; the public names are re-exported by :mod:`vispos.backbones`.

References:
    torchvision ``ops.FrozenBatchNorm2d``; Carion et al., DETR ``models/backbone.py``; timm
    ``layers/norm_act.py`` (``FrozenBatchNormAct2d``).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torchvision.ops import FrozenBatchNorm2d

from .. import _deprecation
from .._checks import check_int, check_number

__all__ = ["FrozenBatchNorm3d", "freeze_batch_norm"]


class FrozenBatchNorm3d(FrozenBatchNorm2d):
    """Batch norm over ``(N, C, D, H, W)`` with fixed statistics and affine parameters.

    torchvision's :class:`~torchvision.ops.FrozenBatchNorm2d` (same buffers, same state-dict keys,
    ``num_batches_tracked`` dropped on load) with the per-channel scale broadcast over three
    spatial axes: ``y = x * w / sqrt(running_var + eps) + (b - running_mean * w / sqrt(...))``.

    Args:
        num_features (int): ``C``.
        eps (float): added to the variance. Default 1e-5.

    Shape:
        input and output ``Tensor[N, C, D, H, W]``, same dtype.

    Raises:
        TypeError: a non-int ``num_features`` or a non-number ``eps``.
        ValueError: ``num_features`` < 1 or a negative ``eps``; at forward, an input that is not
            5-D.

    References:
        torchvision ``ops.misc.FrozenBatchNorm2d``; DETR ``models/backbone.py``.
    """

    def __init__(self, num_features: int, eps: float = 1e-5) -> None:
        num_features = check_int(num_features, "num_features", minimum=1)
        eps = check_number(eps, "eps", nonnegative=True)
        super().__init__(num_features, eps=eps)

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 5:
            raise ValueError(f"FrozenBatchNorm3d expects (N, C, D, H, W), got shape {tuple(x.shape)}")
        shape = (1, -1, 1, 1, 1)
        scale = self.weight.reshape(shape) * (self.running_var.reshape(shape) + self.eps).rsqrt()
        bias = self.bias.reshape(shape) - self.running_mean.reshape(shape) * scale
        return x * scale + bias


def _frozen_copy(bn: nn.Module, num_axes: int) -> nn.Module | None:
    """A frozen twin of one batch-norm module, or None when ``bn`` is not one we convert."""
    frozen: nn.Module
    if type(bn).__name__ in ("BatchNormAct2d", "SyncBatchNormAct") and type(bn).__module__.startswith("timm"):
        from timm.layers import FrozenBatchNormAct2d

        frozen = FrozenBatchNormAct2d(bn.num_features, eps=bn.eps, apply_act=False)
        frozen.act, frozen.drop = bn.act, bn.drop  # keep timm's fused activation
    elif type(bn) is nn.BatchNorm3d or (type(bn) is nn.SyncBatchNorm and num_axes == 3):
        frozen = FrozenBatchNorm3d(bn.num_features, eps=bn.eps)
    elif type(bn) in (nn.BatchNorm2d, nn.SyncBatchNorm):
        frozen = FrozenBatchNorm2d(bn.num_features, eps=bn.eps)
    else:
        return None
    with torch.no_grad():
        if bn.affine:
            frozen.weight.copy_(bn.weight.detach())
            frozen.bias.copy_(bn.bias.detach())
        if bn.track_running_stats and bn.running_mean is not None:
            frozen.running_mean.copy_(bn.running_mean)
            frozen.running_var.copy_(bn.running_var)
    ref = bn.running_mean if bn.running_mean is not None else bn.weight
    return frozen.to(device=ref.device, dtype=ref.dtype)


@_deprecation.renamed_kwargs(n_spatial="num_axes")
def freeze_batch_norm(module: nn.Module, num_axes: int = 2) -> nn.Module:
    """Replaces every ``BatchNorm2d`` / ``BatchNorm3d`` in ``module`` by a frozen twin, in place.

    ``nn.BatchNorm2d`` and ``nn.SyncBatchNorm`` become torchvision's ``FrozenBatchNorm2d``,
    ``nn.BatchNorm3d`` becomes :class:`FrozenBatchNorm3d`, timm's ``BatchNormAct2d`` becomes timm's
    ``FrozenBatchNormAct2d`` (so its fused activation is kept). Statistics, affine parameters and
    ``eps`` are copied, so the output equals the original module's in ``eval()`` mode.

    Args:
        module (nn.Module): modified in place; the adapters call this on their own private copy.
        num_axes (int): 2 or 3, the rank a ``SyncBatchNorm`` (which does not know it) works on.

    Returns:
        nn.Module: ``module`` itself, or its replacement when ``module`` is a batch norm.

    References:
        DETR ``models/backbone.py`` (``FrozenBatchNorm2d``); torchvision ``ops.FrozenBatchNorm2d``.
    """
    top = _frozen_copy(module, num_axes)
    if top is not None:
        return top
    for name, child in list(module.named_children()):
        frozen = _frozen_copy(child, num_axes)
        if frozen is not None:
            setattr(module, name, frozen)
        else:
            freeze_batch_norm(child, num_axes)
    return module
