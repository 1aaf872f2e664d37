"""The rule book on layers that make a feature map larger: transposed convolutions, up-sampling.

* ``nn.ConvTranspose1d/2d/3d`` (any kernel, stride, padding, output padding, dilation, groups) and
  ``F.conv_transpose1d/2d/3d``: zeros in the input's padding, what an item alone has around it.
  An item of ``n`` cells starting at cell ``a`` then gives, from output cell ``a * stride`` on,
  the ``(n - 1) * stride - 2 * padding + dilation * (kernel - 1) + output_padding + 1`` cells it
  gives alone (:class:`~vispos.invariance.geometry._geometry.TransposedWindow` replays that formula on
  each item's box). An explicit ``output_size=`` is refused: it is the canvas's size, not the
  item's.
* ``nn.Upsample`` / ``F.interpolate`` with an integer ``scale_factor`` on every axis (``size=`` is
  refused: a fixed output size resizes the canvas, not the item):

  - ``"nearest"``, ``"nearest-exact"``, ``"area"``: output cell ``j`` reads input cell
    ``j // scale`` alone, so the item's ``n * scale`` output cells read only its own cells.
    Nothing to fill.
  - ``"linear"``, ``"bilinear"``, ``"bicubic"``, ``"trilinear"`` with ``align_corners=False``
    (torch's default): source positions ``(j + 0.5) / scale - 0.5`` do not depend on the size, but
    at the item's edges torch clamps the taps to the item's first and last cell (and the source
    position to 0) where in a batch they would read the canvas's next cells. The input's padding
    is filled with each item's edge values (the cell's value at the nearest box cell, axis by
    axis), which is what the clamp reads alone. Needs each item's box (a rectangular padding).
  - ``"bicubic"`` with ``antialias=True`` is refused: its taps are renormalised over the cells
    inside the input, fewer at the item's edge alone than in a batch (bilinear's are exact: they
    average copies of the edge value).
  - ``align_corners=True`` (``nn.UpsamplingBilinear2d``) is refused: its source positions
    ``j * (n - 1) / (n * scale - 1)`` depend on the size ``n``, so the canvas's differ from the
    item's.

References:
    Dumoulin and Visin, A guide to convolution arithmetic for deep learning, 2016 (transposed
    convolution); ``torch.nn.ConvTranspose2d`` (output shape); ``torch.nn.functional.interpolate``
    and ATen ``UpSample.h`` (``area_pixel_compute_source_index``, ``nearest_idx``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
from torch import Tensor

from ...padding import Padding
from ..rules._functions import _tuple
from ..geometry._geometry import TransposedWindow

__all__ = ["transposed_window", "interpolate", "fill_edges"]

_NEAREST = ("nearest", "nearest-exact", "area")
_LINEAR = ("linear", "bilinear", "bicubic", "trilinear")


def transposed_window(n: int, kernel: Any, stride: Any, padding: Any, output_padding: Any,
                      dilation: Any) -> TransposedWindow:
    """A :class:`TransposedWindow` from ``nn.ConvTranspose``'s arguments (ints or per-axis tuples)."""
    return TransposedWindow(_tuple(kernel, n), _tuple(stride, n), _tuple(padding, n), _tuple(output_padding, n),
                            _tuple(dilation, n))


def interpolate(step: Any, node: fx.Node, size: Any, scale_factor: Any, mode: str,
                align_corners: Any, antialias: bool = False) -> None:
    """Rewrites an up-sampling node (``nn.Upsample`` or ``F.interpolate``) through ``step`` (the
    rule book's :class:`~vispos.invariance.rules.RewriteStep`) by the module docstring's rules, or
    refuses it."""
    n = step.num_axes
    if size is not None:
        step.refuse(node, f"it resizes to a fixed size={size!r}, the canvas's output rather than the item's "
                          "(use an integer scale_factor)")
    scales = scale_factor if isinstance(scale_factor, (tuple, list)) else (scale_factor,) * n
    if len(scales) != n or any(not isinstance(s, (int, float)) or not float(s).is_integer() or s < 1 for s in scales):
        step.refuse(node, f"scale_factor={scale_factor!r} (only integer factors >= 1 map each item's cells to "
                          "whole output cells)")
    scales = tuple(int(s) for s in scales)
    window = TransposedWindow(scales, scales, (0,) * n, (0,) * n, (1,) * n)
    if mode in _NEAREST:
        return step.window(node, window, "zero")  # taps never meet: nothing is filled
    if mode not in _LINEAR:
        step.refuse(node, f"mode={mode!r}")
    if align_corners:
        step.refuse(node, f"mode={mode!r} with align_corners=True: its source positions j * (n - 1) / "
                          "(n * scale - 1) depend on the size n, the canvas's in a batch, the item's alone")
    if antialias and mode == "bicubic":
        step.refuse(node, "mode='bicubic' with antialias=True: its taps are renormalised over the cells inside "
                          "the input, so at the item's edge alone over fewer taps than in a batch")
    step.window(node, window, "edge")


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
        ValueError: an arbitrary padding (no box per item).
    """
    if padding is None or padding.kind == "none":
        return x
    if padding.kind != "rectangular":
        raise ValueError(
            "padding_invariant=True: a linear up-sampling needs each item's box to repeat its edge cells, got an "
            "arbitrary padding mask")
    batch = x.shape[0]
    for axis in range(padding.num_axes):
        dim = 2 + axis
        cells = x.shape[dim]
        first = torch.tensor([s[axis] for s in padding.starts], device=x.device)
        last = torch.tensor([max(e[axis] - 1, s[axis]) for s, e in zip(padding.starts, padding.stops)],
                            device=x.device)
        index = torch.arange(cells, device=x.device).expand(batch, cells)
        index = torch.minimum(torch.maximum(index, first[:, None]), last[:, None])
        view = [batch] + [1] * (x.dim() - 1)
        view[dim] = cells
        x = x.gather(dim, index.reshape(view).expand(x.shape))
    return x
