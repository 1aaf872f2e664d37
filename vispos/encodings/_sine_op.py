"""DETR's sine embedding of a padded level as torch custom ops, one Triton kernel launch each.

The miss path of :class:`~vispos.PositionEmbeddingSine` on CUDA: a level's whole output
``(B, n * F, *S)`` is written by one launch of :func:`~vispos.encodings._sine_kernel.sine_embed_kernel`
instead of the line tables, selects and copies of the torch path (a dozen small kernels and host
work). Two ops, each declaring one launch (:func:`vispos._triton.register_launches`):

* ``vispos::sine_boxes`` -- no padding, or a box per item: the boxes travel as one small int32
  tensor ``(B, 2 n)`` (starts, then stops), built from the :class:`~vispos.Padding`'s host facts
  (one non-blocking copy, no synchronisation);
* ``vispos::sine_counts`` -- any mask: ``torch.cumsum`` of the mask along each axis (``n`` ops)
  feeds the kernel, which turns the padding counts into DETR's counts.

Both write into an ``out`` they are given (``mutates_args``; a fake implementation lets
``torch.compile`` and ``torch.export`` see one op). Their torch implementation is the reference
and the path of every call that does not take Triton: the same float32 steps as the torch path
(:class:`~vispos._positions.PositionRule`, :func:`~vispos._sincos._embed_axis`), hence the same
numbers. :func:`takes_kernel` says which calls take the ops, :func:`embed` makes the call.

References:
    Carion et al., End-to-End Object Detection with Transformers, ECCV 2020
    (``PositionEmbeddingSine``); PyTorch ``torch.library.custom_op``; Tillet et al., Triton,
    MAPL 2019.
"""

import functools
import math
from typing import Optional

import torch
from torch import Tensor

from .. import _tracing, _triton
from .._positions import PositionRule
from .._sincos import _embed_axis
from ..padding import Padding

__all__ = ["BOXES", "COUNTS", "takes_kernel", "embed", "sine_boxes", "sine_counts"]

BOXES = "vispos::sine_boxes"
COUNTS = "vispos::sine_counts"
_FREQUENCIES = 8  # frequencies of every axis block one program writes
_TILE_CELLS = 2048  # cells of one program's tile
_MAX_CELLS = 2**31 - 1  # the kernel indexes cells with int32


