"""Figures: padded batches and the similarity structure of position embeddings.

Images, and volumes as orthogonal slices. Drawn with matplotlib's object API on an Agg canvas,
so importing vispos never changes the global backend.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from ._io import write_files
from .data import IMAGENET_MEAN, IMAGENET_STD
from .nested_tensor import NestedTensor
from .padding import check_mask, mask_sizes

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
    return mask_sizes(mask[None])[0]


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

    One row per image and level (the image, or the level's mask, then the ``n_queries`` maps), so
    the figure grows downwards with the number of levels instead of sideways. Padding is hatched
    grey in every panel; the query cell is a white star.

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
    n_levels = max(1, len(levels))
    cols = 1 + n_queries
    # one row per (image, level): the width stays 1 + n_queries panels whatever the number of levels
    fig = Figure(figsize=(2.6 * cols + 0.8, 2.3 * b * n_levels + 0.4), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(b * n_levels, cols, squeeze=False)
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
        title = names[i] if names is not None else f"image {i}"
        h, w = batch.image_sizes[i]
        for lvl in range(n_levels):
            row = i * n_levels + lvl
            ax = axes[row, 0]
            if lvl == 0:
                ax.imshow(images[i].permute(1, 2, 0).numpy())
                if mask is not None:
                    overlay = np.zeros((*mask.shape[1:], 4))
                    overlay[mask[i].numpy()] = grey
                    ax.imshow(overlay)
                ax.set_title(f"{title} {h}x{w}\n(padding shaded)", fontsize=9)
            elif levels[lvl].mask is not None:
                ax.imshow(levels[lvl].mask[i].cpu().numpy(), cmap="gray", vmin=0, vmax=1, interpolation="nearest")
                ax.set_title("level mask (white = padding)", fontsize=8)
                ax.set_xticks([])  # keep the frame: white padding would vanish into the background
                ax.set_yticks([])
            if lvl == 0 or levels[lvl].mask is None:
                ax.set_axis_off()
            if lvl >= len(levels):
                continue
            stride = f"stride {strides[lvl]}" if strides is not None else f"level {lvl}"
            for qn in range(n_queries):
                q, sim, lmask, _ = panels[i, lvl, qn]
                ax = axes[row, 1 + qn]
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
                ax.set_title(f"{stride}, query {q}", fontsize=9)
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


def _shade(ax, mask: np.ndarray, rgba) -> None:
    """Overlays ``rgba`` on the cells where ``mask`` (bool, ``[rows, cols]``) is True."""
    overlay = np.zeros((*mask.shape, 4))
    overlay[mask] = rgba
    ax.imshow(overlay, origin="lower", interpolation="nearest")


def _slice(arr: np.ndarray, axis: int, index: int) -> np.ndarray:
    """A 2-D slice of a 3-D array, transposed for ``imshow(origin='lower')``: the higher axis
    runs up (superior / anterior up for RAS+ volumes)."""
    return np.take(arr, index, axis=axis).T


_PLANES = ("sagittal", "coronal", "axial")
_VOLUMES_PER_ROW = 3


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

    One block per volume (at most three blocks side by side, then the next row of blocks):
    its first row shows the input's sagittal, coronal and axial slices, each further row one
    level's similarity on the same three planes, so every panel keeps a readable size whatever
    the number of levels. Slices are drawn with the last two
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
    n_rows = 1 + len(levels)
    per_row = min(b, _VOLUMES_PER_ROW)
    block_rows = -(-b // per_row)
    fig = Figure(figsize=(5.4 * per_row + 0.9, (1.75 * n_rows + 0.45) * block_rows + 0.5), layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.subfigures(block_rows, per_row + 1, squeeze=False, width_ratios=[1.0] * per_row + [0.2])
    subfigs = grid[:, :per_row].ravel()
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
            ax.imshow(_slice(vols[i], axis, centre[axis]), cmap="gray", vmin=lo, vmax=hi,
                      origin="lower", interpolation="nearest")
            if mask is not None:
                m = _slice(mask[i], axis, centre[axis])
                _shade(ax, m, grey)
            ax.set_title(_PLANES[axis], fontsize=9)
        axes[0, 0].set_ylabel("input", fontsize=9)
        for lvl in range(len(levels)):
            q, sim, lmask = sims[i, lvl]
            for axis in range(3):
                ax = axes[lvl + 1, axis]
                last_im = ax.imshow(_slice(sim, axis, q[axis]), cmap="viridis", vmin=vmin, vmax=1,
                                    origin="lower", interpolation="nearest")
                if lmask is not None:
                    m = _slice(lmask.numpy(), axis, q[axis])
                    if m.any():
                        _shade(ax, m, grey)
                        ax.contourf(m.astype(float), levels=[0.5, 1.5], colors="none", hatches=["////"],
                                    origin="lower")
                h, v = _plane_axes(axis)
                ax.plot([q[h]], [q[v]], marker="*", color="white", markersize=9, markeredgecolor="black")
            label = f"stride {strides[lvl]}" if strides is not None else f"level {lvl}"
            axes[lvl + 1, 0].set_ylabel(f"{label}\nq={q}", fontsize=8)
        for ax in axes.ravel():
            ax.set_xticks([])
            ax.set_yticks([])
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
                 "through it (grey = padding)", fontsize=10)
    _save_atomic(fig, path, dpi)
    return os.fspath(path)


# ------------------------------------------------------------------------------------------------
# Figures of encodings themselves (issue 15): each returns a matplotlib Figure and never shows it.
# ------------------------------------------------------------------------------------------------

__all__ += [
    "encode_grid",
    "channel_wavelengths",
    "plot_channels",
    "plot_sincos_curves",
    "plot_wavelengths",
    "plot_similarity",
    "plot_padded_batch",
    "plot_normalized_coords",
    "plot_rotary_invariance",
]


def _figure(width: float, height: float):
    """A Figure on its own Agg canvas (never pyplot, so no global state and no window)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _check_shape(shape: object, name: str = "shape", ranks: Sequence[int] = (1, 2, 3)) -> tuple[int, ...]:
    if isinstance(shape, int) and not isinstance(shape, bool):
        shape = (shape,)
    if not isinstance(shape, Sequence) or isinstance(shape, str):
        raise TypeError(f"{name} must be a sequence of ints, got {shape!r} ({type(shape).__name__})")
    if any(isinstance(s, bool) or not isinstance(s, int) for s in shape):
        raise TypeError(f"{name} must hold ints, got {shape!r}")
    if len(shape) not in ranks or any(s < 1 for s in shape):
        raise ValueError(f"{name} must have {' or '.join(map(str, ranks))} axes, each >= 1, got {tuple(shape)}")
    return tuple(shape)


