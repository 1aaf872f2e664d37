"""The miss path of :class:`~vispos.PositionEmbeddingSine` through the custom ops of
:mod:`vispos.ops.sine` (one Triton kernel launch per level on CUDA): which calls take them, and the
call.

A level's whole output ``(B, n * F, *S)`` is written by ``vispos::sine_boxes`` (no padding, or a box
per item: the boxes travel as one small int32 tensor ``(B, 2 n)`` built from the
:class:`~vispos.Padding`'s host facts, one non-blocking copy, no synchronisation) or by
``vispos::sine_counts`` (any mask: ``torch.cumsum`` of the mask along each axis feeds the kernel).
:func:`takes_kernel` says which calls take the ops, :func:`embed` makes the call.

References:
    Carion et al., End-to-End Object Detection with Transformers, ECCV 2020
    (``PositionEmbeddingSine``); PyTorch ``torch.library.custom_op``; Tillet et al., Triton,
    MAPL 2019.
"""

from typing import Optional

import torch
from torch import Tensor

from .. import _tracing
from .._positions import PositionRule
from ..ops import _triton
from ..ops.sine import BOXES, COUNTS, sine_boxes, sine_counts, write_boxes, write_counts
from ..padding import Padding

__all__ = ["BOXES", "COUNTS", "takes_kernel", "embed", "sine_boxes", "sine_counts"]



def takes_kernel(divisors: Tensor) -> bool:
    """Whether a miss of :class:`~vispos.PositionEmbeddingSine` on ``divisors``' device takes the
    custom ops: on CUDA with Triton installed; on the CPU inside :func:`vispos.ops._triton.interpreted`
    (the kernel, interpreted) and with the host-side shortcuts switched off
    (:func:`vispos._tracing.host_side` answering False: the CUDA code path, as tests and
    benchmarks count it; the ops' torch implementation runs). Elsewhere the torch path runs.

    Args:
        divisors (Tensor[F // 2]): the embedding's divisors, on the output's device.

    Returns:
        bool.

    Raises:
        Nothing.
    """
    if _triton.use_triton(divisors):
        return True
    return divisors.device.type == "cpu" and not _tracing.host_side(divisors.device)


def embed(
    padding: Padding,
    rule: PositionRule,
    divisors: Tensor,
    dtype: torch.dtype,
    host: bool,
    out: Optional[Tensor] = None,
    spacing: Optional[Tensor] = None,
) -> Tensor:
    """DETR's sine embedding of ``padding``'s cells through the custom ops (see the module doc).

    Args:
        padding (Padding): the level's padding, ``(B, *S)`` with 1 to 3 spatial axes.
        rule (PositionRule): counts to positions (normalize, scale, offset, eps, extent).
        divisors (Tensor[F // 2], float32 or float64): :func:`~vispos._sincos.frequency_divisors`
            on the padding's device; float64 computes the angles in float64.
        dtype (torch.dtype): the output's floating dtype.
        host (bool): host facts may be used (:func:`vispos._tracing.host_facts`): boxes then
            come from the padding's host values; otherwise (tracing, CUDA graph capture) every
            padded batch goes through its mask.
        out (Tensor[B, n * F, *S], optional): written and returned (a non-contiguous one through
            a copy); checked by the caller.
        spacing (Tensor[B, n], float32, optional): each item's cell size along each axis.

    Returns:
        Tensor[B, n * F, *S] in ``dtype``: a new tensor the caller owns, or ``out``.

    Raises:
        ValueError: more than 2**31 - 1 cells per item and axis block (int32 indexing).

    References:
        Carion et al., DETR, ECCV 2020.
    """
    spatial, device = padding.spatial, padding.device
    n = len(spatial)
    shape = (padding.batch, 2 * divisors.shape[0] * n, *spatial)
    target = out if out is not None and out.is_contiguous() else torch.empty(shape, dtype=dtype, device=device)
    args = (divisors, spacing, rule.normalize, float(rule.scale), float(rule.offset), float(rule.eps), rule.extent)
    kind = padding.kind
    if kind == "arbitrary" or (kind == "rectangular" and not host):
        mask = padding.mask
        counts = [torch.cumsum(mask, i + 1, dtype=torch.int32) for i in range(n)]
        write_counts(target, counts, *args)
    else:
        boxes = None
        if kind == "rectangular":  # one small copy of host values, no synchronisation
            rows = [(*a, *b) for a, b in zip(padding.starts, padding.stops)]
            boxes = _tracing.host_tensor(rows, torch.int32, device)
        write_boxes(target, boxes, *args)
    if out is not None and target is not out:
        return out.copy_(target)
    return target
