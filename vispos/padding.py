"""Every fact about a padding mask, in one place.

A padding mask is a ``bool`` tensor ``Tensor[B, *S]`` (1 to 3 spatial axes) where **True marks
padding**, as in DETR. Items sit at the origin of every axis. This module answers, for every
caller (the batch container, the encoders, the Joiner, the figures):

* is this a valid mask? (:func:`check_mask`)
* which cells of item ``b`` are valid? on the host (:func:`mask_sizes`) or on the device
  (:func:`rectangular_sizes`);
* is the padding rectangular? (:func:`is_rectangular`, :func:`matches_rectangle`);
* what does the mask, and what do the sizes, become at a feature level? (:func:`interpolate_mask`,
  :func:`resize_image_sizes`);
* what fraction of each axis is valid? (:func:`valid_ratios`, Deformable-DETR);
* what did an encoder receive? (:class:`SpatialInput`, the record
  :func:`vispos.nested_tensor.parse_spatial_input` returns);
* which keys may a token attend to? (:func:`attn_mask_from_padding`).

Empty inputs (an empty batch, a zero-size axis) give empty results of the documented shape.

References:
    Carion et al., End-to-End Object Detection with Transformers, ECCV 2020 (``util/misc.py``,
    ``models/backbone.py``); Zhu et al., Deformable DETR, ICLR 2021 (``get_valid_ratio``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ._checks import MAX_SPATIAL, check_int
from ._tracing import tracing

__all__ = [
    "SpatialInput",
    "check_mask",
    "mask_sizes",
    "rectangular_sizes",
    "rectangular_valid",
    "is_rectangular",
    "matches_rectangle",
    "interpolate_mask",
    "resize_image_sizes",
    "valid_ratios",
    "attn_mask_from_padding",
]


class SpatialInput(NamedTuple):
    """What a spatial encoder was given, read once (see
    :func:`vispos.nested_tensor.parse_spatial_input`).

    Attributes:
        mask (Tensor[B, *S] bool or None): True = padding; None means no padding.
        spatial (tuple[int, ...]): ``S``.
        batch (int): ``B``.
        device (torch.device): where the input lives.
        host_sizes (tuple of tuples or None): each item's valid size, when already known on the
            host (never read from the device for this record).
        rectangular (bool): the mask is known to be exactly "item ``b`` valid on
            ``[0, host_sizes[b])``" (the encoders' fast path).
    """

    mask: Tensor | None
    spatial: tuple[int, ...]
    batch: int
    device: torch.device
    host_sizes: tuple[tuple[int, ...], ...] | None = None
    rectangular: bool = False


def check_mask(mask: Any, name: str = "mask", peer: str = "pixel_mask", cells: str = "pixels") -> Tensor:
    """Validates a padding mask's type: a ``bool`` tensor. Returns it.

    Args:
        mask (Tensor[B, *S], bool): True marks padding.
        name (str): the parameter's name in messages.
        peer, cells (str): the transformers-style "1 = valid" mask the hint mentions
            (``pixel_mask`` / pixels for images, ``attention_mask`` / tokens for sequences).

    Returns:
        Tensor: ``mask`` itself (not copied).

    Raises:
        TypeError: not a tensor; not ``torch.bool`` (with a hint on how to convert).

    References:
        DETR's convention (True = padding); transformers' ``pixel_mask`` is its inverse.
    """
    if not isinstance(mask, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of dtype torch.bool, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(
            f"{name} must have dtype torch.bool with True marking padding, got {mask.dtype}. "
            f"Convert with `{name}.bool()` if nonzero marks padding, or `~{peer}.bool()` for a "
            f"transformers-style {peer} where 1 marks valid {cells}."
        )
    return mask


def _check_spatial_mask(mask: Any, name: str = "mask") -> Tensor:
    check_mask(mask, name)
    if not 1 <= mask.dim() - 1 <= MAX_SPATIAL:
        raise ValueError(
            f"{name} must have shape (B, *S) with 1 to {MAX_SPATIAL} spatial axes, got {tuple(mask.shape)}"
        )
    return mask


def mask_sizes(mask: Tensor) -> list[tuple[int, ...]]:
    """Each item's valid extent, on the host: along every axis, one past the last valid index.

    For an origin-anchored rectangular mask this is the item's size. Reads the mask on the host
    (one synchronisation).

    Args:
        mask (Tensor[B, *S], bool): True marks padding.

    Returns:
        list of ``B`` tuples of ``len(S)`` ints (0 along every axis for a fully padded item; an
        empty list for an empty batch; 0 along a zero-size axis).

    Raises:
        TypeError: ``mask`` is not a bool tensor. ValueError: not 1 to 3 spatial axes.

    References:
        detectron2 ``ImageList.image_sizes``; DETR ``util/misc.py``.
    """
    _check_spatial_mask(mask)
    batch, n = mask.shape[0], mask.dim() - 1
    if batch == 0:
        return []
    if mask.numel() == 0:
        return [tuple(0 for _ in range(n))] * batch
    valid = ~mask
    sizes = []
    for axis in range(n):
        other = [d for d in range(1, valid.dim()) if d != axis + 1]
        along = valid.any(dim=other) if other else valid  # (B, S_axis)
        idx = torch.arange(1, along.shape[1] + 1, device=along.device)
        sizes.append((along * idx).amax(dim=1))
    return [tuple(int(v) for v in row) for row in torch.stack(sizes, 1).tolist()]


def rectangular_sizes(mask: Tensor) -> Tensor:
    """Per-item valid sizes of an origin-anchored rectangular padding mask, on its device.

    Reads the line through the origin along every axis (no host synchronisation).

    Args:
        mask (Tensor[B, *S], bool): True marks padding.

    Returns:
        Tensor[B, n], int64: valid cells along each axis (0 for a fully padded item or along a
        zero-size axis). Only meaningful for rectangular masks (see :func:`is_rectangular`).

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
        sizes (Tensor[B, n], int): per-item valid sizes (:func:`rectangular_sizes`).
        spatial (sequence of int): ``S``.

    Returns:
        list of Tensor[B, S_i], bool.

    Raises:
        Nothing beyond torch's own errors (an internal helper of the fast paths; inputs come
        from :func:`rectangular_sizes`).

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
    spatial = tuple(mask.shape[1:])
    n = len(spatial)
    valid = None
    for i, a in enumerate(rectangular_valid(sizes, spatial)):
        view = [a.shape[0]] + [1] * n
        view[1 + i] = spatial[i]
        a = a.view(view)
        valid = a if valid is None else valid & a
    return bool(torch.equal(~mask, valid.expand_as(mask)))


