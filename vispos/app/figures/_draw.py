"""Drawing primitives shared by the figures: the Agg canvas, the padding overlay, volume slices.

Every figure of :mod:`vispos.app.figures` draws padding through :func:`shade_padding` (one look:
opaque grey, hatched, on top of whatever the panel shows; a mask panel through :func:`draw_mask`,
the same grey on white), names it with :data:`PADDING_LEGEND`, and builds its canvas with
:func:`new_figure` (matplotlib's object API on an Agg canvas, so importing vispos never changes
the global backend and nothing opens a window).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from ..data import IMAGENET_MEAN, IMAGENET_STD

#: the colour of padding in every figure (RGB): opaque, so no colour scale shows through it
PADDING_COLOR = (0.62, 0.62, 0.62)
#: the hatch drawn over padding, so it reads apart from a grey image, and its lines' colour
PADDING_HATCH = "////"
PADDING_HATCH_COLOR = (0.35, 0.35, 0.35)
#: the one wording of the padding legend, in every figure that shows padding
PADDING_LEGEND = "hatched grey = padding"
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
    """Draws padding on ``ax``: opaque grey (:data:`PADDING_COLOR`) and hatched where ``mask`` is
    True, on top of the panel's image, cell for cell.

    The one way every figure shows padding (:data:`PADDING_LEGEND` names it). Nothing is drawn
    for ``None`` or an all-valid mask.

    Args:
        ax (matplotlib Axes): the panel, already holding its image (cell ``(i, j)`` centred at
            ``x = j, y = i``: ``imshow``'s default extent).
        mask (Tensor[rows, cols] | ndarray, bool, optional): True marks padding.
        origin (str): ``"upper"`` (images) or ``"lower"`` (volume slices), as the image below.
    """
    m = _as_mask(mask)
    if m is None or not m.any():
        return
    overlay = np.zeros((*m.shape, 4))
    overlay[m] = (*PADDING_COLOR, 1.0)
    ax.imshow(overlay, origin=origin, interpolation="nearest")
    _hatch(ax, m)


def draw_mask(ax, mask: Tensor | np.ndarray) -> None:
    """A mask panel: valid cells white, padding as :func:`shade_padding` draws it (the image's
    array is the mask itself).

    Args:
        ax (matplotlib Axes): an empty panel.
        mask (Tensor[rows, cols] | ndarray, bool): True marks padding.
    """
    from matplotlib.colors import ListedColormap

    m = _as_mask(mask)
    ax.imshow(m, cmap=ListedColormap([(1.0, 1.0, 1.0), PADDING_COLOR]), vmin=0, vmax=1, interpolation="nearest")
    _hatch(ax, m)


def _as_mask(mask: Tensor | np.ndarray | None) -> np.ndarray | None:
    if mask is None:
        return None
    return (mask.cpu().numpy() if isinstance(mask, Tensor) else np.asarray(mask)).astype(bool)


def _hatch(ax, m: np.ndarray) -> None:
    """The hatch over exactly the padded cells: one compound path of rectangles (rows with the
    same runs of padding merged), so it never strays into a valid cell nor leaves a padded one."""
    from matplotlib.patches import PathPatch
    from matplotlib.path import Path

    verts: list[tuple[float, float]] = []
    for top, bottom, runs in _row_blocks(m):
        for left, right in runs:
            x0, x1, y0, y1 = left - 0.5, right - 0.5, top - 0.5, bottom - 0.5
            verts += [(x0, y0), (x1, y0), (x1, y1), (x0, y1), (x0, y0)]
    if not verts:
        return
    codes = [Path.MOVETO, Path.LINETO, Path.LINETO, Path.LINETO, Path.CLOSEPOLY] * (len(verts) // 5)
    # the hatch takes the edge colour; a zero line width draws no outline
    ax.add_patch(PathPatch(Path(verts, codes), facecolor="none", edgecolor=PADDING_HATCH_COLOR, linewidth=0,
                           hatch=PADDING_HATCH))


def _row_blocks(m: np.ndarray) -> list[tuple[int, int, tuple[tuple[int, int], ...]]]:
    """``(top, bottom, runs)``: consecutive rows ``top .. bottom - 1`` of ``m`` whose padded cells
    form the same column runs ``[(left, right), ...]`` (``right`` exclusive)."""
    blocks: list[tuple[int, int, tuple[tuple[int, int], ...]]] = []
    for r, row in enumerate(m):
        edges = np.flatnonzero(np.diff(np.concatenate(([0], row.astype(np.int8), [0]))))
        runs = tuple(zip(edges[::2].tolist(), edges[1::2].tolist()))
        if blocks and blocks[-1][1] == r and blocks[-1][2] == runs:
            blocks[-1] = (blocks[-1][0], r + 1, runs)
        elif runs:
            blocks.append((r, r + 1, runs))
    return blocks


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


def display_images(tensors: Tensor, imagenet_normalized: bool) -> Tensor:
    """``(B, C, H, W)`` images as float32 CPU values in ``[0, 1]``; ImageNet normalisation undone
    when ``imagenet_normalized`` (3 channels only)."""
    images = tensors.detach().float().cpu()
    if imagenet_normalized and images.shape[1] == 3:
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