def _check_pos(pos: object, name: str, ranks: Sequence[int]) -> Tensor:
    """``pos`` as a detached float32 CPU tensor ``(C, *S)`` with ``len(S)`` in ``ranks``."""
    if not isinstance(pos, Tensor):
        raise TypeError(f"{name} must be a Tensor[C, *S], got {type(pos).__name__}")
    if not (pos.is_floating_point()) or pos.dim() - 1 not in ranks:
        raise ValueError(
            f"{name} must be a floating Tensor[C, *S] with {' or '.join(map(str, ranks))} spatial "
            f"axes, got {pos.dtype} of shape {tuple(pos.shape)}"
        )
    return pos.detach().to("cpu", torch.float32)


def _check_channels(channels: object, total: int, name: str = "channels") -> list[int]:
    if isinstance(channels, int) and not isinstance(channels, bool):
        channels = [channels]
    if not isinstance(channels, Sequence) or isinstance(channels, str) or len(channels) == 0:
        raise TypeError(f"{name} must be a non-empty sequence of ints, got {channels!r}")
    out = []
    for c in channels:
        if isinstance(c, bool) or not isinstance(c, int):
            raise TypeError(f"{name} must hold ints, got {channels!r}")
        if not 0 <= c < total:
            raise ValueError(f"{name} must index the {total} channels (0 .. {total - 1}), got {c}")
        out.append(c)
    return out


