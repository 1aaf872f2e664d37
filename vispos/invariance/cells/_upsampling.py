"""The maths of layers that resize a feature map: transposed convolutions, up- and down-sampling.

* ``nn.ConvTranspose1d/2d/3d`` (any kernel, stride, padding, output padding, dilation, groups) and
  ``F.conv_transpose1d/2d/3d``: zeros in the input's padding, what an item alone has around it.
  An item of ``n`` cells starting at cell ``a`` then gives, from output cell ``a * stride`` on,
  the ``(n - 1) * stride - 2 * padding + dilation * (kernel - 1) + output_padding + 1`` cells it
  gives alone (:class:`~vispos.invariance.geometry._geometry.TransposedWindow` replays that formula on
  each item's box). An explicit ``output_size=`` is refused: it is the canvas's size, not the
  item's.
* ``nn.Upsample`` / ``F.interpolate`` with an integer ``scale_factor`` on every axis:

  - ``"nearest"``, ``"nearest-exact"``, ``"area"``: output cell ``j`` reads input cell
    ``j // scale`` alone, so the item's ``n * scale`` output cells read only its own cells.
    Nothing to fill.
  - ``"linear"``, ``"bilinear"``, ``"bicubic"``, ``"trilinear"`` with ``align_corners=False``
    (torch's default): source positions ``(j + 0.5) / scale - 0.5`` do not depend on the size, but
    at the item's edges torch clamps the taps to the item's first and last cell (and the source
    position to 0) where in a batch they would read the canvas's next cells. The input's padding
    is filled with each item's edge values (:func:`fill_edges`), which is what the clamp reads
    alone. ``"bicubic"`` with ``antialias=True`` is refused: its taps are renormalised over the
    cells inside the input, fewer at the item's edge alone than in a batch (bilinear's are exact:
    they average copies of the edge value).

* **Each item to its own size** (:func:`resize`): ``size=`` read from another feature map
  (``size=skip.shape[-2:]``, an FPN's top-down path, a segmentation head's ``size=input_shape``),
  a non-integer ``scale_factor`` (``0.5``, ``1.5``: :class:`ScaledWindow`) and
  ``align_corners=True`` (whose source positions ``j * (n - 1) / (m - 1)`` depend on the size):
  every item's source index and weights along each axis are computed from its own input and
  output sizes as tensors, as ATen does for the item alone, and gathered from its own cells
  (``"area"``: each item's own adaptive bins). A constant ``size=`` (the canvas's output) and
  ``antialias=True`` on this path are refused by the rule (:mod:`vispos.invariance.rules._types`).

References:
    Dumoulin and Visin, A guide to convolution arithmetic for deep learning, 2016 (transposed
    convolution); ``torch.nn.ConvTranspose2d`` (output shape); ``torch.nn.functional.interpolate``
    and ATen ``UpSample.h`` (``area_pixel_compute_source_index``, ``nearest_idx``,
    ``guard_index_and_lambda``, cubic convolution with ``A = -0.75``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ...padding import Padding
from ._pools import item_boxes, pool_bins, valid_cells
from ..rules._functions import _tuple
from ..geometry._geometry import TransposedWindow

__all__ = ["transposed_window", "fill_edges", "resize", "ScaledWindow", "NEAREST", "LINEAR"]

#: modes whose output cell reads one input cell, and modes that weigh neighbouring cells
NEAREST = ("nearest", "nearest-exact", "area")
LINEAR = ("linear", "bilinear", "bicubic", "trilinear")


def transposed_window(n: int, kernel: Any, stride: Any, padding: Any, output_padding: Any,
                      dilation: Any) -> TransposedWindow:
    """A :class:`TransposedWindow` from ``nn.ConvTranspose``'s arguments (ints or per-axis tuples)."""
    return TransposedWindow(_tuple(kernel, n), _tuple(stride, n), _tuple(padding, n), _tuple(output_padding, n),
                            _tuple(dilation, n))


