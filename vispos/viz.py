"""Figures: padded batches and the similarity structure of position embeddings.

Images, and volumes as orthogonal slices. Drawn with matplotlib's object API on an Agg canvas,
so importing vispos never changes the global backend.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from ._io import write_files
from .data import IMAGENET_MEAN, IMAGENET_STD
from .nested_tensor import NestedTensor

__all__ = ["cosine_similarity_map", "query_cells", "plot_position_similarity", "plot_volume_similarity"]


def cosine_similarity_map(pos: Tensor, query: Sequence[int]) -> Tensor:
    """Cosine similarity of the embedding at one cell to the embedding at every cell.

    Args:
        pos (Tensor[C, *S]): one item's position embedding, channels-first.
        query (sequence of int): the query cell's index along each spatial axis.

    Returns:
        Tensor[*S], float32 in [-1, 1].

    Raises:
        ValueError: ``query`` has the wrong length or lies outside ``S``.

    References:
        Carion et al., DETR (ECCV 2020), figure of position-embedding similarities.
    """
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
        ValueError: ``n < 1``.

    References:
        Carion et al., DETR (ECCV 2020): the similarity figure picks a few query cells.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    fractions = np.linspace(0.2, 0.8, n) if n > 1 else np.array([0.5])
    return [tuple(min(s - 1, int(f * s)) for s in valid_size) for f in fractions]


def _valid_size(mask: Tensor | None, shape: Sequence[int]) -> tuple[int, ...]:
    if mask is None:
        return tuple(shape)
    return NestedTensor(torch.zeros(1, 1, *mask.shape, device=mask.device), mask[None]).image_sizes[0]


def _save_atomic(fig, path: str | os.PathLike, dpi: int) -> None:
    write_files([(path, lambda tmp: fig.savefig(tmp, dpi=dpi, format="png"))])


def plot_position_similarity(
    batch: NestedTensor,
    levels: Sequence[NestedTensor],
    pos: Sequence[Tensor],
    path: str | os.PathLike,
    *,
    names: Sequence[str] | None = None,
    strides: Sequence[int] | None = None,
    n_queries: int = 3,
    normalized: bool = True,
    dpi: int = 90,
) -> str:
    """Writes one PNG: each image with its padding shaded, then for every level the cosine
    similarity of the position embedding at ``n_queries`` query cells to every other cell.

    One row per image. Padding is hatched grey in every panel; the query cell is a white star.

    Args:
        batch (NestedTensor[B, 3, H, W]): the input batch.
        levels (sequence of NestedTensor): the backbone levels (for their masks).
        pos (sequence of Tensor[B, C, H_l, W_l]): the position embedding of each level.
        path (str | PathLike): the PNG to write (written to a temporary file, then renamed).
        names (sequence of str, optional): a title per image.
        strides (sequence of int, optional): a label per level.
        n_queries (int): query cells per level and image.
        normalized (bool): ``batch`` is ImageNet-normalised (undo it for display).
        dpi (int): resolution of the PNG.

    Returns:
        str: ``path``.

    Raises:
        ValueError: ``levels`` and ``pos`` differ in length; a 3D batch (not drawable here).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if len(levels) != len(pos):
        raise ValueError(f"levels ({len(levels)}) and pos ({len(pos)}) must have the same length")
    if batch.n_spatial != 2:
        raise ValueError(f"plot_position_similarity draws 2D batches, got {batch.n_spatial} spatial axes")
    b = len(batch)
    cols = 1 + len(levels) * n_queries
    fig = Figure(figsize=(2.6 * cols, 2.3 * b), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(b, cols, squeeze=False)
    images = batch.tensors.detach().float().cpu()
    if normalized:
        mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
        std = torch.tensor(IMAGENET_STD).view(3, 1, 1)
        images = images * std + mean
    images = images.clamp(0, 1)
    mask = None if batch.mask is None else batch.mask.cpu()
    grey = np.array([0.5, 0.5, 0.5, 0.6])
    panels = {}
    for i in range(b):
        for lvl, (level, p) in enumerate(zip(levels, pos)):
            lmask = None if level.mask is None else level.mask[i].cpu()
            valid = _valid_size(lmask, p.shape[2:])
            pi = p[i].detach().cpu()
            for qn, q in enumerate(query_cells(valid, n_queries)):
                sim = cosine_similarity_map(pi, q)
                keep = sim if lmask is None else sim[~lmask]
                panels[i, lvl, qn] = (q, sim.numpy(), lmask, float(keep.min()) if keep.numel() else 1.0)
    # one colour range for all panels, stretched to the valid cells' similarities
    vmin = min([v[3] for v in panels.values()] + [0.99])
    last_im = None
    for i in range(b):
        ax = axes[i, 0]
        ax.imshow(images[i].permute(1, 2, 0).numpy())
        if mask is not None:
            overlay = np.zeros((*mask.shape[1:], 4))
            overlay[mask[i].numpy()] = grey
            ax.imshow(overlay)
        title = names[i] if names is not None else f"image {i}"
        h, w = batch.image_sizes[i]
        ax.set_title(f"{title} {h}x{w}\n(padding shaded)", fontsize=8)
        ax.set_axis_off()
        for lvl in range(len(levels)):
            for qn in range(n_queries):
                q, sim, lmask, _ = panels[i, lvl, qn]
                ax = axes[i, 1 + lvl * n_queries + qn]
                last_im = ax.imshow(sim, cmap="viridis", vmin=vmin, vmax=1, interpolation="nearest")
                if lmask is not None and bool(lmask.any()):
                    ax.contourf(
                        lmask.numpy().astype(float), levels=[0.5, 1.5], colors="none",
                        hatches=["////"],
                    )
                    overlay = np.zeros((*lmask.shape, 4))
                    overlay[lmask.numpy()] = grey
                    ax.imshow(overlay, interpolation="nearest")
                ax.plot([q[1]], [q[0]], marker="*", color="white", markersize=9, markeredgecolor="black")
                stride = f"stride {strides[lvl]}" if strides is not None else f"level {lvl}"
                ax.set_title(f"{stride}, query {q}", fontsize=8)
                ax.set_axis_off()
    if last_im is not None:
        fig.colorbar(last_im, ax=axes[:, 1:].ravel().tolist(), shrink=0.6, label="cosine similarity")
    fig.suptitle("Position embedding: cosine similarity to query cells (grey = padding)", fontsize=10)
    _save_atomic(fig, path, dpi)
    return os.fspath(path)


def _plane_axes(axis: int) -> tuple[int, int]:
    """The two in-plane axes (horizontal, vertical) of the slice that fixes ``axis``."""
    i, j = [a for a in range(3) if a != axis]
    return i, j


def _slice(arr: np.ndarray, axis: int, index: int) -> np.ndarray:
    """A 2-D slice of a 3-D array, transposed for ``imshow(origin='lower')``: the higher axis
    runs up (superior / anterior up for RAS+ volumes)."""
    return np.take(arr, index, axis=axis).T


_PLANES = ("sagittal", "coronal", "axial")


def plot_volume_similarity(
    batch: NestedTensor,
    levels: Sequence[NestedTensor],
    pos: Sequence[Tensor],
    path: str | os.PathLike,
    *,
    names: Sequence[str] | None = None,
    strides: Sequence[object] | None = None,
    dpi: int = 80,
) -> str:
    """Writes one PNG for a batch of volumes: orthogonal slices of each volume with its padding
    shaded, then, for every level, the cosine similarity of the 3D position embedding at the
    centre of the item's valid region to every other cell, shown on the three slices through
    that query cell (padding hatched grey, the query a white star).

    One row per volume, ``3 * (1 + len(levels))`` panels. Slices are drawn with the last two
    axes of the plane running right and up (RAS+ volumes from :func:`vispos.data.load_volume`
    appear in radiological planes: sagittal ``(A, S)``, coronal ``(R, S)``, axial ``(R, A)``).

    Args:
        batch (NestedTensor[B, C, D, H, W]): the input volumes (channel 0 is drawn).
        levels (sequence of NestedTensor[B, C_l, D_l, H_l, W_l]): the levels (for their masks).
        pos (sequence of Tensor[B, C_pos, D_l, H_l, W_l]): each level's position embedding.
        path (str | PathLike): the PNG (written to a temporary file, then renamed).
        names (sequence of str, optional): a title per volume.
        strides (sequence, optional): a label per level (int or per-axis tuple).
        dpi (int): resolution.

    Returns:
        str: ``path``.

    Raises:
        ValueError: ``levels`` and ``pos`` differ in length; the batch is not 3D.

    References:
        Carion et al., DETR (ECCV 2020), position-embedding similarity figure, here in 3D.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if len(levels) != len(pos):
        raise ValueError(f"levels ({len(levels)}) and pos ({len(pos)}) must have the same length")
    if batch.n_spatial != 3:
        raise ValueError(f"plot_volume_similarity draws 3D batches, got {batch.n_spatial} spatial axes")
    b = len(batch)
    cols = 3 * (1 + len(levels))
    fig = Figure(figsize=(1.9 * cols, 2.1 * b + 0.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(b, cols, squeeze=False)
    vols = batch.tensors.detach().float().cpu()[:, 0].numpy()
    mask = None if batch.mask is None else batch.mask.cpu().numpy()
    grey = np.array([0.5, 0.5, 0.5, 0.65])
    sims = {}
    for i in range(b):
        for lvl, (level, p) in enumerate(zip(levels, pos)):
            lmask = None if level.mask is None else level.mask[i].cpu()
            q = tuple(s // 2 for s in _valid_size(lmask, p.shape[2:]))
            sims[i, lvl] = (q, cosine_similarity_map(p[i].detach().cpu(), q).numpy(), lmask)
    # one colour range for every panel, stretched to the valid cells' similarities
    vmin = min([0.99] + [
        float(sim[~lm.numpy()].min() if lm is not None else sim.min())
        for _, sim, lm in sims.values() if lm is None or bool((~lm).any())
    ])
    last_im = None
    for i in range(b):
        size = batch.image_sizes[i]
        valid = vols[i][tuple(slice(0, s) for s in size)]
        lo, hi = (np.percentile(valid, [1, 99]) if valid.size else (0.0, 1.0))
        centre = tuple(s // 2 for s in size)
        for axis in range(3):
            ax = axes[i, axis]
            ax.imshow(_slice(vols[i], axis, centre[axis]), cmap="gray", vmin=lo, vmax=hi,
                      origin="lower", interpolation="nearest")
            if mask is not None:
                m = _slice(mask[i], axis, centre[axis])
                overlay = np.zeros((*m.shape, 4))
                overlay[m] = grey
                ax.imshow(overlay, origin="lower", interpolation="nearest")
            title = (names[i] if names is not None else f"volume {i}") if axis == 0 else ""
            ax.set_title(f"{title} {'x'.join(map(str, size))}\n{_PLANES[axis]}" if axis == 0 else _PLANES[axis],
                         fontsize=7)
            ax.set_axis_off()
        for lvl in range(len(levels)):
            q, sim, lmask = sims[i, lvl]
            for axis in range(3):
                ax = axes[i, 3 * (lvl + 1) + axis]
                last_im = ax.imshow(_slice(sim, axis, q[axis]), cmap="viridis", vmin=vmin, vmax=1,
                                    origin="lower", interpolation="nearest")
                if lmask is not None:
                    m = _slice(lmask.numpy(), axis, q[axis])
                    if m.any():
                        overlay = np.zeros((*m.shape, 4))
                        overlay[m] = grey
                        ax.imshow(overlay, origin="lower", interpolation="nearest")
                        ax.contourf(m.astype(float), levels=[0.5, 1.5], colors="none", hatches=["////"],
                                    origin="lower")
                h, v = _plane_axes(axis)
                ax.plot([q[h]], [q[v]], marker="*", color="white", markersize=8, markeredgecolor="black")
                label = f"stride {strides[lvl]}" if strides is not None else f"level {lvl}"
                ax.set_title(f"{label}, q={q}\n{_PLANES[axis]}" if axis == 0 else _PLANES[axis], fontsize=7)
                ax.set_axis_off()
    if last_im is not None:
        fig.colorbar(last_im, ax=axes[:, 3:].ravel().tolist(), shrink=0.6, label="cosine similarity")
    fig.suptitle("3D position embedding: cosine similarity to the centre cell, on slices through it "
                 "(grey = padding)", fontsize=9)
    _save_atomic(fig, path, dpi)
    return os.fspath(path)
