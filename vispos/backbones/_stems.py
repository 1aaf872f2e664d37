"""Backbone stems: the first convolution, adapted to the input's channel count.

References:
    timm ``models/_manipulate.py`` (``adapt_input_conv``).
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["first_conv", "adapt_stem"]


def first_conv(module: nn.Module) -> tuple[str, nn.Module]:
    """The name and module of the first ``Conv2d`` / ``Conv3d`` in registration order.

    Raises:
        ValueError: the module has no convolution.
    """
    for name, mod in module.named_modules():
        if isinstance(mod, (nn.Conv2d, nn.Conv3d)):
            return name, mod
    raise ValueError(f"{type(module).__name__} has no Conv2d / Conv3d to read the input channels from")


def adapt_stem(module: nn.Module, in_chans: int) -> None:
    """Gives the first convolution of ``module`` ``in_chans`` input channels, in place.

    Every new input channel gets the mean of the old ones' kernels times ``old / in_chans``, so an
    input whose channels are all equal gives the same response as before (for ``in_chans=1``
    this is the sum over the RGB kernels, timm's ``adapt_input_conv``).

    Raises:
        ValueError: the stem convolution is grouped.

    References:
        timm ``models/_manipulate.py`` (``adapt_input_conv``).
    """
    name, conv = first_conv(module)
    if conv.in_channels == in_chans:
        return
    if conv.groups != 1:
        raise ValueError(f"cannot adapt the grouped stem convolution {name!r} to in_chans={in_chans}")
    old = conv.in_channels
    weight = conv.weight.detach()
    new_weight = weight.mean(dim=1, keepdim=True).expand(-1, in_chans, *weight.shape[2:]) * (old / in_chans)
    cls = type(conv)
    new = cls(
        in_chans, conv.out_channels, conv.kernel_size, stride=conv.stride, padding=conv.padding,
        dilation=conv.dilation, groups=1, bias=conv.bias is not None, padding_mode=conv.padding_mode,
    ).to(device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        new.weight.copy_(new_weight)
        if conv.bias is not None:
            new.bias.copy_(conv.bias.detach())
    parent_name, _, child = name.rpartition(".")
    parent = module.get_submodule(parent_name) if parent_name else module
    setattr(parent, child, new)
