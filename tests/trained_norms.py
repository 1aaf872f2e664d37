"""Normalisation layers as a trained network has them, for padding-invariance tests.

With random initialisation (running mean 0, variance 1, weight 1, bias 0; timm zero-initialises some
last norms) zero padding stays zero through a network and hides a leak; trained statistics and
affine weights do not.
"""

import torch
from torch import nn


def trained_like(model: nn.Module, seed: int = 0) -> nn.Module:
    """``model`` with random running statistics (mean in [-0.5, 0.5), variance in [0.5, 1.5)) and
    norm affine weights (weight in [0.5, 1.5), bias in [-0.5, 0.5)), in place; returns it."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(getattr(m, "running_mean", None), torch.Tensor) and isinstance(m.running_var, torch.Tensor):
                m.running_mean.copy_(torch.rand(m.running_mean.shape, generator=g, dtype=m.running_mean.dtype) - 0.5)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g, dtype=m.running_var.dtype) + 0.5)
            norm_types = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm)
            is_norm = isinstance(m, norm_types) or "Norm" in type(m).__name__
            for attr, low in (("weight", 0.5), ("bias", -0.5)):
                p = getattr(m, attr, None)
                if is_norm and isinstance(p, torch.Tensor) and p.dim() == 1:
                    p.copy_(torch.rand(p.shape, generator=g, dtype=p.dtype) + low)
    return model