@dataclass(frozen=True)
class ScaledWindow:
    """An interpolation by constant, non-integer factors (``scale_factor=0.5``, ``1.5``) as a window
    of the geometry tree: an item of ``n`` cells gives ``floor(n * scale)`` (torch's output size),
    starting at ``floor(start * scale)`` (so items never overlap on the output canvas).

    Attributes:
        scale (tuple of float): one factor per spatial axis.
    """

    scale: tuple[float, ...]

    @property
    def kernel(self) -> tuple[int, ...]:
        return (1,) * len(self.scale)

    @property
    def stride(self) -> tuple[float, ...]:
        return self.scale

    @property
    def pad_lo(self) -> tuple[int, ...]:
        return (0,) * len(self.scale)

    @property
    def is_identity(self) -> bool:
        return all(s == 1 for s in self.scale)

    @property
    def reads_neighbours(self) -> bool:
        return True

    def out_size(self, n: int, axis: int) -> int:
        """``floor(n * scale)`` in double precision, as ``F.interpolate``."""
        return int(math.floor(float(n) * self.scale[axis]))

    def start_of(self, start: int, axis: int) -> int:
        return int(math.floor(float(start) * self.scale[axis]))


def _cubic(t: Tensor) -> list[Tensor]:
    """The four weights of torch's cubic convolution (``A = -0.75``) at fraction ``t``."""
    a = -0.75

    def near(x):
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def _taps(mode: str, align_corners: bool, scale: float | None, n_in: Tensor, m_out: Tensor, j: Tensor,
          dtype: torch.dtype) -> list[tuple[Tensor, Tensor | None]]:
    """The source cells (on the item, ``0 .. n_in - 1``) and weights of output cells ``j`` (on the
    item) along one axis, for items of ``n_in`` cells resized to ``m_out`` (``Tensor[B, 1]``
    each), as ATen's ``UpSample.h`` computes them (``nearest_idx``, ``area_pixel_compute_source_index``,
    ``guard_index_and_lambda``): nearest in float32, linear and cubic in ``dtype``'s opmath."""
    last = (n_in - 1).clamp(min=0)
    same = n_in == m_out
    if mode in ("nearest", "nearest-exact"):
        f32 = torch.float32
        ratio = torch.full_like(n_in, 0, dtype=f32) + (1.0 / scale) if scale else n_in.to(f32) / m_out.to(f32)
        if mode == "nearest":
            src = torch.floor(j.to(f32) * ratio).long()
            src = torch.where(m_out == 2 * n_in, j >> 1, src)
            src = torch.where(same, j, src)
        else:
            src = torch.floor(((j.to(torch.float64) + 0.5) * ratio.to(torch.float64)).to(f32)).long()
        return [(torch.minimum(src, last).clamp(min=0), None)]
    opmath = torch.float64 if dtype == torch.float64 else torch.float32
    if align_corners:
        ratio = torch.where(m_out > 1, (n_in - 1).to(opmath) / (m_out - 1).clamp(min=1).to(opmath), 0.0)
        real = ratio * j.to(opmath)
    else:
        ratio = torch.full_like(n_in, 0, dtype=opmath) + (1.0 / scale) if scale else n_in.to(opmath) / m_out.to(opmath)
        real = ratio * (j.to(opmath) + 0.5) - 0.5
    cubic = mode == "bicubic"
    if not cubic:
        real = real.clamp(min=0)
    index = torch.minimum(torch.floor(real.to(torch.float32)).long(), n_in - 1)  # floorf, as ATen
    t = (real - index.to(opmath)).clamp(0, 1)
    if cubic:
        return [((index + k - 1).clamp(min=0).minimum(last), w.to(dtype)) for k, w in enumerate(_cubic(t))]
    index = torch.where(same, j, index)
    t = torch.where(same, 0.0, t)
    upper = index + (index < n_in - 1).long()
    return [(index.clamp(min=0), (1 - t).to(dtype)), (upper.clamp(min=0).minimum(last), t.to(dtype))]


