"""Resizing padding masks and boxes to a feature level by DETR's nearest rule.

:func:`interpolate_mask` is DETR's ``F.interpolate(mask[None].float(), size).bool()[0]``;
:func:`resize_boxes` / :func:`resize_image_sizes` give exactly the same cells on the host from
boxes (nearest interpolation is separable and its source index never decreases, so a box stays
a box), without reading a device tensor.

References:
    Carion et al., End-to-End Object Detection with Transformers, ECCV 2020
    (``models/backbone.py``: masks resized with nearest interpolation).
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import _deprecation
from ._mask_checks import Spans, check_spatial_mask, check_spatial_size

__all__ = ["interpolate_mask", "interpolate", "resize_boxes", "resize_image_sizes"]


def interpolate_mask(mask: Tensor, size: int | Sequence[int]) -> Tensor:
    """Resizes a padding mask to a feature map's spatial size (nearest neighbour, as DETR does).

    Args:
        mask (Tensor[B, *S], bool): True marks padding; 1 to 3 spatial axes. An empty batch gives
            an empty result; a mask with a zero-size axis (no valid cell) gives all padding.
        size (int or sequence of int): the target spatial size ``S'`` (one int per spatial axis,
            or one int for all).

    Returns:
        Tensor[B, *S'], bool: the resized mask (a new tensor).

    Raises:
        TypeError: ``mask`` is not a bool tensor; ``size`` holds non-integers.
        ValueError: ``mask`` has no or more than 3 spatial axes; ``size`` has the wrong length or
            a non-positive entry.

    References:
        DETR ``models/backbone.py`` (``F.interpolate(m[None].float(), size).to(torch.bool)[0]``).
    """
    check_spatial_mask(mask)
    size = check_spatial_size(size, mask.dim() - 1)
    return interpolate(mask, size)


def interpolate(mask: Tensor, size: tuple[int, ...]) -> Tensor:
    """:func:`interpolate_mask` without the checks (``mask`` checked, ``size`` a tuple of ints)."""
    if mask.numel() == 0:  # empty batch, or no valid cell at all: nothing to interpolate
        return torch.ones((mask.shape[0], *size), dtype=torch.bool, device=mask.device)
    return F.interpolate(mask[None].float(), size=size, mode="nearest")[0].to(torch.bool)


@functools.lru_cache(maxsize=512)
def _nearest_sources(old: int, new: int) -> tuple[int, ...]:
    """For each of ``new`` cells, the source index that DETR's nearest resize copies from
    ``old`` cells: torch's own kernel applied to the line ``0 .. old - 1`` (nearest
    interpolation is separable, and every axis uses the same index rule)."""
    line = torch.arange(old, dtype=torch.float32).view(1, 1, old)
    return tuple(int(v) for v in F.interpolate(line, size=(new,), mode="nearest").view(-1).tolist())


def resize_boxes(
    starts: Spans, stops: Spans, old: Sequence[int], new: Sequence[int]
) -> tuple[Spans, Spans]:
    """Boxes after DETR's nearest resize from ``old`` to ``new`` cells, on the host.

    A cell of the new grid is valid when the cell it copies from is valid, and the source index
    never decreases along an axis, so a box stays a box: the new box holds the cells whose
    source lies in ``[start, stop)``. Exactly what :func:`interpolate_mask` gives (tested).
    Empty boxes (and boxes that vanish) become ``(0, .., 0)`` twice.
    """
    n = len(old)
    out_starts, out_stops = [], []
    for start, stop in zip(starts, stops):
        s2, e2 = [], []
        for axis in range(n):
            if old[axis] == 0 or new[axis] == 0:
                s2.append(0)
                e2.append(0)
                continue
            src = _nearest_sources(old[axis], new[axis])
            s2.append(bisect.bisect_left(src, start[axis]))
            e2.append(bisect.bisect_left(src, stop[axis]))
        if any(e <= s for s, e in zip(s2, e2)):
            s2 = e2 = [0] * n
        out_starts.append(tuple(s2))
        out_stops.append(tuple(e2))
    return tuple(out_starts), tuple(out_stops)


@_deprecation.renamed_kwargs(image_sizes="sizes")
def resize_image_sizes(
    sizes: Sequence[Sequence[int]], old: Sequence[int], new: Sequence[int]
) -> list[tuple[int, ...]]:
    """Valid sizes after a nearest resize of an origin-anchored padding mask from ``old`` to ``new``.

    Computed on the host with the rule :func:`interpolate_mask` uses (see
    :meth:`vispos.Padding.resize`); no device tensor is read.

    Args:
        sizes (sequence of tuples): each item's valid size in the old grid (a
            :class:`~vispos.NestedTensor`'s ``image_sizes``).
        old, new (sequence of int): the old and new spatial sizes.

    Returns:
        list of tuples: each item's valid size in the new grid (0 along every axis of an item
        that has no valid cell left).

    Raises:
        ValueError: ``old`` and ``new`` have different lengths.

    References:
        DETR ``models/backbone.py`` (masks resized with nearest interpolation).
    """
    if len(old) != len(new):
        raise ValueError(f"old {tuple(old)} and new {tuple(new)} must have the same number of axes")
    zeros = tuple(0 for _ in old)
    starts = tuple(zeros for _ in sizes)
    _, stops = resize_boxes(starts, tuple(tuple(s) for s in sizes), tuple(old), tuple(new))
    return list(stops)
