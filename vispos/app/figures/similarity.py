"""Figures of position-embedding similarity: cosine maps of query cells, per item and per level.

Each function returns a ``matplotlib.figure.Figure`` and never shows or writes it (the app's
:mod:`vispos.app.png` writes PNGs).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from ... import _deprecation
from ..._checks import check_int, describe
from ...nested_tensor import NestedTensor
from ...padding import check_mask
from ._draw import (
    PADDING_LEGEND,
    PLANES,
    display_images,
    draw_mask,
    mark_query,
    new_figure,
    no_ticks,
    plane_axes,
    shade_padding,
    similarity_floor,
    slice_plane,
    valid_size,
)
from ._inputs import check_pos

__all__ = [
    "cosine_similarity_map",
    "query_cells",
    "plot_similarity",
    "plot_level_similarity",
    "plot_volume_level_similarity",
]


def cosine_similarity_map(pos: Tensor, query: Sequence[int]) -> Tensor:
    """Cosine similarity of the embedding at one cell to the embedding at every cell.

    Args:
        pos (Tensor[C, *S]): one item's position embedding, channels-first.
        query (sequence of int): the query cell's index along each spatial axis.

    Returns:
        Tensor[*S], float32 in [-1, 1].

    Raises:
        TypeError: ``pos`` is not a tensor.
        ValueError: ``query`` has the wrong length or lies outside ``S``.

    References:
        Carion et al., DETR (ECCV 2020), figure of position-embedding similarities.
    """
    if not isinstance(pos, Tensor):
        raise TypeError(f"pos must be a Tensor[C, *S], got {type(pos).__name__}")
    spatial = tuple(pos.shape[1:])
    query = tuple(int(q) for q in query)
    if len(query) != len(spatial) or any(not 0 <= q < s for q, s in zip(query, spatial)):
        raise ValueError(f"query {query} must index a cell of the spatial shape {spatial}")
    flat = pos.float().reshape(pos.shape[0], -1)
    q = pos.float()[(slice(None), *query)].unsqueeze(1)
    sim = torch.nn.functional.cosine_similarity(flat, q, dim=0)
    return sim.reshape(spatial)


def query_cells(valid_size: Sequence[int], n: int = 3) -> list[tuple[int, ...]]:
    """``n`` query cells spread along the diagonal of an item's valid region.

    Args:
        valid_size (sequence of int): the valid extent along each spatial axis (each >= 1).
        n (int): how many cells, at 20% to 80% of the diagonal (the centre when ``n == 1``).

    Returns:
        list of tuples of int: cell indices, each inside ``valid_size``.

    Raises:
        TypeError: ``n`` is not an int.
        ValueError: ``n < 1``.

    References:
        Carion et al., DETR (ECCV 2020): the similarity figure picks a few query cells.
    """
    n = check_int(n, "n", minimum=1)
    fractions = np.linspace(0.2, 0.8, n) if n > 1 else np.array([0.5])
    return [tuple(min(s - 1, int(f * s)) for s in valid_size) for f in fractions]

def plot_similarity(
    pos: Tensor,
    queries: Sequence[Sequence[int]] | None = None,
    *,
    mask: Tensor | None = None,
    title: str | None = None,
    spacing: Sequence[float] | None = None,
):
    """Cosine-similarity maps of chosen query cells to every cell of one item's encoding.

    2D: one panel per query. 3D: one row per query with the sagittal, coronal and axial slices
    through it (the last two axes of each plane run right and up, as in
    :func:`plot_volume_level_similarity`). The query is a white star; padding (``mask``) is
    hatched grey. With ``spacing`` every panel is drawn to scale in millimetres (a cell is
    ``spacing[i]`` wide along axis ``i``), so a blob that is round in millimetres looks round.

    Args:
        pos (Tensor[C, H, W] or Tensor[C, D, H, W]): one item's encoding, channels-first.
        queries (sequence of sequence of int, optional): query cells (one index per spatial
            axis). Default: 3 cells along the valid region's diagonal (:func:`query_cells`).
        mask (Tensor[*S], bool, optional): True marks padding.
        title (str, optional): the figure's title.
        spacing (sequence of float, optional): the cell size along each spatial axis (mm), in
            tensor axis order. Default: square cells.

    Returns:
        matplotlib.figure.Figure: ``len(queries)`` axes (2D) or ``3 * len(queries)`` (3D), plus
            a colorbar.

    Raises:
        TypeError: ``pos`` is not a floating tensor; ``mask`` is not a bool tensor; ``spacing``
            does not hold numbers.
        ValueError: ``pos`` is not 2D or 3D; ``mask`` of another shape; a query outside the grid;
            ``spacing`` not one positive number per spatial axis.

    References:
        Carion et al., DETR (ECCV 2020), figure of position-embedding similarities.
    """
    pos = check_pos(pos, "pos", (2, 3))
    spatial = tuple(pos.shape[1:])
    lmask = None
    if mask is not None:
        check_mask(mask)
        if tuple(mask.shape) != spatial:
            raise ValueError(f"mask must have the spatial shape {spatial}, got {tuple(mask.shape)}")
        lmask = mask.cpu()
    if queries is None:
        queries = query_cells(valid_size(lmask, spatial), 3)
    queries = [tuple(int(v) for v in q) for q in queries]
    if not queries:
        raise ValueError("queries must hold at least one cell")
    cell = [1.0] * len(spatial)
    if spacing is not None:
        try:
            cell = [float(v) for v in (spacing.tolist() if isinstance(spacing, Tensor) else spacing)]
        except (TypeError, ValueError):
            raise TypeError(f"spacing must be a sequence of {len(spatial)} numbers (mm), got {describe(spacing)}") from None
        if len(cell) != len(spatial) or not all(np.isfinite(v) and v > 0 for v in cell):
            raise ValueError(f"spacing must hold {len(spatial)} positive numbers (mm), got {describe(spacing)}")
    sims = [cosine_similarity_map(pos, q).numpy() for q in queries]
    m = None if lmask is None else lmask.numpy()
    vmin = similarity_floor(sims, [m] * len(sims))
    n = len(queries)
    im = None
    if len(spatial) == 2:
        cols = min(n, 4)
        rows = -(-n // cols)
        aspect = spatial[1] * cell[1] / (spatial[0] * cell[0])
        fig = new_figure(min(3.0 * aspect, 4.5) * cols + 1.0, 3.0 * rows + 0.5)
        axes = fig.subplots(rows, cols, squeeze=False).ravel()
        for ax, q, sim in zip(axes, queries, sims):
            im = ax.imshow(sim, cmap="viridis", vmin=vmin, vmax=1, interpolation="nearest")
            shade_padding(ax, m)
            ax.set_aspect(cell[0] / cell[1])  # to scale: a cell is cell[1] wide, cell[0] high
            mark_query(ax, q[1], q[0], 11)
            ax.set_title(f"query {q}", fontsize=9)
        no_ticks(axes)
        for ax in axes[n:]:
            fig.delaxes(ax)
        used = axes[:n].tolist()
    else:
        fig = new_figure(8.4, 2.6 * n + 0.6)
        axes = fig.subplots(n, 3, squeeze=False)
        for r, (q, sim) in enumerate(zip(queries, sims)):
            for axis in range(3):
                ax = axes[r, axis]
                h, v = plane_axes(axis)
                im = ax.imshow(slice_plane(sim, axis, q[axis]), cmap="viridis", vmin=vmin, vmax=1,
                               origin="lower", interpolation="nearest")
                if m is not None:
                    shade_padding(ax, slice_plane(m, axis, q[axis]), origin="lower")
                ax.set_aspect(cell[v] / cell[h])
                mark_query(ax, q[h], q[v], 10)
                ax.set_title(f"query {q}, {PLANES[axis]}" if axis == 0 else PLANES[axis], fontsize=9)
        no_ticks(axes)
        used = axes.ravel().tolist()
    fig.colorbar(im, ax=used, shrink=0.8, label="cosine similarity")
    legend = f"; {PADDING_LEGEND}" if m is not None and m.any() else ""
    fig.suptitle(title or f"cosine similarity to query cells ({'x'.join(map(str, spatial))} grid{legend})", fontsize=10)
    return fig


def _check_levels(batch: NestedTensor, levels: Sequence[NestedTensor], pos: Sequence[Tensor], n: int, what: str):
    if not isinstance(batch, NestedTensor):
        raise TypeError(f"batch must be a NestedTensor, got {type(batch).__name__}")
    if len(levels) != len(pos):
        raise ValueError(f"levels ({len(levels)}) and pos ({len(pos)}) must have the same length")
    if batch.num_axes != n:
        raise ValueError(f"{what} draws {n}D batches, got {batch.num_axes} spatial axes")


@_deprecation.renamed_kwargs(normalized="imagenet_normalized")
def plot_level_similarity(
    batch: NestedTensor,
    levels: Sequence[NestedTensor],
    pos: Sequence[Tensor],
    *,
    names: Sequence[str] | None = None,
    strides: Sequence[int] | None = None,
    n_queries: int = 3,
    imagenet_normalized: bool = True,
):
    """A 2D batch through its feature levels: each image with its padding shaded, then for every
    level the cosine similarity of the position embedding at ``n_queries`` query cells to every
    other cell.

    One row per image and level (the image, or the level's mask, then the ``n_queries`` maps), so
    the figure grows downwards with the number of levels instead of sideways. Padding is hatched
    grey in every panel; the query cell is a white star.

    Args:
        batch (NestedTensor[B, 3, H, W]): the input batch.
        levels (sequence of NestedTensor): the backbone levels (for their masks).
        pos (sequence of Tensor[B, C, H_l, W_l]): the position embedding of each level.
        names (sequence of str, optional): a title per image.
        strides (sequence of int, optional): a label per level.
        n_queries (int): query cells per level and image.
        imagenet_normalized (bool): ``batch`` is ImageNet-normalised (undo it for display).

    Returns:
        matplotlib.figure.Figure: ``B * max(1, len(levels))`` rows of ``1 + n_queries`` axes,
            plus a colorbar. Never shown; :func:`vispos.app.png.save_figure` writes it.

    Raises:
        TypeError: ``batch`` is not a :class:`~vispos.NestedTensor`.
        ValueError: ``levels`` and ``pos`` differ in length; a batch that is not 2D.

    References:
        Carion et al., DETR (ECCV 2020), figure of position-embedding similarities.
    """
    _check_levels(batch, levels, pos, 2, "plot_level_similarity")
    b = len(batch)
    n_levels = max(1, len(levels))
    cols = 1 + n_queries
    # one row per (image, level): the width stays 1 + n_queries panels whatever the number of levels
    fig = new_figure(2.6 * cols + 0.8, 2.3 * b * n_levels + 0.4)
    axes = fig.subplots(b * n_levels, cols, squeeze=False)
    images = display_images(batch.tensors, imagenet_normalized)
    mask = None if batch.mask is None else batch.mask.cpu()
    panels = {}
    for i in range(b):
        for lvl, (level, p) in enumerate(zip(levels, pos)):
            lmask = None if level.mask is None else level.mask[i].cpu()
            pi = p[i].detach().cpu()
            for qn, q in enumerate(query_cells(valid_size(lmask, p.shape[2:]), n_queries)):
                panels[i, lvl, qn] = (q, cosine_similarity_map(pi, q).numpy(), None if lmask is None else lmask.numpy())
    # one colour range for all panels, stretched to the valid cells' similarities
    vmin = similarity_floor([v[1] for v in panels.values()], [v[2] for v in panels.values()])
    last_im = None
    for i in range(b):
        title = names[i] if names is not None else f"image {i}"
        h, w = batch.image_sizes[i]
        for lvl in range(n_levels):
            row = i * n_levels + lvl
            ax = axes[row, 0]
            if lvl == 0:
                ax.imshow(images[i].permute(1, 2, 0).numpy())
                shade_padding(ax, None if mask is None else mask[i])
                ax.set_title(f"{title} {h}x{w}", fontsize=9)
                ax.set_axis_off()
            elif levels[lvl].mask is not None:
                draw_mask(ax, levels[lvl].mask[i])
                ax.set_title("level mask", fontsize=8)
                no_ticks(ax)  # keep the frame: white valid cells would vanish into the background
            else:
                ax.set_axis_off()
            if lvl >= len(levels):
                continue
            stride = f"stride {strides[lvl]}" if strides is not None else f"level {lvl}"
            for qn in range(n_queries):
                q, sim, lmask = panels[i, lvl, qn]
                ax = axes[row, 1 + qn]
                last_im = ax.imshow(sim, cmap="viridis", vmin=vmin, vmax=1, interpolation="nearest")
                shade_padding(ax, lmask)
                mark_query(ax, q[1], q[0])
                ax.set_title(f"{stride}, query {q}", fontsize=9)
                ax.set_axis_off()
    if last_im is not None:
        fig.colorbar(last_im, ax=axes[:, 1:].ravel().tolist(), shrink=0.6, label="cosine similarity")
    fig.suptitle(f"Position embedding: cosine similarity to query cells ({PADDING_LEGEND})", fontsize=10)
    return fig


_VOLUMES_PER_ROW = 3


def plot_volume_level_similarity(
    batch: NestedTensor,
    levels: Sequence[NestedTensor],
    pos: Sequence[Tensor],
    *,
    names: Sequence[str] | None = None,
    strides: Sequence[object] | None = None,
):
    """A batch of volumes through its feature levels: orthogonal slices of each volume with its
    padding shaded, then, for every level, the cosine similarity of the 3D position embedding at
    the centre of the item's valid region to every other cell, shown on the three slices through
    that query cell (padding hatched grey, the query a white star).

    One block per volume (at most three blocks side by side, then the next row of blocks):
    its first row shows the input's sagittal, coronal and axial slices, each further row one
    level's similarity on the same three planes, so every panel keeps a readable size whatever
    the number of levels. Slices are drawn with the last two axes of the plane running right and
    up (RAS+ volumes from :func:`vispos.app.data.load_volume` appear in radiological planes:
    sagittal ``(A, S)``, coronal ``(R, S)``, axial ``(R, A)``).

    Args:
        batch (NestedTensor[B, C, D, H, W]): the input volumes (channel 0 is drawn).
        levels (sequence of NestedTensor[B, C_l, D_l, H_l, W_l]): the levels (for their masks).
        pos (sequence of Tensor[B, C_pos, D_l, H_l, W_l]): each level's position embedding.
        names (sequence of str, optional): a title per volume.
        strides (sequence, optional): a label per level (int or per-axis tuple).

    Returns:
        matplotlib.figure.Figure: one sub-figure of ``(1 + len(levels)) x 3`` axes per volume,
            plus a colorbar. Never shown; :func:`vispos.app.png.save_figure` writes it.

    Raises:
        TypeError: ``batch`` is not a :class:`~vispos.NestedTensor`.
        ValueError: ``levels`` and ``pos`` differ in length; the batch is not 3D.

    References:
        Carion et al., DETR (ECCV 2020), position-embedding similarity figure, here in 3D.
    """
    _check_levels(batch, levels, pos, 3, "plot_volume_level_similarity")
    b = len(batch)
    n_rows = 1 + len(levels)
    per_row = min(b, _VOLUMES_PER_ROW)
    block_rows = -(-b // per_row)
    fig = new_figure(5.4 * per_row + 0.9, (1.75 * n_rows + 0.45) * block_rows + 0.5)
    grid = fig.subfigures(block_rows, per_row + 1, squeeze=False, width_ratios=[1.0] * per_row + [0.2])
    subfigs = grid[:, :per_row].ravel()
    vols = batch.tensors.detach().float().cpu()[:, 0].numpy()
    mask = None if batch.mask is None else batch.mask.cpu().numpy()
    sims = {}
    for i in range(b):
        for lvl, (level, p) in enumerate(zip(levels, pos)):
            lmask = None if level.mask is None else level.mask[i].cpu()
            q = tuple(s // 2 for s in valid_size(lmask, p.shape[2:]))
            sims[i, lvl] = (q, cosine_similarity_map(p[i].detach().cpu(), q).numpy(),
                            None if lmask is None else lmask.numpy())
    # one colour range for every panel, stretched to the valid cells' similarities
    vmin = similarity_floor([s for _, s, _ in sims.values()], [m for _, _, m in sims.values()])
    last_im = None
    for i in range(b):
        sub = subfigs[i]
        axes = sub.subplots(n_rows, 3, squeeze=False)
        size = batch.image_sizes[i]
        title = names[i] if names is not None else f"volume {i}"
        sub.suptitle(f"{title} ({'x'.join(map(str, size))})", fontsize=10)
        valid = vols[i][tuple(slice(0, s) for s in size)]
        lo, hi = (np.percentile(valid, [1, 99]) if valid.size else (0.0, 1.0))
        centre = tuple(s // 2 for s in size)
        for axis in range(3):
            ax = axes[0, axis]
            ax.imshow(slice_plane(vols[i], axis, centre[axis]), cmap="gray", vmin=lo, vmax=hi,
                      origin="lower", interpolation="nearest")
            if mask is not None:
                shade_padding(ax, slice_plane(mask[i], axis, centre[axis]), origin="lower")
            ax.set_title(PLANES[axis], fontsize=9)
        axes[0, 0].set_ylabel("input", fontsize=9)
        for lvl in range(len(levels)):
            q, sim, lmask = sims[i, lvl]
            for axis in range(3):
                ax = axes[lvl + 1, axis]
                last_im = ax.imshow(slice_plane(sim, axis, q[axis]), cmap="viridis", vmin=vmin, vmax=1,
                                    origin="lower", interpolation="nearest")
                if lmask is not None:
                    shade_padding(ax, slice_plane(lmask, axis, q[axis]), origin="lower")
                h, v = plane_axes(axis)
                mark_query(ax, q[h], q[v])
            label = f"stride {strides[lvl]}" if strides is not None else f"level {lvl}"
            axes[lvl + 1, 0].set_ylabel(f"{label}\nq={q}", fontsize=8)
        no_ticks(axes)
    for sub in subfigs[b:]:
        sub.set_visible(False)
    for sub in grid[1:, per_row]:
        sub.set_visible(False)
    if last_im is not None:
        bar = grid[0, per_row]
        cax = bar.add_axes((0.08, 0.15, 0.22, 0.7))
        bar.colorbar(last_im, cax=cax, label="cosine similarity")
    else:
        grid[0, per_row].set_visible(False)
    fig.suptitle("3D position embedding: cosine similarity to the centre cell of each level, on slices "
                 f"through it ({PADDING_LEGEND})", fontsize=10)
    return fig
