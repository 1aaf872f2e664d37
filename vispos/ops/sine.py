"""DETR's sine embedding of a padded level as torch custom ops, one Triton kernel launch each.

A level's whole output ``(B, n * F, *S)`` is written by one launch of
:func:`~vispos.ops._sine_kernels.sine_embed_kernel` instead of the line tables, selects and copies of
the torch path (a dozen small kernels and host work). Two ops, each declaring one launch
(:func:`vispos.ops._triton.register_launches`):

* ``vispos::sine_boxes`` -- no padding, or a box per item: the boxes travel as one small int32
  tensor ``(B, 2 n)`` (starts, then stops);
* ``vispos::sine_counts`` -- any mask: ``torch.cumsum`` of the mask along each axis (``n`` tensors)
  feeds the kernel, which turns the padding counts into DETR's counts.

Both write into an ``out`` they are given (declared ``Tensor(a!)`` in their schemas; a fake
implementation lets ``torch.compile`` and ``torch.export`` see one op), after checking it and the
boxes or counts as a torch op checks its arguments (a kernel writes through raw pointers). They are
``torch.library.Library`` definitions, as the norms are: a call reaches its implementation with no
Python layer in between (``custom_op``'s in-place and autograd layers cost about a third of the
call on the CUDA path), and nothing in them is differentiable. Their torch implementation is
the reference and the path of every call that does not take Triton: the same float32 steps as the
torch path (:class:`~vispos._positions.PositionRule`, :func:`~vispos._sincos._embed_axis`), hence the
same numbers. :mod:`vispos.encodings._sine_op` says which calls take the ops and makes the call.

References:
    Carion et al., End-to-End Object Detection with Transformers, ECCV 2020
    (``PositionEmbeddingSine``); PyTorch ``torch.library`` (``Library.define``, ``register_fake``);
    Tillet et al., Triton, MAPL 2019.
"""

import functools
import math
from typing import Any, Optional

import torch
from torch import Tensor

from . import _triton
from .._positions import PositionRule
from .._sincos import _embed_axis
from ._sizes import p2, plan

__all__ = ["BOXES", "COUNTS", "sine_boxes", "sine_counts", "write_boxes", "write_counts"]

BOXES = "vispos::sine_boxes"
COUNTS = "vispos::sine_counts"
_FREQUENCIES = 8  # frequencies of every axis block one program writes
_TILE_CELLS = 2048  # cells of one program's tile
_MAX_CELLS = 2**31 - 1  # the kernel indexes cells with int32


# ------------------------------------------------------------------------------------ the ops
_LIB = torch.library.Library("vispos", "FRAGMENT")
_LIB.define("sine_boxes(Tensor(a!) out, Tensor? boxes, Tensor divisors, Tensor? spacing, bool normalize, float scale, "
            "float offset, float eps, float? extent) -> ()")
_LIB.define("sine_counts(Tensor(a!) out, Tensor[] counts, Tensor divisors, Tensor? spacing, bool normalize, "
            "float scale, float offset, float eps, float? extent) -> ()")