def is_rectangular(mask: Tensor) -> bool:
    """True when ``mask`` is origin-anchored rectangular padding (reads the mask on the host).

    Args:
        mask (Tensor[B, *S], bool): True marks padding.

    Returns:
        bool: the mask equals "item ``b`` valid on ``[0, size_b)`` along every axis".

    Raises:
        TypeError: ``mask`` is not a bool tensor.

    References:
        The padding of DETR's ``nested_tensor_from_tensor_list``; the fast path it enables is
        :func:`vispos._sincos.sincos_embed_lines`.
    """
    check_mask(mask)
    return matches_rectangle(mask, rectangular_sizes(mask))


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
    _check_spatial_mask(mask)
    n = mask.dim() - 1
    if isinstance(size, int) and not isinstance(size, bool):
        size = (size,) * n
    if isinstance(size, torch.Size):
        size = tuple(size)
    if not isinstance(size, Sequence) or any(
        isinstance(s, bool) or not isinstance(s, (int, torch.SymInt)) for s in size
    ):
        raise TypeError(f"size must be an int or a sequence of {n} ints, got {size!r}")
    if len(size) != n or any(s <= 0 for s in size):
        raise ValueError(
            f"size must hold {n} positive ints for a mask of shape {tuple(mask.shape)}, got {tuple(size)}"
        )
    if mask.numel() == 0:  # empty batch, or no valid cell at all: nothing to interpolate
        return torch.ones((mask.shape[0], *size), dtype=torch.bool, device=mask.device)
    if not tracing() and tuple(size) == tuple(mask.shape[1:]):  # compilers: no size guard
        return mask.clone()
    return F.interpolate(mask[None].float(), size=tuple(size), mode="nearest")[0].to(torch.bool)


