"""The real-time DETRs' 2D sin-cos table (RT-DETR, RT-DETRv2, D-FINE, DEIM), mask-aware.

The hybrid encoder of RT-DETR adds a fixed 2D sin-cos table to its last feature level before
the intra-scale attention (AIFI). Each axis gets ``embed_dim / 4`` frequencies ``w_k =
temperature^(-k / (embed_dim / 4))`` on 0-based positions, laid out ``[sin_h | cos_h | sin_w |
cos_w]`` (transformers' ``build_2d_sinusoidal_position_embedding``, computed in float64), tokens
row-major. The original code builds its meshgrid over ``(w, h)``: the ``x`` block comes first and
the tokens are column-major, which on a non-square input is another table. Neither takes a mask.

One call into the N-D core :func:`vispos._sincos.sincos_embed` (split layout, angles as
``p * w_k``, sines and cosines of the lines only, broadcast as they are written); a padded batch
takes each item's positions from its own box (:func:`vispos._positions.item_boxes`).

References:
    Zhao et al., DETRs Beat YOLOs on Real-time Object Detection, CVPR 2024 (RT-DETR,
    ``rtdetr_pytorch/src/zoo/rtdetr/hybrid_encoder.py``,
    ``build_2d_sincos_position_embedding``); Peng et al., D-FINE, ICLR 2025; transformers
    ``models/rt_detr/modeling_rt_detr.py``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._checks import check_bool, check_float_dtype, check_multiple, check_sizes
from .._positions import item_boxes
from .._sincos import check_temperature, sincos_embed
from ..nested_tensor import NestedTensor, NestedTensorLike, parse_spatial_input
from ..padding import Padding

__all__ = ["rtdetr_sincos_2d"]


def rtdetr_sincos_2d(
    height: int,
    width: int,
    embed_dim: int = 256,
    temperature: float = 10000.0,
    cls_token: bool = False,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
    *,
    original: bool = False,
    padding: object = None,
) -> Tensor:
    """RT-DETR / D-FINE's 2D sin-cos table of an ``height x width`` feature map, flattened.

    Positions are ``0 .. S - 1``; each axis gets ``embed_dim / 4`` frequencies ``w_k =
    temperature^(-k / (embed_dim / 4))`` and a split block ``[sin, cos]``. By default the table
    is transformers' (``build_2d_sinusoidal_position_embedding`` of RT-DETR, RT-DETRv2, D-FINE
    and DEIM): ``[sin_h | cos_h | sin_w | cos_w]``, tokens row-major (the order of
    ``x.flatten(2)``), computed in float64 (float32 on MPS, as there) and cast once.

    Args:
        height, width (int): the feature map's size.
        embed_dim (int): channels, a positive multiple of 4. Default 256.
        temperature (float): ``T``. Default 10000.
        cls_token (bool): prepend a zero row (transformers' flag). Default False.
        device: where to build it. dtype (torch.dtype): output dtype. Default float32.
        original (bool, keyword-only): the original RT-DETR code's table instead
            (``HybridEncoder.build_2d_sincos_position_embedding(w, h, ...)``): meshgrid over
            ``(w, h)``, so ``[sin_w | cos_w | sin_h | cos_h]`` and tokens column-major (token
            ``t = x * height + y``), computed in float32. On a square map the same table as
            transformers' up to float32 rounding; on any other, another. Default False.
        padding (optional, keyword-only): a padded batch, as a :class:`~vispos.NestedTensor`
            ``(B, C, height, width)`` (or DETR's), its :class:`~vispos.Padding`, a bool mask
            ``Tensor[B, height, width]`` (True = padding) or a feature map (no padding). Each
            item's positions then start at its own first valid cell (the box of a rectangular
            padding, at the origin or not; the bounding box of the valid cells of any other
            mask), so an item in a batch gets the table it gets alone. Padded cells continue the
            item's positions past its box (negative before it, ``>=`` its size after it): finite
            values, meant to be masked.

    Returns:
        Tensor[height * width (+1), embed_dim], or Tensor[B, height * width (+1), embed_dim]
        with ``padding``; in ``dtype``, on ``device`` (on the padding's device with
        ``padding``). Unpadded, equal to transformers'
        ``build_2d_sinusoidal_position_embedding(height, width, embed_dim, temperature,
        cls_token, device, dtype)`` (and with ``original=True`` to the original's ``[0]``).

    Raises:
        TypeError: non-int sizes or ``embed_dim``; non-bool flags; a non-floating ``dtype``; a
            ``padding`` of another type, or a non-bool mask.
        ValueError: non-positive sizes; ``embed_dim`` not a positive multiple of 4; non-positive
            ``temperature``; a ``padding`` whose spatial shape is not ``(height, width)``.

    References:
        Zhao et al., DETRs Beat YOLOs on Real-time Object Detection, CVPR 2024; transformers
        ``build_2d_sinusoidal_position_embedding``; Peng et al., D-FINE, ICLR 2025.
    """
    sizes = check_sizes((height, width), "(height, width)", n=2)
    check_multiple(embed_dim, 4, "embed_dim", "a sin and a cos per frequency, on 2 axes")
    check_temperature(temperature)
    cls_token = check_bool(cls_token, "cls_token")
    original = check_bool(original, "original")
    check_float_dtype(dtype)
    if padding is None:
        device = torch.device("cpu") if device is None else torch.device(device)
        batch, boxes = 1, None
    else:
        # the Protocol last and alone: TorchDynamo cannot check it, and never reaches it for a
        # tensor, a Padding or vispos' NestedTensor
        if not isinstance(padding, (Tensor, Padding, NestedTensor)) and not isinstance(padding, NestedTensorLike):
            raise TypeError(
                "padding must be a NestedTensor, a Padding, a bool mask (B, height, width) or a feature "
                f"map (B, C, height, width), got {type(padding).__name__}"
            )
        found, host = parse_spatial_input(padding, 2)
        if found.spatial != sizes:
            raise ValueError(f"padding has spatial shape {found.spatial}, expected (height, width) = {sizes}")
        batch, device = found.batch, found.device
        boxes = item_boxes(found, host, torch.float64)
    compute = torch.float32 if original or device.type == "mps" else torch.float64
    positions = []
    for axis, size in enumerate(sizes):
        view = [batch if boxes is not None else 1, 1, 1]
        view[1 + axis] = size
        line = torch.arange(size, device=device, dtype=compute) if boxes is None else boxes[0][axis].to(compute)
        positions.append(line.reshape(view))
    if original:  # the meshgrid over (w, h): x block first, x the slower token axis
        positions = [p.transpose(1, 2) for p in positions[::-1]]
        sizes = sizes[::-1]
    table = sincos_embed(
        positions, embed_dim // 2, shape=(batch, *sizes), temperature=temperature, layout="split",
        reciprocal=True, channel_dim=-1, dtype=dtype, compute_dtype=compute,
    ).flatten(1, 2)
    if cls_token:
        table = torch.cat([table.new_zeros(batch, 1, embed_dim), table], dim=1)
    return table if padding is not None else table[0]