def encode_grid(encoder: torch.nn.Module, shape: Sequence[int], mask: Tensor | None = None) -> Tensor:
    """Evaluates a vispos encoder on one item of spatial shape ``S`` and returns it channels-first.

    Dispatches on the encoder's family: mask-driven DETR-family modules
    (:class:`~vispos.PositionEmbeddingSine` and its subclasses,
    :class:`~vispos.PositionEmbeddingLearned`) get a bool mask ``(1, *S)``; the
    ``positional-encodings`` grid classes get a zero tensor in their layout; the 1D sequence
    encoders (:class:`~vispos.SinusoidalPositionalEncoding`,
    :class:`~vispos.LearnableSinusoidalPositionalEncoding`,
    :class:`~vispos.SpeechainPositionalEncoding`) get a zero sequence, so the result is
    the added encoding itself (plus any LayerNorm bias).

    Args:
        encoder (nn.Module): one of the encoders named above.
        shape (sequence of int): ``S``, 1 to 3 positive sizes (1 for sequence encoders).
        mask (Tensor[*S], bool, optional): True marks padding; only for mask-driven encoders.

    Returns:
        Tensor[C, *S]: float32 on the CPU, channels-first whatever the encoder's layout.

    Raises:
        TypeError: an encoder of another kind; a non-bool ``mask``; a ``mask`` for an encoder
            that takes none.
        ValueError: a bad ``shape``, or one the encoder does not support; a ``mask`` whose shape
            is not ``S``.

    References:
        Carion et al., DETR (ECCV 2020); positional-encodings (tatp22); Vaswani et al. 2017.
    """
    from .encodings import (
        LearnableSinusoidalPositionalEncoding,
        PositionEmbeddingLearned,
        PositionEmbeddingSine,
        SinusoidalPositionalEncoding,
        SpeechainPositionalEncoding,
    )
    from .encodings.grid import _GridEncoding

    shape = _check_shape(shape)
    if mask is not None:
        check_mask(mask)
        if tuple(mask.shape) != shape:
            raise ValueError(f"mask must have shape {shape}, got {tuple(mask.shape)}")
    with torch.no_grad():
        if isinstance(encoder, (PositionEmbeddingSine, PositionEmbeddingLearned)):
            m = torch.zeros(1, *shape, dtype=torch.bool) if mask is None else mask.cpu()[None]
            return encoder(m)[0].float().contiguous()
        if mask is not None:
            raise TypeError(f"{type(encoder).__name__} takes no mask; pass mask=None")
        if isinstance(encoder, _GridEncoding):
            if len(shape) != encoder.n_spatial:
                raise ValueError(
                    f"{type(encoder).__name__} encodes {encoder.n_spatial} spatial axes, got shape {shape}"
                )
            if encoder._channels_first:
                return encoder(torch.zeros(1, encoder.org_channels, *shape))[0].float().contiguous()
            return encoder(torch.zeros(1, *shape, encoder.org_channels))[0].movedim(-1, 0).float().contiguous()
        if isinstance(
            encoder, (SinusoidalPositionalEncoding, LearnableSinusoidalPositionalEncoding, SpeechainPositionalEncoding)
        ):
            if len(shape) != 1:
                raise ValueError(f"{type(encoder).__name__} encodes sequences (1 axis), got shape {shape}")
            x = torch.zeros(1, shape[0], encoder.d_model)
            if not encoder.batch_first:
                x = x.transpose(0, 1)
            was_training = encoder.training
            encoder.eval()  # no dropout on a figure; restored below
            try:
                out = encoder(x)
            finally:
                encoder.train(was_training)
            out = out if encoder.batch_first else out.transpose(0, 1)
            return out[0].T.float().contiguous()
    raise TypeError(
        f"encoder must be a vispos spatial or sequence encoder (PositionEmbeddingSine, "
        f"PositionEmbeddingLearned, PositionalEncoding*D, SinusoidalPositionalEncoding, ...), "
        f"got {type(encoder).__name__}"
    )


def channel_wavelengths(encoder: torch.nn.Module, length: int) -> Tensor | None:
    """The wavelength, in cells, of every channel of one axis block of a fixed sine encoder.

    A channel ``sin(p w_k)`` repeats every ``2 pi / w_k`` units of ``p``. Positions are cells
    (``1, 2, ...`` for DETR, ``0, 1, ...`` for the others), except with DETR's ``normalize``,
    where one cell is ``scale / length`` units, so the wavelength in cells is
    ``2 pi / w_k * length / scale`` (for an unpadded line of ``length`` cells).

    Args:
        encoder (nn.Module): an encoder whose channels are fixed sinusoids:
            :class:`~vispos.PositionEmbeddingSine` (``num_pos_feats`` channels per axis,
            interleaved), the ``positional-encodings`` classes (interleaved) or
            :class:`~vispos.SinusoidalPositionalEncoding` / :class:`~vispos.SpeechainPositionalEncoding`
            (their ``layout`` and ``ladder``).
        length (int): the line's length in cells (only used with ``normalize``), >= 1.

    Returns:
        Tensor[F] | None: float64, the wavelength of channels ``0 .. F-1`` of the first axis
            block (``F`` channels); ``None`` for an encoder without fixed frequencies (learned).

    Raises:
        ValueError: ``length < 1``.

    References:
        Vaswani et al., Attention Is All You Need, NeurIPS 2017 (sec. 3.5).
    """
    from ._sincos import frequency_divisors
    from .encodings import PositionEmbeddingSine, SinusoidalPositionalEncoding, SpeechainPositionalEncoding
    from .encodings.grid import _GridEncoding

    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise ValueError(f"length must be an int >= 1, got {length!r}")
    if isinstance(encoder, PositionEmbeddingSine):
        feats, temp, layout, ladder = encoder.num_pos_feats, encoder.temperature, "interleaved", "standard"
    elif isinstance(encoder, _GridEncoding):
        feats, temp, layout, ladder = encoder.channels_per_axis, 10000.0, "interleaved", "standard"
    elif isinstance(encoder, (SinusoidalPositionalEncoding, SpeechainPositionalEncoding)):
        feats, temp = encoder.d_model, encoder.temperature
        layout, ladder = encoder.layout, encoder.ladder
    else:
        return None
    div = frequency_divisors(feats, float(temp), ladder=ladder, dtype=torch.float64)
    lam = 2 * math.pi * div
    if isinstance(encoder, PositionEmbeddingSine) and encoder.normalize:
        lam = lam * (length + encoder.eps) / encoder.scale
    k = torch.arange(feats)
    index = k // 2 if layout == "interleaved" else k % (feats // 2)
    if div.shape[0] == feats:  # the "continued" ladder: the cosines have their own divisors
        index = index + feats // 2 * (k % 2 if layout == "interleaved" else k // (feats // 2))
    return lam[index]


