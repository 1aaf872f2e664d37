"""What a mask-aware encoder's call is given besides its input: a mask (DETR's or transformers') and a spacing.

DETR-family code calls a position embedding as ``pos(x, mask)`` with DETR's mask (``bool``,
**True = padding**) as the second argument; transformers' code has a ``pixel_mask`` (1 = valid,
usually ``int64``). :func:`read_masks` turns either into the one input the encoders read (a bool
mask, True = padding), refusing any call where the two conventions could be confused: the
second positional argument must be a bool tensor, ``pixel_mask`` is keyword-only, and the two
never go together. :func:`warn_suspect_input` warns, once per call site, about inputs that are
probably mistakes but cannot be refused (a channels-last image read as channels-first; an
item with no valid cell). :func:`check_spacing` reads a ``spacing`` in millimetres.

References:
    Carion et al., DETR, ECCV 2020 (``util/misc.py``, ``NestedTensor.decompose``: mask True =
    padding); transformers' DETR models (``pixel_mask``, 1 = valid pixels).
"""

from __future__ import annotations

import math
import os
import sys
import warnings
from typing import Any

import torch
from torch import Tensor

from .. import _deprecation, _tracing
from .._checks import as_sequence, describe
from ..nested_tensor import NestedTensorLike
from ..padding import Padding
from ..padding._mask_checks import padding_from_pixel_mask

__all__ = ["check_spacing", "read_masks", "spacing_tensor", "warn_suspect_input"]

#: the frames a warning is not attributed to: vispos' own and ``nn.Module.__call__``'s
_INSIDE = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
           os.path.dirname(os.path.abspath(torch.nn.Module.__call__.__code__.co_filename)) + os.sep)
_IMAGE_CHANNELS = (1, 3, 4)  # grey, RGB, RGBA: the last axis of a channels-last image
_MIN_SIDE = 8  # a channels-last image's spatial sides are at least this (a guess, not a rule)


def read_masks(owner: str, x: Any, mask: Any, pixel_mask: Any, dtype: Any) -> tuple[Any, Any]:
    """``(input, dtype)``: what the encoder reads (``x``, or ``mask`` / the inverse of
    ``pixel_mask`` for a feature map ``x``), and the output dtype.

    Args:
        owner (str): the encoder's name, for messages.
        x: the call's first argument.
        mask (Tensor[B, *S] bool, optional): DETR's mask, True = padding, for a feature map ``x``
            ``(B, C, *S)``. A ``torch.dtype`` here is the output dtype (the second positional
            argument of earlier releases), with a ``DeprecationWarning``.
        pixel_mask (Tensor[B, *S], optional): transformers' mask, 1 = valid, 0 = padding (any
            dtype; :func:`~vispos.padding._mask_checks.padding_from_pixel_mask` checks a CPU one).
        dtype (torch.dtype, optional): the keyword ``dtype``.

    Raises:
        TypeError: ``mask`` not a bool tensor (a hint names ``pixel_mask=``); both masks, or a
            mask for an ``x`` that carries its own (a NestedTensor or a mask); ``dtype`` twice;
            ``pixel_mask`` not a tensor; ``x`` not a tensor while a mask is given.
        ValueError: a mask whose shape is not ``(B, *S)`` of ``x``, or on another device; a CPU
            ``pixel_mask`` with a value other than 0 and 1 (NaN, 2).
    """
    if isinstance(mask, torch.dtype):
        if dtype is not None:
            raise TypeError(f"{owner}() got the output dtype twice: pass dtype= only")
        _deprecation.warn(
            f"{owner}(x, dtype) is deprecated and will be removed: the second positional argument "
            "is DETR's mask now; pass dtype= by keyword",
            skip=_INSIDE,
        )
        mask, dtype = None, mask
    if mask is None and pixel_mask is None:
        return x, dtype
    if mask is not None and pixel_mask is not None:
        raise TypeError(
            f"{owner}() got both mask (True = padding) and pixel_mask (1 = valid): pass one of them"
        )
    if mask is not None:
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
            raise TypeError(
                f"{owner}(x, mask): mask must be a bool tensor (B, *S) with True marking padding "
                f"(DETR), got {describe(mask)}; pass a transformers-style mask (1 = valid) as "
                "pixel_mask=..., or a mask whose nonzero entries mark padding as mask.bool()"
            )
        name, padding = "mask", mask
    else:
        name, padding = "pixel_mask", padding_from_pixel_mask(pixel_mask)  # values checked on the CPU
    carried = isinstance(x, Tensor) and x.dtype == torch.bool
    if carried or (not isinstance(x, Tensor) and isinstance(x, NestedTensorLike)):
        what = "a mask" if carried else "a batch with its own mask"
        raise TypeError(f"{owner}(x, {name}=...): x is {what} already; pass x alone, or its tensors and one mask")
    if not isinstance(x, Tensor):
        raise TypeError(f"{owner}(x, {name}): x must be a feature map Tensor (B, C, *S), got {describe(x)}")
    expected = (x.shape[0], *x.shape[2:])
    if tuple(padding.shape) != tuple(expected) or padding.device != x.device:
        raise ValueError(
            f"{name} must have shape (B, *S) = {tuple(expected)} on {x.device} for a feature map of "
            f"shape {tuple(x.shape)}, got shape {tuple(padding.shape)} on {padding.device}"
        )
    return padding, dtype


