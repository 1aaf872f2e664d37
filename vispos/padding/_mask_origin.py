"""Origin-anchored (DETR) padding read on the mask's device: per-item sizes and their boxes.

DETR's ``nested_tensor_from_tensor_list`` puts every item at the origin and pads at the end of
every axis, so an item's valid sizes are the valid counts along the lines through the origin
(:func:`rectangular_sizes`, no host synchronisation), and the mask is rectangular when it equals
the boxes of those sizes (:func:`matches_rectangle`, :func:`is_rectangular`).

References:
    Carion et al., End-to-End Object Detection with Transformers, ECCV 2020 (``util/misc.py``,
    ``nested_tensor_from_tensor_list``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ._mask_checks import check_mask

__all__ = ["rectangular_sizes", "rectangular_valid", "origin_boxes", "matches_rectangle", "is_rectangular"]


def rectangular_sizes(mask: Tensor) -> Tensor:
    """Per-item valid sizes of an origin-anchored rectangular padding mask, on its device.

    Reads the line through the origin along every axis (no host synchronisation).

    Args:
        mask (Tensor[B, *S], bool): True marks padding.

    Returns:
        Tensor[B, n], int64: valid cells along each axis (0 for a fully padded item or along a
        zero-size axis). Only meaningful for origin-anchored rectangular masks.

    Raises:
        Nothing beyond torch's own errors: callers validate ``mask`` with :func:`check_mask`
        first (this runs on the hot path).

    References:
        The padding of DETR's ``nested_tensor_from_tensor_list`` (items at the origin).
    """
    if 0 in mask.shape[1:]:
        return torch.zeros((mask.shape[0], mask.dim() - 1), dtype=torch.int64, device=mask.device)
    valid = ~mask
    sizes = []
    for axis in range(1, mask.dim()):
        line = valid
        for other in range(mask.dim() - 1, 0, -1):
            if other != axis:
                line = line.select(other, 0)
        sizes.append(line.sum(1))
    return torch.stack(sizes, 1)


def rectangular_valid(sizes: Tensor, spatial: Sequence[int]) -> list[Tensor]:
    """Per axis ``i``, the bool table ``(c < sizes[b, i])`` of shape ``(B, S_i)`` (True = valid).

    Args:
        sizes (Tensor[B, n], int): per-item valid sizes of an origin-anchored box.
        spatial (sequence of int): ``S``.

    Returns:
        list of Tensor[B, S_i], bool.

    Raises:
        Nothing beyond torch's own errors (an internal helper; inputs come from
        :func:`rectangular_sizes`).

    References:
        The padding of DETR's ``nested_tensor_from_tensor_list`` (items at the origin).
    """
    return [torch.arange(s, device=sizes.device) < sizes[:, i : i + 1] for i, s in enumerate(spatial)]


def matches_rectangle(mask: Tensor, sizes: Tensor) -> bool:
    """True when ``mask`` equals "item ``b`` valid on ``[0, sizes[b])`` along every axis".

    Args:
        mask (Tensor[B, *S], bool): True marks padding.
        sizes (Tensor[B, n], int): candidate valid sizes (usually :func:`rectangular_sizes`).

    Returns:
        bool (reads one value on the host).

    Raises:
        Nothing beyond torch's own errors (callers validate ``mask`` with :func:`check_mask`).

    References:
        The padding of DETR's ``nested_tensor_from_tensor_list`` (items at the origin).
    """
    return bool(torch.equal(~mask, origin_boxes(sizes, tuple(mask.shape[1:])).expand_as(mask)))


def origin_boxes(sizes: Tensor, spatial: Sequence[int]) -> Tensor:
    """``Tensor[B, 1 or S_0, ..]`` bool, True inside item ``b``'s box ``[0, sizes[b])``
    (broadcastable to ``(B, *S)``; device ops only)."""
    n = len(spatial)
    valid = None
    for i, a in enumerate(rectangular_valid(sizes, spatial)):
        view = [a.shape[0]] + [1] * n
        view[1 + i] = spatial[i]
        valid = a.view(view) if valid is None else valid & a.view(view)
    return valid


def is_rectangular(mask: Tensor) -> bool:
    """True when ``mask`` is origin-anchored rectangular padding (reads the mask on the host).

    Args:
        mask (Tensor[B, *S], bool): True marks padding.

    Returns:
        bool: the mask equals "item ``b`` valid on ``[0, size_b)`` along every axis". (A box
        away from the origin is rectangular for :class:`vispos.Padding`, not here.)

    Raises:
        TypeError: ``mask`` is not a bool tensor.

    References:
        The padding of DETR's ``nested_tensor_from_tensor_list``.
    """
    check_mask(mask)
    return matches_rectangle(mask, rectangular_sizes(mask))