def plot_channels(
    pos: Tensor,
    channels: Sequence[int] | None = None,
    *,
    title: str | None = None,
    max_panels: int = 8,
):
    """Channel heatmaps of one item's encoding over a 1D or 2D grid.

    1D: one image, channel index down and position across (the classic "frequency plot": fast
    channels at the top of each block, slow ones below). 2D: one panel per chosen channel.

    Args:
        pos (Tensor[C, L] or Tensor[C, H, W]): one item's encoding, channels-first (see
            :func:`encode_grid`), any floating dtype.
        channels (sequence of int, optional): the channels to draw. Default: every channel in
            1D; in 2D ``max_panels`` channels evenly spread over ``0 .. C-1``.
        title (str, optional): the figure's title.
        max_panels (int): the default number of 2D panels (>= 1).

    Returns:
        matplotlib.figure.Figure: 1 heatmap axes plus a colorbar in 1D; one axes per channel plus
            a colorbar in 2D. Never shown; save it with ``fig.savefig(path)``.

    Raises:
        TypeError: ``pos`` is not a tensor; ``channels`` does not hold ints.
        ValueError: ``pos`` is not ``(C, L)`` / ``(C, H, W)`` floating; a channel out of range;
            ``max_panels < 1``.

    References:
        Vaswani et al., Attention Is All You Need, NeurIPS 2017 (the sinusoid table figure).
    """
    pos = _check_pos(pos, "pos", (1, 2))
    c = pos.shape[0]
    if isinstance(max_panels, bool) or not isinstance(max_panels, int) or max_panels < 1:
        raise ValueError(f"max_panels must be an int >= 1, got {max_panels!r}")
    if pos.dim() == 2:
        chans = list(range(c)) if channels is None else _check_channels(channels, c)
        fig = _figure(7.0, 3.2 + 0.006 * len(chans))
        ax = fig.subplots()
        im = ax.imshow(pos[chans].numpy(), aspect="auto", cmap="RdBu_r", vmin=-1, vmax=1,
                       interpolation="nearest")
        ax.set_xlabel("position (cell)")
        ax.set_ylabel("channel" if channels is None else "channel (row of the selection)")
        fig.colorbar(im, ax=ax, label="value")
    else:
        if channels is None:
            chans = sorted(set(np.linspace(0, c - 1, min(c, max_panels)).round().astype(int).tolist()))
        else:
            chans = _check_channels(channels, c)
        cols = min(4, len(chans))
        rows = -(-len(chans) // cols)
        fig = _figure(2.4 * cols + 0.8, 2.3 * rows + 0.4)
        axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False).ravel())
        im = None
        for ax, ch in zip(axes, chans):
            im = ax.imshow(pos[ch].numpy(), cmap="RdBu_r", vmin=-1, vmax=1, interpolation="nearest")
            ax.set_title(f"channel {ch}", fontsize=9)
            ax.set_xticks([])
            ax.set_yticks([])
        for ax in axes[len(chans):]:
            fig.delaxes(ax)
        fig.colorbar(im, ax=axes[: len(chans)].tolist(), shrink=0.8, label="value")
    fig.suptitle(title or f"encoding channels over a {'x'.join(map(str, pos.shape[1:]))} grid", fontsize=10)
    return fig