def warn_suspect_input(x: Any, padding: Padding, host: bool) -> None:
    """Warns about an input that is probably a mistake (``UserWarning``, shown once per call site
    by Python's default filter). Reads only host facts: nothing is synchronised, and nothing is
    checked while tracing.

    * a bare floating ``x`` of shape ``(B, H, W, c)`` / ``(B, D, H, W, c)`` with ``c`` in 1, 3, 4
      and larger other axes: a channels-last image read as ``c`` columns of ``H`` channels;
    * an item with no valid cell (its embedding is DETR's, finite, but describes no cell).
    """
    if not host:  # ``host`` is False while tracing (``_tracing.host_facts``)
        return
    if isinstance(x, Tensor) and x.is_floating_point() and x.dim() in (4, 5):
        last = x.shape[-1]
        if last in _IMAGE_CHANNELS and min(x.shape[1:-1]) >= _MIN_SIDE:
            warnings.warn(
                f"x of shape {tuple(x.shape)} is read channels-first (B, C, *S): {x.shape[1]} channels "
                f"over a grid of {tuple(x.shape[2:])}. If it is a channels-last image (B, *S, C), pass "
                f"x.movedim(-1, 1); if the shape is meant, pass NestedTensor(x, None) to silence this",
                UserWarning,
                stacklevel=_caller_level(),
            )
    kind = padding.kind
    if kind == "rectangular":
        empty = any(0 in size for size in padding.sizes)
    elif kind == "arbitrary" and padding.device.type == "cpu" and _tracing.host_side(padding.device):
        # read with NumPy: no torch op is dispatched (the call's op count stays as it was)
        empty = bool(padding.mask.detach().numpy().reshape(padding.batch, -1).all(axis=1).any())
    else:
        return
    if empty:
        warnings.warn(
            "an item of the batch has no valid cell (its mask is True everywhere): its embedding is "
            "DETR's for a fully padded item (finite, the same at every cell) and describes no position",
            UserWarning,
            stacklevel=_caller_level(),
        )


def _caller_level() -> int:
    """The ``stacklevel`` of a ``warnings.warn`` in this module's functions that names the first
    frame outside vispos and ``nn.Module``'s call machinery (the user's line)."""
    frame, level = sys._getframe(2), 2  # the warning's caller
    while frame is not None and frame.f_code.co_filename.startswith(_INSIDE):
        frame, level = frame.f_back, level + 1
    return level


def check_spacing(
    spacing: object, batch: int, n: int, device: torch.device
) -> tuple[Tensor | None, tuple | None]:
    """``(spacing as float32 on device, its host values for a cache key or None)``; checks
    type, shape and (when it is on the CPU: no synchronisation) that it is finite and > 0.

    Args:
        spacing (Tensor[B, n] | Tensor[n] | sequence, optional): mm per cell along each axis;
            one row of ``n`` is every item's.
        batch, n (int): ``B`` and the number of spatial axes. device: the output's.

    Raises:
        TypeError: not a floating tensor or a sequence of numbers.
        ValueError: another shape; (on the CPU) not finite and > 0.
    """
    if spacing is None:
        return None, None
    if not isinstance(spacing, Tensor):
        spacing = spacing_tensor(spacing)
    if not spacing.dtype.is_floating_point:
        raise TypeError(f"spacing must be a floating tensor (B, num_axes) in mm, got {describe(spacing)}")
    if tuple(spacing.shape) == (n,):  # one row for every item
        spacing = spacing.expand(batch, n)
    if tuple(spacing.shape) != (batch, n):
        raise ValueError(
            f"spacing must have shape (B, num_axes) = {(batch, n)} or (num_axes,) = {(n,)}, got {tuple(spacing.shape)}"
        )
    values = spacing.detach().to(torch.float32)
    key = None
    if _tracing.host_side(values.device) and not _tracing.tracing():
        rows = values.tolist()
        if not all(math.isfinite(v) and v > 0 for row in rows for v in row):
            raise ValueError(f"spacing must be finite and > 0 (mm per cell), got {rows}")
        key = ("spacing", tuple(map(tuple, rows)))
        if values.device != device:
            return (_tracing.host_tensor(rows, torch.float32, device) if _tracing.host_facts(device)
                    else values.to(device)), key
    return values.to(device), key


def spacing_tensor(spacing: object) -> Tensor:
    """A list, tuple or array of ``n`` numbers (or of ``B`` rows of them) as a float32 tensor."""
    values = None
    np = sys.modules.get("numpy")
    if as_sequence(spacing) is not None or (np is not None and isinstance(spacing, np.ndarray)):
        try:
            values = torch.as_tensor(spacing)
        except (TypeError, ValueError, RuntimeError):
            values = None
    if values is None or values.dtype == torch.bool or values.is_complex():
        raise TypeError(
            f"spacing must be a floating tensor (B, num_axes) or a sequence of num_axes numbers (mm), got {describe(spacing)}"
        )
    return values.to(torch.float32)
