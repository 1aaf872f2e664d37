"""Checks of padding masks, spatial sizes and per-item spans (the argument checks of the mask code).

A padding mask is a ``bool`` tensor ``Tensor[B, *S]`` (1 to 3 spatial axes) where **True marks
padding**, as in DETR; an integer or float mask is refused with a hint on how to convert. A
*span* is one int per spatial axis for each item (sizes, starts, stops of boxes).

References:
    Carion et al., End-to-End Object Detection with Transformers, ECCV 2020 (True = padding);
    transformers' ``pixel_mask`` (1 = valid), the convention the hint converts from.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from .._checks import MAX_SPATIAL, as_sequence, check_int, describe, is_int
from .._tracing import host_facts, host_side

__all__ = ["Spans", "check_mask", "padding_from_pixel_mask", "check_spatial_mask", "check_spatial_size", "check_spans"]

Spans = tuple[tuple[int, ...], ...]  # per item, one int per axis


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


def padding_from_pixel_mask(pixel_mask: Any, name: str = "pixel_mask") -> Tensor:
    """transformers' ``pixel_mask`` (1 = valid cell, 0 = padding, any dtype) as DETR's padding mask.

    The values are checked where reading them costs nothing: a CPU tensor, outside tracing and
    CUDA-graph capture (:func:`vispos._tracing.host_side`, :func:`~vispos._tracing.host_facts`).
    A mask on an accelerator is converted unread (no host synchronisation in ``forward``): there a
    value other than 0 counts as valid.

    Args:
        pixel_mask (Tensor[B, *S]): 1 marks valid cells, 0 padding (bool, integer or float).
        name (str): the parameter's name in messages.

    Returns:
        Tensor[B, *S], bool: True marks padding (``pixel_mask == 0``).

    Raises:
        TypeError: not a tensor.
        ValueError: (CPU) a value other than 0 and 1 (NaN, 2, 0.5); the message gives the
            shape and dtype, never the values.
    """
    if not isinstance(pixel_mask, Tensor):
        raise TypeError(f"{name} must be a Tensor (B, *S) with 1 marking valid cells, got {describe(pixel_mask)}")
    if pixel_mask.dtype != torch.bool and host_side(pixel_mask.device) and host_facts(pixel_mask.device):
        if not bool(((pixel_mask == 0) | (pixel_mask == 1)).all()):
            raise ValueError(
                f"{name} must hold only 0 and 1 (1 = valid, transformers' convention), got a "
                f"{describe(pixel_mask)} with other values (NaN or neither 0 nor 1); threshold it first "
                f"(e.g. `{name} > 0.5`), or pass DETR's bool mask (True = padding) as mask"
            )
    return pixel_mask == 0


def check_spatial_mask(mask: Any, name: str = "mask") -> Tensor:
    """:func:`check_mask`, and 1 to 3 spatial axes (ValueError otherwise). Returns ``mask``."""
    check_mask(mask, name)
    if not 1 <= mask.dim() - 1 <= MAX_SPATIAL:
        raise ValueError(
            f"{name} must have shape (B, *S) with 1 to {MAX_SPATIAL} spatial axes, got {tuple(mask.shape)}"
        )
    return mask


def check_spatial_size(size: Any, n: int, name: str = "size", *, minimum: int = 1) -> tuple[int, ...]:
    """A spatial size for ``n`` axes: one int (for every axis) or ``n`` ints ``>= minimum``.

    Raises:
        TypeError: not an int or a sequence of ints. ValueError: wrong length or an entry below
            ``minimum``.
    """
    given = size
    size = (size,) * n if is_int(size) else as_sequence(size)
    try:
        if size is None:
            raise TypeError
        size = tuple(check_int(s, name) for s in size)
    except TypeError:
        raise TypeError(f"{name} must be an int or a sequence of {n} ints, got {describe(given)}") from None
    if len(size) != n or any(s < minimum for s in size):
        what = "positive" if minimum == 1 else f">= {minimum}"
        raise ValueError(f"{name} must hold {n} {what} ints, got {size}")
    return size


def check_spans(values: Any, name: str, n: int) -> Spans:
    """Per-item sequences of ``n`` ints (or an integer ``Tensor[B, n]``, read on the host) as a
    tuple of tuples."""
    if isinstance(values, Tensor):
        if values.is_floating_point() or values.is_complex() or values.dtype == torch.bool:
            raise TypeError(f"{name} must hold integers, got a tensor of dtype {values.dtype}")
        if values.dim() != 2 or values.shape[1] != n:
            raise ValueError(f"{name} must have shape (B, {n}), got {tuple(values.shape)}")
        return tuple(tuple(row) for row in values.tolist())
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"{name} must be a sequence of per-item sizes (sequences of ints), got {type(values).__name__}")
    out = []
    for i, item in enumerate(values):
        if as_sequence(item) is None:
            raise TypeError(f"{name}[{i}] must be a sequence of {n} ints (one per spatial axis), got {describe(item)}")
        try:
            entries = tuple(int(check_int(v, f"{name}[{i}]")) for v in as_sequence(item))
        except TypeError:
            raise TypeError(f"{name}[{i}] must hold ints, got {describe(item)}") from None
        if len(entries) != n:
            raise ValueError(f"{name}[{i}] = {entries} must have {n} entries (one per spatial axis)")
        out.append(entries)
    return tuple(out)