def _sine_boxes(
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
        TypeError: ``out`` not floating, ``boxes`` not int32, ``divisors`` / ``spacing`` not floating.
        ValueError: ``out`` not contiguous or of a shape that does not match ``divisors``, ``boxes``
            or ``spacing`` (``boxes``: ``(B, 2 n)``, contiguous), a tensor on another device; more
            than 2**31 - 1 cells per item and axis block.

    References:
        Carion et al., DETR, ECCV 2020.
    """
    _check_common("sine_boxes", out, divisors, spacing)
    if boxes is not None:
        _check_int_tensor("sine_boxes", "boxes", boxes, out, (out.shape[0], 2 * (out.dim() - 2)))
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


def _sine_counts(
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
        TypeError: ``out`` not floating, ``counts`` not int32, ``divisors`` / ``spacing`` not floating.
        ValueError: ``out`` not contiguous or of a shape that does not match ``divisors`` or
            ``spacing``; not one count tensor ``(B, *S)`` (contiguous) per spatial axis; a tensor on
            another device; more than 2**31 - 1 cells per item and axis block.

    References:
        Carion et al., DETR, ECCV 2020 (the cumulative sum).
    """
    _check_common("sine_counts", out, divisors, spacing)
    if len(counts) != out.dim() - 2:
        raise ValueError(f"sine_counts: counts must hold one tensor per spatial axis of out (shape "
                         f"{tuple(out.shape)}: {out.dim() - 2}), got {len(counts)}")
    for i, c in enumerate(counts):
        _check_int_tensor("sine_counts", f"counts[{i}]", c, out, (out.shape[0], *out.shape[2:]))
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


def _check_common(op: str, out: Tensor, divisors: Tensor, spacing: Optional[Tensor]) -> None:
    """Checks ``out`` against ``divisors`` and ``spacing`` (see :func:`sine_boxes`'s Raises): the
    kernel writes ``out`` through raw pointers, as a contiguous ``(B, n * F, *S)``."""
    if not out.is_floating_point():
        raise TypeError(f"{op}: out must be a floating tensor, got {out.dtype}")
    if not 3 <= out.dim() <= 5:
        raise ValueError(f"{op}: out must be Tensor[B, n * F, *S] with 1 to 3 spatial axes, got shape "
                         f"{tuple(out.shape)}")
    if not out.is_contiguous():
        raise ValueError(f"{op}: out must be contiguous (the kernel writes it as one block), got strides "
                         f"{out.stride()} for shape {tuple(out.shape)}: pass out.contiguous() and copy back")
    if not divisors.is_floating_point() or divisors.dim() != 1:
        raise TypeError(f"{op}: divisors must be a floating Tensor[F // 2], got {divisors.dtype} of shape "
                        f"{tuple(divisors.shape)}")
    want = (out.dim() - 2) * 2 * divisors.shape[0]
    if out.shape[1] != want:
        raise ValueError(f"{op}: out has {out.shape[1]} channels, but {out.dim() - 2} spatial axes of "
                         f"{2 * divisors.shape[0]} channels each (2 per divisor) make {want}")
    if divisors.device != out.device:
        raise ValueError(f"{op}: divisors is on {divisors.device}, out on {out.device}: both must be on one device")
    if spacing is not None:
        if spacing.dtype != torch.float32:
            raise TypeError(f"{op}: spacing must be float32, got {spacing.dtype}")
        if tuple(spacing.shape) != (out.shape[0], out.dim() - 2) or spacing.device != out.device:
            raise ValueError(f"{op}: spacing must be Tensor[B, n] = {(out.shape[0], out.dim() - 2)} on {out.device}, "
                             f"got shape {tuple(spacing.shape)} on {spacing.device}")


def _check_int_tensor(op: str, name: str, t: Tensor, out: Tensor, shape: tuple[int, ...]) -> None:
    """Checks an int32 argument the kernel reads as a contiguous block of ``shape``."""
    if t.dtype != torch.int32:
        raise TypeError(f"{op}: {name} must be int32, got {t.dtype}")
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{op}: {name} must have shape {tuple(shape)} for out of shape {tuple(out.shape)}, got "
                         f"{tuple(t.shape)}")
    if not t.is_contiguous():
        raise ValueError(f"{op}: {name} must be contiguous (the kernel reads it as one block), got strides "
                         f"{t.stride()}: pass {name}.contiguous()")
    if t.device != out.device:
        raise ValueError(f"{op}: {name} is on {t.device}, out on {out.device}: both must be on one device")


def _sine_boxes_fake(out, boxes, divisors, spacing, normalize, scale, offset, eps, extent) -> None:
    _check_common("sine_boxes", out, divisors, spacing)


def _sine_counts_fake(out, counts, divisors, spacing, normalize, scale, offset, eps, extent) -> None:
    _check_common("sine_counts", out, divisors, spacing)


for _name, _impl, _fake in (("sine_boxes", _sine_boxes, _sine_boxes_fake),
                            ("sine_counts", _sine_counts, _sine_counts_fake)):
    _LIB.impl(_name, _impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"vispos::{_name}", _fake, lib=_LIB)
    _triton.register_launches(f"vispos::{_name}", 1)
#: the ops (the dispatcher's entry points: no Python layer between a call and its implementation)
sine_boxes = torch.ops.vispos.sine_boxes.default
sine_counts = torch.ops.vispos.sine_counts.default