def resize_image_sizes(
    image_sizes: Sequence[Sequence[int]], old: Sequence[int], new: Sequence[int]
) -> list[tuple[int, ...]]:
    """Valid sizes after a nearest resize of an origin-anchored padding mask from ``old`` to ``new``.

    Nearest interpolation is separable, so each axis is resized as a 1-D mask on the host with
    the same :func:`torch.nn.functional.interpolate` rule :func:`interpolate_mask` uses; the
    count of valid cells is the new size. No device tensor is read.

    Args:
        image_sizes (sequence of tuples): each item's valid size in the old grid.
        old, new (sequence of int): the old and new spatial sizes.

    Returns:
        list of tuples: each item's valid size in the new grid (0 along an axis whose old size
        is 0).

    Raises:
        ValueError: ``old`` and ``new`` have different lengths.

    References:
        DETR ``models/backbone.py`` (masks resized with nearest interpolation).
    """
    if len(old) != len(new):
        raise ValueError(f"old {tuple(old)} and new {tuple(new)} must have the same number of axes")
    out = [[0] * len(old) for _ in image_sizes]
    if not image_sizes:
        return []
    for axis, (s_old, s_new) in enumerate(zip(old, new)):
        if s_old == 0 or s_new == 0:
            continue
        lines = torch.ones(len(image_sizes), s_old, dtype=torch.bool)
        for b, size in enumerate(image_sizes):
            lines[b, : size[axis]] = False
        resized = F.interpolate(lines[None].float(), size=(s_new,), mode="nearest")[0]
        for b, count in enumerate((resized == 0).sum(1).tolist()):
            out[b][axis] = int(count)
    return [tuple(s) for s in out]


def valid_ratios(mask: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """Deformable-DETR's ``get_valid_ratio`` for 1 to 3 spatial axes.

    Along axis ``i`` the valid length is the number of valid cells in the line through index 0 of
    every other axis (items sit at the origin), divided by the padded size ``S_i``.

    Args:
        mask (Tensor[B, *S], bool): True = padding.
        dtype (torch.dtype): of the result.

    Returns:
        Tensor[B, n]: ratios in **reversed** axis order (``(w, h)`` in 2D), as Deformable-DETR.
        0 along a zero-size axis.

    Raises:
        TypeError: ``mask`` is not a bool tensor of shape ``(B, *S)``.

    References:
        Zhu et al., Deformable DETR, ICLR 2021 (``DeformableTransformer.get_valid_ratio``).
    """
    check_mask(mask)
    if mask.dim() < 2:
        raise ValueError(f"mask must have shape (B, *S) with at least one spatial axis, got {tuple(mask.shape)}")
    spatial = mask.shape[1:]
    sizes = rectangular_sizes(mask).to(dtype)
    ratios = [sizes[:, i] / spatial[i] if spatial[i] else sizes[:, i] for i in range(len(spatial))]
    return torch.stack(ratios[::-1], -1)


def attn_mask_from_padding(mask: Tensor, num_prefix_tokens: int = 0) -> Tensor:
    """The attention mask that keeps padding tokens out of every token's attention.

    For the flattened tokens of a padded grid, after ``num_prefix_tokens`` tokens that are
    always valid (a class token, registers), as timm's ViT / Eva order them. The result is in
    PyTorch's ``scaled_dot_product_attention`` convention (bool, True = takes part) and
    broadcasts over heads and queries; timm's ``forward_features(x, attn_mask=...)`` passes it
    to every block.

    Args:
        mask (Tensor[B, *S], bool): True marks padding (at the token grid, e.g.
            :func:`interpolate_mask` of a pixel mask to the patch grid).
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
    check_mask(mask)
    check_int(num_prefix_tokens, "num_prefix_tokens", minimum=0)
    if mask.dim() < 2:
        raise ValueError(f"mask must have shape (B, *S) with at least one spatial axis, got {tuple(mask.shape)}")
    keep = ~mask.flatten(1)
    if num_prefix_tokens:
        keep = torch.cat([keep.new_ones(keep.shape[0], num_prefix_tokens), keep], dim=1)
    return keep[:, None, None, :]
