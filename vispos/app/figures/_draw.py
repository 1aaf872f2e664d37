"""Drawing primitives shared by the figures: the Agg canvas, the padding overlay, volume slices.

Every figure of :mod:`vispos.app.figures` draws padding through :func:`shade_padding` (one look:
grey, hatched) and builds its canvas with :func:`new_figure` (matplotlib's object API on an Agg
canvas, so importing vispos never changes the global backend and nothing opens a window).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from ..data import IMAGENET_MEAN, IMAGENET_STD

#: the padding overlay's colour (RGBA): a half-transparent grey over whatever is below
PADDING_RGBA = (0.5, 0.5, 0.5, 0.6)
#: the hatch drawn over padding, so it reads apart from a grey colour map
PADDING_HATCH = "////"
#: names of the planes that fix axis 0, 1, 2 of an RAS+ volume
PLANES = ("sagittal", "coronal", "axial")


def new_figure(width: float, height: float):
    """A constrained-layout ``Figure`` of ``width x height`` inches on its own Agg canvas."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def shade_padding(ax, mask: Tensor | np.ndarray | None, *, origin: str = "upper") -> None:
    """Draws padding on ``ax``: grey (:data:`PADDING_RGBA`) and hatched where ``mask`` is True.

    The one way every figure shows padding. Nothing is drawn for ``None`` or an all-valid mask.

    Args:
        ax (matplotlib Axes): the panel, already holding its image.
        mask (Tensor[rows, cols] | ndarray, bool, optional): True marks padding.
        origin (str): ``"upper"`` (images) or ``"lower"`` (volume slices), as the image below.
    """
    if mask is None:
        return
    m = mask.cpu().numpy() if isinstance(mask, Tensor) else np.asarray(mask)
    if not m.any():
        return
    overlay = np.zeros((*m.shape, 4))
    overlay[m] = PADDING_RGBA
    ax.imshow(overlay, origin=origin, interpolation="nearest")
    ax.contourf(m.astype(float), levels=[0.5, 1.5], colors="none", hatches=[PADDING_HATCH], origin=origin)


def plane_axes(axis: int) -> tuple[int, int]:
    """The two in-plane axes (horizontal, vertical) of the slice that fixes ``axis``."""
    i, j = [a for a in range(3) if a != axis]
    return i, j


def slice_plane(arr: np.ndarray, axis: int, index: int) -> np.ndarray:
    """A 2-D slice of a 3-D array, transposed for ``imshow(origin='lower')``: the higher axis
    runs up (superior / anterior up for RAS+ volumes)."""
    return np.take(arr, index, axis=axis).T


def mark_query(ax, col: float, row: float, size: float = 9) -> None:
    """The query cell: a white star with a black edge at ``(col, row)``."""
    ax.plot([col], [row], marker="*", color="white", markersize=size, markeredgecolor="black")


def no_ticks(axes) -> None:
    """Removes the ticks of every axes (the frame stays)."""
    for ax in np.ravel(axes):
        ax.set_xticks([])
        ax.set_yticks([])


def display_images(tensors: Tensor, normalized: bool) -> Tensor:
    """``(B, C, H, W)`` images as float32 CPU values in ``[0, 1]``; ImageNet normalisation undone
    when ``normalized`` (3 channels only)."""
    images = tensors.detach().float().cpu()
    if normalized and images.shape[1] == 3:
        images = images * torch.tensor(IMAGENET_STD).view(3, 1, 1) + torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
    return images.clamp(0, 1)


def valid_size(mask: Tensor | None, shape: Sequence[int]) -> tuple[int, ...]:
    """The valid extent of one item: ``shape`` without a mask, else the mask's sizes."""
    from ...padding import mask_sizes

    if mask is None:
        return tuple(shape)
    return mask_sizes(mask[None])[0]


def similarity_floor(sims: Sequence[np.ndarray], masks: Sequence[np.ndarray | None]) -> float:
    """The lower end of one colour range for several similarity maps: the smallest similarity
    among valid cells (at most 0.99, so the range is never empty)."""
    lows = [0.99]
    for sim, m in zip(sims, masks):
        keep = sim if m is None else sim[~m]
        if keep.size:
            lows.append(float(keep.min()))
    return min(lows)
