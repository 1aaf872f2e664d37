"""torchvision's segmenters (FCN, DeepLabV3, LR-ASPP) exact per image: the one layer the rule book
needs a row for, DeepLabV3's image pooling branch (``ASPPPooling``).

The segmenters themselves go through :func:`~vispos.make_padding_invariant`'s graph rewrite: the
backbone and heads layer by layer, the heads' ``F.interpolate(x, size=input.shape[-2:])`` resized
per image from its own map to its own size. ``ASPPPooling`` averages its input over every cell,
runs a 1x1 convolution, norm and activation on the pooled value and interpolates it back to the
input's size: here the average is over each image's own cells, and the pooled value is spread
over the canvas (each image's cells get what its own map gets alone).

This module imports nothing of torchvision: the rule reads the module's children.

References:
    Chen et al., Rethinking Atrous Convolution for Semantic Image Segmentation (DeepLabV3), 2017;
    torchvision ``models/segmentation/deeplabv3.py`` (``ASPPPooling``).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from ...padding import Padding

__all__ = ["SEGMENTATION_RULES", "aspp_pooling"]


def aspp_pooling(module: nn.Module, x: Tensor, padding: Padding | None) -> Tensor:
    """``ASPPPooling`` (``nn.Sequential``: ``AdaptiveAvgPool2d(1)``, then layers on the pooled
    value) on a padded batch ``Tensor[B, C, H, W]``: each item's average over its own cells, the
    module's other layers, then bilinear up-sampling to ``(H, W)`` as the module does.

    Args:
        module (nn.Module): the ``ASPPPooling`` module.
        x (Tensor[B, C, H, W]): the input map.
        padding (Padding, optional): ``x``'s padding (True = padding); None: the module as it is.

    Returns:
        Tensor[B, C', H, W]: on each item's cells, what the module gives the item alone.
    """
    if padding is None or padding.kind == "none":
        return module(x)
    valid = (~padding.mask).unsqueeze(1).to(x.dtype)
    pooled = (x * valid).sum(dim=(-2, -1), keepdim=True) / valid.sum(dim=(-2, -1), keepdim=True)
    layers = list(module)
    for layer in layers[1:]:
        pooled = layer(pooled)
    return F.interpolate(pooled, size=x.shape[-2:], mode="bilinear", align_corners=False)


def _rules() -> tuple:
    from ..rules import PaddingAware

    return (("torchvision.models.segmentation.deeplabv3.ASPPPooling", PaddingAware(aspp_pooling)),)


#: ``(dotted class name, rule)``: the segmenters' rows of the rule book
SEGMENTATION_RULES = _rules()