def resize(x: Tensor, padding: Padding | None, target: Padding, mode: str, align_corners: bool,
           scales: Any = None) -> Tensor:
    """Each item of a padded batch resized from its own box on ``padding`` to its own box on
    ``target``, exactly as ``F.interpolate`` resizes the item alone; one index / weight table per
    axis for the whole batch (no loop over items), applied axis after axis by gathers.

    Args:
        x (Tensor[B, C, *S]): features, channels first. padding (Padding, optional): ``x``'s, with a
            box per item; None: every item fills ``x`` (a pooled grid of its own). target (Padding):
            the output's (its canvas is the output's size), a box per item.
        mode (str): ``"nearest"``, ``"nearest-exact"``, ``"linear"``, ``"bilinear"``,
            ``"trilinear"``, ``"bicubic"`` or ``"area"`` (an adaptive average pool of each item to its
            own output size). align_corners (bool): as ``F.interpolate``.
        scales (float or sequence of float, optional): the ``scale_factor`` torch's coordinates use
            (given, and not recomputed); None: each item's own input size over its output size.

    Returns:
        Tensor[B, C, *S_target] in ``x``'s dtype; on each item's box its resized cells, elsewhere
        values of the item's own cells (never a padded cell of ``x``). Differentiable.

    Raises:
        ValueError: an arbitrary padding mask outside a trace (:func:`item_boxes`).

    References:
        ATen ``UpSample.h`` and ``UpSampleKernel.cpp`` (source indices, weights, size special cases).
    """
    n = target.num_axes
    scales = scales if isinstance(scales, (tuple, list)) or scales is None else (scales,) * n
    if padding is None:  # every item fills x
        in_start = torch.zeros((x.shape[0], n), dtype=torch.int64, device=x.device)
        in_size = in_start + torch.tensor(x.shape[2:], dtype=torch.int64, device=x.device)
    else:
        in_start, in_size = item_boxes(padding, x.device)
    out_start, out_size = item_boxes(target, x.device)
    batch = x.shape[0]
    for axis in range(n):
        dim, cells = 2 + axis, target.spatial[axis]
        n_in, m_out = in_size[:, axis : axis + 1], out_size[:, axis : axis + 1]
        j = (torch.arange(cells, device=x.device)[None] - out_start[:, axis : axis + 1]).clamp(min=0)
        j = torch.minimum(j, (m_out - 1).clamp(min=0))
        view = [batch] + [1] * (x.dim() - 1)
        view[dim] = cells
        shape = list(x.shape)
        shape[dim] = cells
        if mode == "area":  # an adaptive average pool of each item to its own output size
            if axis == 0 and padding is not None:
                x = torch.where(valid_cells(padding), x, 0.0)
            x = pool_bins(x, dim, "mean", j, n_in, m_out, in_start[:, axis : axis + 1])
            continue
        out = None
        for index, weight in _taps(mode, align_corners, None if scales is None else float(scales[axis]), n_in,
                                   m_out, j, x.dtype):
            index = (index + in_start[:, axis : axis + 1]).reshape(view).expand(shape)
            tap = x.gather(dim, index)
            if weight is not None:
                tap = tap * weight.reshape(view)
            out = tap if out is None else out + tap
        x = out
    return x


def fill_edges(x: Tensor, padding: Padding | None) -> Tensor:
    """A copy of ``x`` whose padded cells hold the value of the item's nearest cell, axis after
    axis (what a clamped tap reads on the item alone); ``x`` itself without padding.

    Args:
        x (Tensor[B, C, *S]): features. padding (Padding, optional): of shape ``(B, *S)``, with a
            box per item.

    Returns:
        Tensor[B, C, *S]: ``x``'s dtype; differentiable (the edge cells get the gradient of the
        cells that copy them).

    Raises:
        ValueError: an arbitrary padding mask outside a trace (no box per item; under
            ``torch.compile`` the graph gets each box as a mask, :func:`item_boxes`).
    """
    if padding is None or padding.kind == "none":
        return x
    starts, sizes = item_boxes(padding, x.device)
    batch = x.shape[0]
    for axis in range(padding.num_axes):
        dim = 2 + axis
        cells = x.shape[dim]
        first = starts[:, axis : axis + 1]
        last = first + (sizes[:, axis : axis + 1] - 1).clamp(min=0)
        index = torch.arange(cells, device=x.device).expand(batch, cells)
        index = torch.minimum(torch.maximum(index, first), last)
        view = [batch] + [1] * (x.dim() - 1)
        view[dim] = cells
        x = x.gather(dim, index.reshape(view).expand(x.shape))
    return x