def write_boxes(out: Tensor, boxes: Optional[Tensor], *args: Any) -> None:
    """:func:`sine_boxes` (``out`` then its other arguments) for vispos' own callers, whose arguments
    are built to the op's contract (``out`` checked by the encoder, ``boxes`` made from host
    values): in plain eager mode on the Triton path one launch without the op's argument checks
    (they guard direct calls of the op), elsewhere in plain eager mode the op's implementation
    (:func:`vispos.ops._triton.eager_call`), else the op."""
    if _triton.plain_eager(out) and _triton.use_triton(out):
        _launch(out, 0 if boxes is None else 1, boxes, [], args[0], args[1], PositionRule(*args[2:]))
        return
    _triton.eager_call(sine_boxes, _sine_boxes, out, out, boxes, *args)


def write_counts(out: Tensor, counts: list[Tensor], *args: Any) -> None:
    """:func:`sine_counts`, as :func:`write_boxes` calls :func:`sine_boxes` (``counts``: the mask's
    int32 cumulative sums)."""
    if _triton.plain_eager(out) and _triton.use_triton(out):
        _launch(out, 2, None, counts, args[0], args[1], PositionRule(*args[2:]))
        return
    _triton.eager_call(sine_counts, _sine_counts, out, out, counts, *args)


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
    from ._sine_kernels import sine_embed_kernel  # imports Triton: only when a kernel runs

    sizes = ("div_stride", "spacing_stride_b", "spacing_stride_i", "num_rows", "width", "size0", "size1", "half")
    return _triton.kernel(do_not_specialize=sizes)(sine_embed_kernel)


def _sizes(out: Tensor, half: int) -> tuple:
    """The launch's sizes for ``out`` (Tensor[B, n * F, *S]) and ``half`` divisors: the rows (every
    spatial axis but the last) and width of an item, the two leading axes of the frame (1 where
    missing), the grid and the tile.

    Raises:
        ValueError: more than 2**31 - 1 cells per item and axis block (int32 indexing).
    """
    batch, spatial = out.shape[0], tuple(out.shape[2:])
    n = len(spatial)
    width, rows = spatial[-1], math.prod(spatial[:-1])
    if rows * width > _MAX_CELLS:
        raise ValueError(f"the Triton sine kernel indexes cells with int32: got {rows * width} cells per item")
    block_w = min(p2(width), 128)
    block_r = min(p2(rows), max(1, _TILE_CELLS // block_w))
    grid = (-(-rows // block_r) * -(-width // block_w), batch, -(-half // _FREQUENCIES))
    return rows, width, spatial[0] if n == 3 else 1, spatial[-2] if n >= 2 else 1, grid, block_r, block_w


def _launch(
    out: Tensor, mode: int, boxes: Optional[Tensor], counts: list[Tensor], divisors: Tensor,
    spacing: Optional[Tensor], rule: PositionRule,
) -> None:
    """One launch of the kernel over ``out`` (see :mod:`vispos.ops._sine_kernels`), under ``out``'s
    device guard."""
    if out.numel() == 0:
        return
    n, half = out.dim() - 2, divisors.shape[0]
    rows, width, size0, size1, grid, block_r, block_w = plan(("sine", out.shape, half), lambda: _sizes(out, half))
    dummy = divisors  # a pointer the kernel does not read in this mode
    planes = list(counts) + [dummy] * (3 - len(counts))
    _kernel()[grid](
        out, dummy if boxes is None else boxes, *planes, divisors, divisors.stride(0),
        dummy if spacing is None else spacing,
        0 if spacing is None else spacing.stride(0), 0 if spacing is None else spacing.stride(1),
        rows, width, size0, size1, half,
        float(rule.offset), float(rule.eps), float(rule.scale), 1.0 if rule.extent is None else float(rule.extent),
        N_AXES=n, MODE=mode, NORMALIZE=bool(rule.normalize), HAS_OFFSET=bool(rule.offset),
        HAS_SPACING=spacing is not None, HAS_EXTENT=rule.extent is not None,
        ANGLES_64=divisors.dtype == torch.float64,
        BLOCK_R=block_r, BLOCK_W=block_w, KC=_FREQUENCIES, num_warps=4, enable_fp_fusion=False,
    )

