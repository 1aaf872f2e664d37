"""What models read from a padding mask: Deformable-DETR's valid ratios and the attention mask.

:func:`mask_valid_ratios` is Deformable-DETR's ``get_valid_ratio`` of a bool mask (the same
numbers as :meth:`vispos.Padding.valid_ratios`, which reads them from its boxes where it can,
through the one formula :func:`ratios`); :func:`attn_mask_from_padding` is the key mask of
PyTorch's ``scaled_dot_product_attention`` for the flattened tokens of a padded grid.

References:
    Zhu et al., Deformable DETR, ICLR 2021 (``get_valid_ratio``); PyTorch
    ``torch.nn.functional.scaled_dot_product_attention`` (``attn_mask``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from .._checks import check_int
from ._mask_checks import Spans, check_mask
from ._mask_origin import rectangular_sizes

__all__ = ["ratios", "origin_line_counts", "mask_valid_ratios", "attn_mask_from_padding"]


def ratios(counts: Tensor, spatial: Sequence[int], dtype: torch.dtype) -> Tensor:
    """``counts[:, i] / S_i`` in ``dtype``, last axis first (0 along a zero-size axis): the one
    formula behind :func:`mask_valid_ratios` and :meth:`vispos.Padding.valid_ratios`."""
    counts = counts.to(dtype)
    out = [counts[:, i] / spatial[i] if spatial[i] else counts[:, i] for i in range(len(spatial))]
    return torch.stack(out[::-1], -1)


def origin_line_counts(starts: Spans, stops: Spans) -> list[list[int]]:
    """Per item and axis ``i``, the valid cells on the line through index 0 of the other axes, for
    boxes ``[starts, stops)``: the box's length along ``i`` when it holds index 0 of every other
    axis, else 0. The host-side counts behind :meth:`vispos.Padding.valid_ratios` (equal to what
    :func:`mask_valid_ratios` reads from the mask of those boxes)."""
    n = len(starts[0]) if starts else 0
    return [
        [stop[i] - start[i] if all(start[j] == 0 < stop[j] for j in range(n) if j != i) else 0 for i in range(n)]
        for start, stop in zip(starts, stops)
    ]


def mask_valid_ratios(mask: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """Deformable-DETR's ``get_valid_ratio`` of a bool mask, for 1 to 3 spatial axes.

    The same numbers as :meth:`vispos.Padding.valid_ratios`, which reads them from the padding's
    boxes without touching the device where it can; use this one when you hold a bare mask (it
    never reads the mask on the host). Formerly ``valid_ratios`` (a deprecated alias
    in :mod:`vispos.padding` and :mod:`vispos.backbones`).

    Along axis ``i`` the valid length is the number of valid cells in the line through index 0 of
    every other axis (Deformable-DETR's items sit at the origin), divided by the padded size
    ``S_i``.

    Args:
        mask (Tensor[B, *S], bool): True = padding.
        dtype (torch.dtype): of the result.

    Returns:
        Tensor[B, n]: ratios in **reversed** axis order (``(w, h)`` in 2D), as Deformable-DETR.
        0 along a zero-size axis.

    Raises:
        TypeError: ``mask`` is not a bool tensor.
        ValueError: ``mask`` has no spatial axis.

    References:
        Zhu et al., Deformable DETR, ICLR 2021 (``DeformableTransformer.get_valid_ratio``).
    """
    check_mask(mask)
    if mask.dim() < 2:
        raise ValueError(f"mask must have shape (B, *S) with at least one spatial axis, got {tuple(mask.shape)}")
    return ratios(rectangular_sizes(mask), tuple(mask.shape[1:]), dtype)


def attn_mask_from_padding(mask: Any, num_prefix_tokens: int = 0) -> Tensor:
    """The attention mask that keeps padding tokens out of every token's attention.

    For the flattened tokens of a padded grid, after ``num_prefix_tokens`` tokens that are
    always valid (a class token, registers), as timm's ViT / Eva order them. The result is in
    PyTorch's ``scaled_dot_product_attention`` convention (bool, True = takes part) and
    broadcasts over heads and queries; timm's ``forward_features(x, attn_mask=...)`` passes it
    to every block.

    Args:
        mask (Tensor[B, *S] bool or Padding): True marks padding (at the token grid, e.g.
            :func:`interpolate_mask` of a pixel mask to the patch grid), or a
            :class:`~vispos.Padding` (its ``mask``).
        num_prefix_tokens (int): leading always-valid tokens. Default 0.

    Returns:
        Tensor[B, 1, 1, num_prefix_tokens + prod(S)], bool: True where the key is attended to.

    Raises:
        TypeError: ``mask`` is not a bool tensor; ``num_prefix_tokens`` not an int.
        ValueError: ``num_prefix_tokens`` negative; ``mask`` without a spatial axis.

    References:
        PyTorch ``torch.nn.functional.scaled_dot_product_attention`` (``attn_mask``); DETR's
        ``key_padding_mask`` (the same mask, True = padding, inverted here).
    """
    if not isinstance(mask, Tensor) and hasattr(mask, "kind") and hasattr(mask, "mask"):
        mask = mask.mask  # a Padding
    check_mask(mask)
    num_prefix_tokens = check_int(num_prefix_tokens, "num_prefix_tokens", minimum=0)
    if mask.dim() < 2:
        raise ValueError(f"mask must have shape (B, *S) with at least one spatial axis, got {tuple(mask.shape)}")
    keep = ~mask.flatten(1)
    if num_prefix_tokens:
        keep = torch.cat([keep.new_ones(keep.shape[0], num_prefix_tokens), keep], dim=1)
    return keep[:, None, None, :]
