"""The ``@triton.jit`` helpers every vispos kernel shares: sums, tiles of a ``(B, C, S)`` map read under
its padding mask, and shifted-data statistics merged with Chan's formula.

Statistics: each lane of a tile keeps ``(count, shift, s1, s2)``, the sums of ``v - shift`` and of
its square over the valid values it saw, ``shift`` its first valid value (:func:`lane_update`).
Sums of differences from a value of the data stay small where the data's mean is large against
its spread (mean 1e4, deviation 1e-2 in float32), so the variance keeps the precision of a two-pass
computation without a second pass. :func:`lanes_stats` turns the lanes into ``(count, shift, mean -
shift, m2)`` and :func:`merge` merges such rows along an axis (lanes into a chunk, chunks into a
channel or group), every mean taken relative to one valid shift: the same helper at every level.
Only Triton's public language is used (``tl.reduce`` with :func:`add` / :func:`maximum`), so
Triton's interpreter runs the helpers whichever mode Triton was imported in.

This module imports Triton: only kernel modules import it, on the first launch.

References:
    Chan, Golub and LeVeque, Algorithms for computing the sample variance, 1983 (pairwise merge,
    shifted data); Welford, 1962; inductor's ``triton_helpers.welford_combine``; Liger-Kernel's
    shared ``ops/utils.py``.
"""

import torch
import triton.language as tl

from ._triton import device_function

__all__ = ["stat_type", "add", "maximum", "total", "kept", "offsets", "lane_update", "lanes_stats", "merge",
           "merge_parts", "normalizer"]


def stat_type(dtype: torch.dtype):
    """The statistics' Triton dtype for inputs of ``dtype``: float64 for float64, else float32."""
    return tl.float64 if dtype == torch.float64 else tl.float32


@device_function
def add(a, b):
    return a + b


@device_function
def maximum(a, b):
    return tl.maximum(a, b)


@device_function
def total(x, AXIS: tl.constexpr):
    """``x`` summed along ``AXIS``."""
    return tl.reduce(x, AXIS, add)


@device_function
def kept(mask_ptr, item, cell, inb, stride_mb, stride_ms):
    """Which of the cells ``(item, cell)`` (where ``inb``) are valid: the padding mask (True =
    padding) read at them."""
    return inb & (tl.load(mask_ptr + item * stride_mb + cell * stride_ms, mask=inb, other=1) == 0)


@device_function
def offsets(item, channel, cell, stride_b, stride_c, stride_s):
    """int64 element offsets of ``(item, channel, cell)`` (broadcast) in a map of these strides."""
    return item.to(tl.int64) * stride_b + channel.to(tl.int64) * stride_c + cell.to(tl.int64) * stride_s


@device_function
def lane_update(cnt, shift, s1, s2, v, keep):
    """Lanes' shifted sums after one more value ``v`` each (where ``keep``): a lane's first valid
    value becomes its shift."""
    shift = tl.where((cnt == 0) & keep, v, shift)
    d = tl.where(keep, v - shift, 0.0)
    return cnt + keep.to(cnt.dtype), shift, s1 + d, s2 + d * d


@device_function
def lanes_stats(cnt, s1, s2):
    """A lane's ``(mean - shift, m2)`` from its shifted sums (``m2``: the centred sum of squares)."""
    rel = s1 / tl.maximum(cnt, 1.0)
    return rel, tl.maximum(s2 - s1 * rel, 0.0)


@device_function
def merge(cnt, shift, rel, m2, AXIS: tl.constexpr):
    """Rows of ``(count, shift, mean - shift, m2)`` merged along ``AXIS`` (Chan): ``(count, shift,
    mean - shift, m2)`` of the union, its shift the largest shift of a non-empty row (0 when every
    row is empty)."""
    ref = tl.reduce(tl.where(cnt > 0, shift, -float("inf")), AXIS, maximum)
    ref = tl.where(ref == -float("inf"), 0.0, ref)
    d = tl.where(cnt > 0, (shift - tl.expand_dims(ref, AXIS)) + rel, 0.0)
    n = total(cnt, AXIS)
    mean = total(cnt * d, AXIS) / tl.maximum(n, 1.0)
    dev = d - tl.expand_dims(mean, AXIS)
    return n, ref, mean, total(m2 + cnt * dev * dev, AXIS)


@device_function
def merge_parts(part_ptr, at, plane, pmask):
    """The rows of partial statistics a first pass stored at ``part_ptr`` (four planes of ``plane``
    values: counts, shifts, mean - shift, m2; ``at`` the tile's offsets in a plane, ``pmask`` its
    valid entries) merged along axis 1 by :func:`merge`."""
    return merge(tl.load(part_ptr + at, mask=pmask, other=0.0),
                 tl.load(part_ptr + plane + at, mask=pmask, other=0.0),
                 tl.load(part_ptr + 2 * plane + at, mask=pmask, other=0.0),
                 tl.load(part_ptr + 3 * plane + at, mask=pmask, other=0.0), 1)


@device_function
def normalizer(var, eps, w_ptr, b_ptr, ch, cmask, HAS_W: tl.constexpr, HAS_B: tl.constexpr, STAT: tl.constexpr):
    """A norm's ``(inverse deviation, scale, shift)`` per channel ``ch``: ``1 / sqrt(var + eps)``
    correctly rounded (``sqrt_rn`` takes float32 only; float64 ``sqrt`` is IEEE), times the weight
    where there is one, and the bias (0 without)."""
    if STAT == tl.float64:
        inverse = 1.0 / tl.sqrt(var + eps)
    else:
        inverse = 1.0 / tl.sqrt_rn(var + eps)
    scale = inverse
    if HAS_W:
        scale = scale * tl.load(w_ptr + ch, mask=cmask, other=0.0).to(STAT)
    shift = tl.zeros_like(inverse)
    if HAS_B:
        shift = tl.load(b_ptr + ch, mask=cmask, other=0.0).to(STAT)
    return inverse, scale, shift