def plot_sincos_curves(
    pos: Tensor,
    channels: Sequence[int],
    *,
    wavelengths: Sequence[float] | Tensor | None = None,
    positions: Sequence[float] | Tensor | None = None,
    title: str | None = None,
):
    """Curves of chosen channels of a 1D encoding against position, wavelengths marked.

    One row per channel. With ``wavelengths`` each row marks one period, a bar from the first
    position to ``first + wavelength``, and names it in the row's legend; a channel whose
    wavelength exceeds the plotted range says so.

    Args:
        pos (Tensor[C, L]): a 1D encoding, channels-first (see :func:`encode_grid`).
        channels (sequence of int): the channels to draw (each in ``0 .. C-1``).
        wavelengths (sequence of float | Tensor[C], optional): each channel's wavelength in the
            units of ``positions`` (see :func:`channel_wavelengths`), indexed by channel.
        positions (sequence of float | Tensor[L], optional): the x value of each cell.
            Default ``0 .. L-1``.
        title (str, optional): the figure's title.

    Returns:
        matplotlib.figure.Figure: ``len(channels)`` axes sharing the x axis.

    Raises:
        TypeError: ``pos`` is not a tensor; ``channels`` does not hold ints.
        ValueError: ``pos`` is not ``(C, L)``; a channel out of range; ``wavelengths`` shorter
            than ``C`` or ``positions`` not of length ``L``.

    References:
        Vaswani et al., Attention Is All You Need, NeurIPS 2017 (sec. 3.5).
    """
    pos = _check_pos(pos, "pos", (1,))
    c, length = pos.shape
    chans = _check_channels(channels, c)
    x = np.arange(length, dtype=float) if positions is None else np.asarray(
        torch.as_tensor(positions, dtype=torch.float64).cpu(), dtype=float)
    if x.shape != (length,):
        raise ValueError(f"positions must have length {length} (one per cell), got shape {x.shape}")
    lam = None
    if wavelengths is not None:
        lam = np.asarray(torch.as_tensor(wavelengths, dtype=torch.float64).cpu(), dtype=float).ravel()
        if lam.shape[0] < c:
            raise ValueError(f"wavelengths must give one value per channel ({c}), got {lam.shape[0]}")
    fig = _figure(7.5, 1.25 * len(chans) + 0.8)
    axes = fig.subplots(len(chans), 1, sharex=True, squeeze=False)[:, 0]
    span = x[-1] - x[0] if length > 1 else 1.0
    for ax, ch in zip(axes, chans):
        ax.plot(x, pos[ch].numpy(), color="tab:blue", lw=1.4, label=f"channel {ch}")
        ax.set_ylim(-1.25, 1.25)
        ax.set_yticks([-1, 0, 1])
        ax.axhline(0, color="0.8", lw=0.6, zorder=0)
        if lam is not None:
            wl = float(lam[ch])
            if wl <= span:
                ax.annotate("", xy=(x[0] + wl, -1.12), xytext=(x[0], -1.12),
                            arrowprops=dict(arrowstyle="<->", color="tab:red", lw=1.2))
                ax.axvline(x[0] + wl, color="tab:red", lw=0.8, ls=":")
                ax.plot([], [], color="tab:red", label=f"wavelength {wl:.3g}")
            else:
                ax.plot([], [], color="none", label=f"wavelength {wl:.3g} (> range)")
        ax.legend(loc="upper right", fontsize=7, framealpha=0.8)
    axes[-1].set_xlabel("position")
    fig.suptitle(title or "sin / cos channels against position", fontsize=10)
    return fig


def plot_wavelengths(
    num_feats: int = 128,
    temperatures: Sequence[float] = (20.0, 100.0, 10000.0),
    ladders: Sequence[str] = ("standard", "t2t"),
    *,
    frequency: bool = False,
):
    """Wavelength (or frequency) of each frequency index ``k`` for several temperatures and ladders.

    ``standard``: ``w_k = T^(-2k/F)`` (Vaswani et al., DETR); ``t2t``:
    ``w_j = exp(-ln(T) j / (F/2 - 1))`` (tensor2tensor, fairseq2). The wavelength is
    ``2 pi / w_k`` (position units: cells, or normalised units with DETR's ``normalize``). One
    axes per ladder, one line per temperature, log scale. Computed with
    :func:`vispos._sincos.frequency_divisors`, the table every encoder uses.

    Args:
        num_feats (int): ``F``, channels of one axis (positive, even; >= 4 for ``t2t``).
        temperatures (sequence of float): the temperatures ``T`` (each > 0).
        ladders (sequence of str): ``"standard"`` and / or ``"t2t"``.
        frequency (bool): plot ``w_k`` (radians per unit) instead of the wavelength.

    Returns:
        matplotlib.figure.Figure: ``len(ladders)`` axes sharing the y axis, each with
            ``len(temperatures)`` lines of ``F / 2`` points.

    Raises:
        TypeError: ``num_feats`` is not an int; a temperature is not a number.
        ValueError: odd or non-positive ``num_feats``; an empty ``temperatures`` / ``ladders``;
            an unknown ladder; a non-positive temperature.

    References:
        Vaswani et al., Attention Is All You Need, NeurIPS 2017 (sec. 3.5); tensor2tensor
        ``get_timing_signal_1d``; Zhang et al., DINO, ICLR 2023 (temperature 20).
    """
    from ._sincos import frequency_divisors

    temperatures = list(temperatures)
    ladders = list(ladders)
    if not temperatures or not ladders:
        raise ValueError(f"temperatures and ladders must be non-empty, got {temperatures!r} and {ladders!r}")
    tables = {(ld, t): frequency_divisors(num_feats, t, ladder=ld, dtype=torch.float64)
              for ld in ladders for t in temperatures}
    fig = _figure(4.2 * len(ladders) + 0.6, 3.6)
    axes = fig.subplots(1, len(ladders), sharey=True, squeeze=False)[0]
    for ax, ld in zip(axes, ladders):
        for t in temperatures:
            div = tables[ld, t].numpy()
            ys = 1.0 / div if frequency else 2 * math.pi * div
            ax.plot(np.arange(len(div)), ys, marker=".", ms=3, lw=1.2, label=f"T = {t:g}")
        ax.set_yscale("log")
        ax.set_xlabel(f"frequency index k (channels 2k, 2k+1 of {num_feats})")
        ax.set_title(f"{ld} ladder", fontsize=10)
        ax.grid(True, which="both", color="0.9", lw=0.5)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("frequency w_k (rad / unit)" if frequency else "wavelength 2 pi / w_k (units)")
    fig.suptitle(f"{'frequency' if frequency else 'wavelength'} against channel, F = {num_feats}", fontsize=10)
    return fig