def takes_kernel(divisors: Tensor) -> bool:
    """Whether a miss of :class:`~vispos.PositionEmbeddingSine` on ``divisors``' device takes the
    custom ops: on CUDA with Triton installed; on the CPU inside :func:`vispos._triton.interpreted`
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
        _sine_counts(target, counts, *args)
    else:
        boxes = None
        if kind == "rectangular":  # one small copy of host values, no synchronisation
            rows = [(*a, *b) for a, b in zip(padding.starts, padding.stops)]
            boxes = _tracing.host_tensor(rows, torch.int32, device)
        _sine_boxes(target, boxes, *args)
    if out is not None and target is not out:
        return out.copy_(target)
    return target


# ------------------------------------------------------------------------------------ the ops
@torch.library.custom_op(BOXES, mutates_args=("out",))
def sine_boxes(
    out: Tensor,
    boxes: Optional[Tensor],
    divisors: Tensor,
    spacing: Optional[Tensor],
    normalize: bool,
    scale: float,
    offset: float,
    eps: float,
    extent: Optional[float],
) -> None:
    """Writes DETR's sine embedding of a batch padded by one box per item into ``out``.

    Args:
        out (Tensor[B, n * F, *S], contiguous, floating): written whole.
        boxes (Tensor[B, 2 n], int32, optional): each item's first valid index along every axis,
            then one past its last (an item without a valid cell: zeros). None: no padding.
        divisors (Tensor[F // 2], float32 or float64): the frequency divisors.
        spacing (Tensor[B, n], float32, optional): cell sizes (positions become lengths).
        normalize, scale, offset, eps, extent: :class:`~vispos._positions.PositionRule`.

    Returns:
        None (``out`` is written).

    Raises:
        ValueError: more than 2**31 - 1 cells per item and axis block.

    References:
        Carion et al., DETR, ECCV 2020.
    """
    rule = PositionRule(normalize, scale, offset, eps, extent)
    if _triton.use_triton(out):
        _launch(out, 0 if boxes is None else 1, boxes, [], divisors, spacing, rule)
        return
    spatial = tuple(out.shape[2:])
    n = len(spatial)
    coords = [_axis_view(torch.arange(s, device=out.device), j, n) for j, s in enumerate(spatial)]
    if boxes is None:  # one box, the whole grid
        boxes = torch.tensor([[0] * n + list(spatial)], device=out.device)
    corners = boxes.long().reshape(boxes.shape[0], 2 * n, *([1] * n))
    starts, stops = corners[:, :n].unbind(1), corners[:, n:].unbind(1)
    for i in range(n):
        length = stops[i] - starts[i]
        count = torch.minimum((coords[i] - starts[i] + 1).clamp(min=0), length)
        for j in range(n):
            if j != i:  # lines that miss the box along axis j count 0 over a length 0
                crosses = (coords[j] >= starts[j]) & (coords[j] < stops[j])
                count, length = torch.where(crosses, count, 0), torch.where(crosses, length, 0)
        _write_axis(out, i, count, length, divisors, spacing, rule)


@torch.library.custom_op(COUNTS, mutates_args=("out",))
def sine_counts(
    out: Tensor,
    counts: list[Tensor],
    divisors: Tensor,
    spacing: Optional[Tensor],
    normalize: bool,
    scale: float,
    offset: float,
    eps: float,
    extent: Optional[float],
) -> None:
    """Writes DETR's sine embedding of a batch padded by any mask into ``out``.

    Args:
        out (Tensor[B, n * F, *S], contiguous, floating): written whole.
        counts (list of n Tensor[B, *S], int32, contiguous): the mask's cumulative sum along
            each spatial axis (padding cells up to and including each cell).
        divisors, spacing, normalize, scale, offset, eps, extent: as in :func:`sine_boxes`.

    Returns:
        None (``out`` is written).

    Raises:
        ValueError: more than 2**31 - 1 cells per item and axis block.

    References:
        Carion et al., DETR, ECCV 2020 (the cumulative sum).
    """
    rule = PositionRule(normalize, scale, offset, eps, extent)
    if _triton.use_triton(out):
        _launch(out, 2, None, counts, divisors, spacing, rule)
        return
    spatial = tuple(out.shape[2:])
    n = len(spatial)
    for i, (size, padded) in enumerate(zip(spatial, counts)):
        coord = _axis_view(torch.arange(size, device=out.device), i, n)
        count = coord + 1 - padded
        length = size - padded.narrow(i + 1, size - 1, 1)
        _write_axis(out, i, count, length, divisors, spacing, rule)


@sine_boxes.register_fake
def _sine_boxes_fake(out, boxes, divisors, spacing, normalize, scale, offset, eps, extent) -> None:
    return None


@sine_counts.register_fake
def _sine_counts_fake(out, counts, divisors, spacing, normalize, scale, offset, eps, extent) -> None:
    return None


_triton.register_launches(BOXES, 1)
_triton.register_launches(COUNTS, 1)
# the dispatcher's entry points, called without the Python wrapper's per-call work
_sine_boxes = torch.ops.vispos.sine_boxes.default
_sine_counts = torch.ops.vispos.sine_counts.default


# -------------------------------------------------------------------------------- helpers
def _axis_view(t: Tensor, axis: int, n: int) -> Tensor:
    """A 1-d ``t`` of spatial ``axis`` viewed as ``[1, 1, .., S_axis, .., 1]`` (rank ``1 + n``)."""
    shape = [1] * (n + 1)
    shape[axis + 1] = t.shape[0]
    return t.view(shape)


def _write_axis(
    out: Tensor, i: int, count: Tensor, length: Tensor, divisors: Tensor, spacing: Optional[Tensor],
    rule: PositionRule,
) -> None:
    """The torch reference for one axis block: integer counts and lengths (broadcastable to
    ``(B, *S)``) through ``rule`` in float32, then sin / cos into ``out``'s channels of axis
    ``i`` (as the torch path writes them)."""
    n = out.dim() - 2
    s = None if spacing is None else spacing[:, i].reshape(-1, *([1] * n))
    shape = (out.shape[0], *out.shape[2:])
    count = count.to(torch.float32).expand(shape)
    position = rule(count, length.to(torch.float32), spacing=s)
    f = 2 * divisors.shape[0]
    _embed_axis(out, 1, i * f, f, "interleaved", position.to(divisors.dtype), divisors)


@functools.cache
def _kernel() -> _triton._Kernel:
    from ._sine_kernel import sine_embed_kernel  # imports Triton: only when a kernel runs

    return _triton.kernel(sine_embed_kernel)


def _launch(
    out: Tensor, mode: int, boxes: Optional[Tensor], counts: list[Tensor], divisors: Tensor,
    spacing: Optional[Tensor], rule: PositionRule,
) -> None:
    """One launch of the kernel over ``out`` (see :mod:`vispos.encodings._sine_kernel`)."""
    batch, spatial = out.shape[0], tuple(out.shape[2:])
    n, half = len(spatial), divisors.shape[0]
    width, rows = spatial[-1], math.prod(spatial[:-1])
    if out.numel() == 0:
        return
    if rows * width > _MAX_CELLS:
        raise ValueError(f"the Triton sine kernel indexes cells with int32: got {rows * width} cells per item")
    block_w = min(_next_power_of_2(width), 128)
    block_r = min(_next_power_of_2(rows), max(1, _TILE_CELLS // block_w))
    grid = (-(-rows // block_r) * -(-width // block_w), batch, -(-half // _FREQUENCIES))
    dummy = divisors  # a pointer the kernel does not read in this mode
    planes = list(counts) + [dummy] * (3 - len(counts))
    if out.is_cuda and out.device.index != torch.cuda.current_device():  # Triton launches on the current one
        with torch.cuda.device(out.device):
            return _launch(out, mode, boxes, counts, divisors, spacing, rule)
    _kernel()[grid](
        out, dummy if boxes is None else boxes, *planes, divisors, divisors.stride(0),
        dummy if spacing is None else spacing,
        0 if spacing is None else spacing.stride(0), 0 if spacing is None else spacing.stride(1),
        rows, width, spatial[0] if n == 3 else 1, spatial[-2] if n >= 2 else 1, half,
        float(rule.offset), float(rule.eps), float(rule.scale), 1.0 if rule.extent is None else float(rule.extent),
        N_AXES=n, MODE=mode, NORMALIZE=bool(rule.normalize), HAS_OFFSET=bool(rule.offset),
        HAS_SPACING=spacing is not None, HAS_EXTENT=rule.extent is not None,
        ANGLES_64=divisors.dtype == torch.float64,
        BLOCK_R=block_r, BLOCK_W=block_w, KC=_FREQUENCIES, num_warps=4, enable_fp_fusion=False,
    )


def _next_power_of_2(v: int) -> int:
    """The smallest power of 2 ``>= v`` (``v >= 1``), as ``triton.next_power_of_2`` (which is not
    imported here)."""
    return 1 << (int(v) - 1).bit_length()