def plot_similarity(
    pos: Tensor,
    queries: Sequence[Sequence[int]] | None = None,
    *,
    mask: Tensor | None = None,
    title: str | None = None,
):
    """Cosine-similarity maps of chosen query cells to every cell of one item's encoding.

    2D: one panel per query. 3D: one row per query with the sagittal, coronal and axial slices
    through it (the last two axes of each plane run right and up, as in
    :func:`plot_volume_similarity`). The query is a white star; padding (``mask``) is grey.

    Args:
        pos (Tensor[C, H, W] or Tensor[C, D, H, W]): one item's encoding, channels-first.
        queries (sequence of sequence of int, optional): query cells (one index per spatial
            axis). Default: 3 cells along the valid region's diagonal (:func:`query_cells`).
        mask (Tensor[*S], bool, optional): True marks padding.
        title (str, optional): the figure's title.

    Returns:
        matplotlib.figure.Figure: ``len(queries)`` axes (2D) or ``3 * len(queries)`` (3D), plus
            a colorbar.

    Raises:
        TypeError: ``pos`` is not a tensor; ``mask`` is not a bool tensor.
        ValueError: ``pos`` is not 2D or 3D; ``mask`` of another shape; a query outside the grid.

    References:
        Carion et al., DETR (ECCV 2020), figure of position-embedding similarities.
    """
    pos = _check_pos(pos, "pos", (2, 3))
    spatial = tuple(pos.shape[1:])
    lmask = None
    if mask is not None:
        check_mask(mask)
        if tuple(mask.shape) != spatial:
            raise ValueError(f"mask must have the spatial shape {spatial}, got {tuple(mask.shape)}")
        lmask = mask.cpu()
    if queries is None:
        queries = query_cells(_valid_size(lmask, spatial), 3)
    queries = [tuple(int(v) for v in q) for q in queries]
    if not queries:
        raise ValueError("queries must hold at least one cell")
    sims = [cosine_similarity_map(pos, q).numpy() for q in queries]
    keep = [s if lmask is None else s[~lmask.numpy()] for s in sims]
    vmin = min([0.99] + [float(k.min()) for k in keep if k.size])
    grey = np.array([0.5, 0.5, 0.5, 0.65])
    n = len(queries)
    im = None
    if len(spatial) == 2:
        cols = min(n, 4)
        rows = -(-n // cols)
        aspect = spatial[1] / spatial[0]
        fig = _figure(min(3.0 * aspect, 4.5) * cols + 1.0, 3.0 * rows + 0.5)
        axes = fig.subplots(rows, cols, squeeze=False).ravel()
        for ax, q, sim in zip(axes, queries, sims):
            im = ax.imshow(sim, cmap="viridis", vmin=vmin, vmax=1, interpolation="nearest")
            if lmask is not None and bool(lmask.any()):
                overlay = np.zeros((*spatial, 4))
                overlay[lmask.numpy()] = grey
                ax.imshow(overlay, interpolation="nearest")
            ax.plot([q[1]], [q[0]], marker="*", color="white", markersize=11, markeredgecolor="black")
            ax.set_title(f"query {q}", fontsize=9)
            ax.set_xticks([])
            ax.set_yticks([])
        for ax in axes[n:]:
            fig.delaxes(ax)
        used = axes[:n].tolist()
    else:
        fig = _figure(8.4, 2.6 * n + 0.6)
        axes = fig.subplots(n, 3, squeeze=False)
        for r, (q, sim) in enumerate(zip(queries, sims)):
            for axis in range(3):
                ax = axes[r, axis]
                im = ax.imshow(_slice(sim, axis, q[axis]), cmap="viridis", vmin=vmin, vmax=1,
                               origin="lower", interpolation="nearest")
                if lmask is not None:
                    m = _slice(lmask.numpy(), axis, q[axis])
                    if m.any():
                        _shade(ax, m, grey)
                h, v = _plane_axes(axis)
                ax.plot([q[h]], [q[v]], marker="*", color="white", markersize=10, markeredgecolor="black")
                ax.set_title(f"query {q}, {_PLANES[axis]}" if axis == 0 else _PLANES[axis], fontsize=9)
                ax.set_xticks([])
                ax.set_yticks([])
        used = axes.ravel().tolist()
    fig.colorbar(im, ax=used, shrink=0.8, label="cosine similarity")
    fig.suptitle(title or f"cosine similarity to query cells ({'x'.join(map(str, spatial))} grid)", fontsize=10)
    return fig


def plot_padded_batch(batch: NestedTensor, *, names: Sequence[str] | None = None, normalized: bool = False):
    """A padded 2D batch: each item as padded into the batch, and its mask.

    One row per item: the padded image with its padding shaded, then the mask (True = padding,
    white) with the item's valid size.

    Args:
        batch (NestedTensor[B, C, H, W]): 1 or 3 channels; values in ``[0, 1]`` unless
            ``normalized``.
        names (sequence of str, optional): a title per item.
        normalized (bool): the batch is ImageNet-normalised (undo it for display).

    Returns:
        matplotlib.figure.Figure: ``2 * B`` axes.

    Raises:
        TypeError: ``batch`` is not a :class:`~vispos.NestedTensor`.
        ValueError: the batch is not 2D, is empty, or has neither 1 nor 3 channels; ``names``
            of another length.

    References:
        Carion et al., DETR (ECCV 2020): ``NestedTensor`` and its padding mask.
    """
    if not isinstance(batch, NestedTensor):
        raise TypeError(f"batch must be a NestedTensor, got {type(batch).__name__}")
    t = batch.tensors
    if batch.n_spatial != 2 or t.shape[0] == 0 or t.shape[1] not in (1, 3):
        raise ValueError(f"batch must be a non-empty 2D NestedTensor with 1 or 3 channels, got {tuple(t.shape)}")
    b = t.shape[0]
    if names is not None and len(names) != b:
        raise ValueError(f"names must have one entry per item ({b}), got {len(names)}")
    images = t.detach().float().cpu()
    if normalized and images.shape[1] == 3:
        images = images * torch.tensor(IMAGENET_STD).view(3, 1, 1) + torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
    images = images.clamp(0, 1)
    mask = torch.zeros(b, *t.shape[2:], dtype=torch.bool) if batch.mask is None else batch.mask.cpu()
    h, w = t.shape[2:]
    fig = _figure(2 * min(3.2, 2.6 * w / h) + 0.4, 2.5 * b + 0.5)
    axes = fig.subplots(b, 2, squeeze=False)
    for i in range(b):
        img = images[i].permute(1, 2, 0).numpy()
        axes[i, 0].imshow(img[..., 0] if img.shape[-1] == 1 else img, cmap="gray", vmin=0, vmax=1)
        overlay = np.zeros((h, w, 4))
        overlay[mask[i].numpy()] = [0.5, 0.5, 0.5, 0.6]
        axes[i, 0].imshow(overlay)
        size = "x".join(map(str, batch.image_sizes[i]))
        axes[i, 0].set_title(f"{names[i] if names is not None else f'item {i}'}: {size} valid", fontsize=9)
        axes[i, 1].imshow(mask[i].numpy(), cmap="gray", vmin=0, vmax=1, interpolation="nearest")
        axes[i, 1].set_title(f"mask (white = padding, {float(mask[i].float().mean()):.0%})", fontsize=9)
        for ax in axes[i]:
            ax.set_xticks([])
            ax.set_yticks([])
    fig.suptitle(f"padded batch {tuple(t.shape)}", fontsize=10)
    return fig


def plot_normalized_coords(
    mask: Tensor,
    *,
    scale: float = 2 * math.pi,
    offset: float = 0.0,
    eps: float = 1e-6,
):
    """How DETR's ``normalize`` maps each item's valid cells to ``[0, scale]`` whatever its padding.

    One row per item: its mask, then the normalised row (``y``) and column (``x``) coordinates
    from :func:`~vispos.encodings.sine.cumulative_positions`, then the mask-blind ``y`` and
    ``x``: the same formula on an all-valid mask, which stretches the whole padded canvas
    instead, so an item smaller than the canvas only reaches a fraction of ``scale`` (its valid
    region is outlined in cyan). Shared colour scale ``[0, scale]``.

    Args:
        mask (Tensor[B, H, W], bool): True marks padding.
        scale, offset, eps (float): as in :class:`~vispos.PositionEmbeddingSine`.

    Returns:
        matplotlib.figure.Figure: ``5 * B`` axes plus a colorbar.

    Raises:
        TypeError: ``mask`` is not a bool tensor.
        ValueError: ``mask`` is not ``(B, H, W)`` with ``B >= 1``.

    References:
        Carion et al., DETR (ECCV 2020), ``PositionEmbeddingSine(normalize=True)``; Zhu et al.,
        Deformable DETR (ICLR 2021) for ``offset=-0.5``.
    """
    from .encodings.sine import cumulative_positions

    check_mask(mask)
    if mask.dim() != 3 or mask.shape[0] < 1:
        raise ValueError(f"mask must have shape (B, H, W) with B >= 1, got {tuple(mask.shape)}")
    mask = mask.cpu()
    py, px = cumulative_positions(mask, normalize=True, scale=scale, offset=offset, eps=eps)
    by, bx = cumulative_positions(torch.zeros_like(mask), normalize=True, scale=scale, offset=offset, eps=eps)
    b, h, w = mask.shape
    fig = _figure(5 * min(2.4, 2.0 * w / h) + 1.0, 2.1 * b + 0.6)
    axes = fig.subplots(b, 5, squeeze=False)
    im = None
    for i in range(b):
        m = mask[i].numpy()
        axes[i, 0].imshow(m, cmap="gray", vmin=0, vmax=1, interpolation="nearest")
        axes[i, 0].set_title(f"item {i} mask (white = padding)", fontsize=8)
        panels = ((py[i], "normalised y", True), (px[i], "normalised x", True),
                  (by[i], "mask-blind y", False), (bx[i], "mask-blind x", False))
        for ax, (val, name, masked) in zip(axes[i, 1:], panels):
            shown = np.ma.masked_array(val.numpy(), mask=m if masked else np.zeros_like(m))
            im = ax.imshow(shown, cmap="magma", vmin=0, vmax=scale, interpolation="nearest")
            valid = val.numpy()[~m]
            top = float(valid.max()) if valid.size else 0.0
            ax.set_title(f"{name}: valid max {top:.2f}", fontsize=8)
            if not masked and m.any():
                ax.contour(m.astype(float), levels=[0.5], colors="cyan", linewidths=1.2)
        for ax in axes[i]:
            ax.set_xticks([])
            ax.set_yticks([])
    fig.colorbar(im, ax=axes[:, 1:].ravel().tolist(), shrink=0.7, label=f"position (scale = {scale:.3g})")
    fig.suptitle("DETR normalize: each item's valid cells span [0, scale]; mask-blind does not", fontsize=10)
    return fig


def plot_rotary_invariance(rotary: torch.nn.Module, length: int = 64, *, seed: int = 0):
    """Rotary embeddings: ``q_m . k_n`` depends on the offset ``m - n`` only.

    Draws one random query and one random key vector (``generator`` seeded with ``seed``),
    rotates them to every position ``0 .. length-1`` with ``rotary``, and shows the score matrix
    ``S[m, n] = rot(q, m) . rot(k, n)`` (constant along each diagonal) next to ``S[m, m + d]``
    against the offset ``d`` for several ``m`` (the curves coincide).

    Args:
        rotary (RotaryEmbedding): a :class:`~vispos.RotaryEmbedding` (1D).
        length (int): positions, >= 2.
        seed (int): seed of the random vectors.

    Returns:
        matplotlib.figure.Figure: 2 axes (matrix, offset curves) plus a colorbar.

    Raises:
        TypeError: ``rotary`` is not a :class:`~vispos.RotaryEmbedding`.
        ValueError: ``length < 2``.

    References:
        Su et al., RoFormer: Enhanced Transformer with Rotary Position Embedding, 2021.
    """
    from .encodings import RotaryEmbedding

    if not isinstance(rotary, RotaryEmbedding):
        raise TypeError(f"rotary must be a RotaryEmbedding, got {type(rotary).__name__}")
    if isinstance(length, bool) or not isinstance(length, int) or length < 2:
        raise ValueError(f"length must be an int >= 2, got {length!r}")
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(rotary.dim, generator=gen).expand(length, rotary.dim)
    k = torch.randn(rotary.dim, generator=gen).expand(length, rotary.dim)
    with torch.no_grad():
        scores = (rotary(q.clone()) @ rotary(k.clone()).T).numpy()
    fig = _figure(9.0, 3.8)
    ax0, ax1 = fig.subplots(1, 2)
    im = ax0.imshow(scores, cmap="RdBu_r", interpolation="nearest",
                    vmin=-np.abs(scores).max(), vmax=np.abs(scores).max())
    ax0.set_xlabel("key position n")
    ax0.set_ylabel("query position m")
    ax0.set_title("rot(q, m) . rot(k, n)", fontsize=9)
    fig.colorbar(im, ax=ax0, shrink=0.8)
    for m, style, width in zip(sorted({0, length // 4, length // 2}), ("-", "--", ":"), (3.0, 1.8, 1.2)):
        d = np.arange(-m, length - m)
        ax1.plot(d, scores[m, m + d], ls=style, lw=width, label=f"m = {m}")
    ax1.set_xlabel("offset d = n - m")
    ax1.set_ylabel("score")
    ax1.set_title("S[m, m + d]: one curve whatever m", fontsize=9)
    ax1.legend(fontsize=8)
    fig.suptitle(f"rotary (dim {rotary.dim}, theta {rotary.theta:g}): relative-offset invariance", fontsize=10)
    return fig
