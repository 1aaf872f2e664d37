"""Figures of vision RoPE (DINOv3, RoPE-Mixed, axial): period bands and padded-batch similarity.

Each function returns a ``matplotlib.figure.Figure`` and never shows or writes it. A RoPE table
row ``[sin, cos]`` of a token is compared with another by cosine similarity, which is exactly
the attention score ``rot(q, m) . rot(k, n)`` of a content-free query and key (one unit vector
per rotated pair): ``mean_k cos(theta_k(m) - theta_k(n))``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from ..._checks import as_int
from ...encodings import AxialRotaryEmbedding, DinoV3RotaryEmbedding, MixedRotaryEmbedding
from ...padding import check_mask
from ._draw import PADDING_LEGEND, mark_query, new_figure, no_ticks, shade_padding, similarity_floor
from .similarity import cosine_similarity_map

__all__ = ["rope_variants", "rope_grid", "rope_periods", "plot_rope_periods", "plot_rope_padding"]

_VISION_ROPE = (DinoV3RotaryEmbedding, MixedRotaryEmbedding)


def rope_variants(head_dim: int = 64, *, seed: int = 0) -> dict[str, nn.Module]:
    """The RoPE variants the figures compare, at ViT-B/16's head size by default: axial with
    theta 100 (RoPE-ViT), DINOv3 with base 100 and with periods 0.5 to 16, RoPE-Mixed with
    theta 10 (depth 12, 12 heads; frequencies drawn from a generator seeded with ``seed``).

    Args:
        head_dim (int): channels per head, a multiple of 4.
        seed (int): the seed of RoPE-Mixed's random frames.

    Returns:
        dict of label -> module.

    Raises:
        ValueError: ``head_dim`` not a positive multiple of 4.
    """
    if as_int(head_dim) is None or as_int(head_dim) < 4 or as_int(head_dim) % 4:
        raise ValueError(f"head_dim must be a positive multiple of 4, got {head_dim!r}")
    head_dim = as_int(head_dim)
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        mixed = MixedRotaryEmbedding(12 * head_dim, 12, 12)
    finally:
        torch.random.set_rng_state(state)
    return {
        "axial, theta 100 (RoPE-ViT)": AxialRotaryEmbedding(head_dim, theta=100.0),
        "DINOv3, base 100": DinoV3RotaryEmbedding(head_dim),
        "DINOv3, periods 0.5 to 16": DinoV3RotaryEmbedding(head_dim, min_period=0.5, max_period=16.0),
        "RoPE-Mixed, theta 10": mixed,
    }


def _check_rope(rope: object, kinds: tuple[type, ...] = _VISION_ROPE) -> nn.Module:
    if not isinstance(rope, kinds):
        names = " / ".join(k.__name__ for k in kinds)
        raise TypeError(f"rope must be a {names}, got {type(rope).__name__}")
    return rope


def rope_grid(rope: nn.Module, shape: Sequence[int] | None = None, *, mask: Tensor | None = None,
              block: int = 0, head: int = 0) -> Tensor:
    """A vision RoPE table laid out as a channels-first grid (for similarity maps).

    Args:
        rope (DinoV3RotaryEmbedding or MixedRotaryEmbedding): the module (eval mode is used).
        shape (sequence of int, optional): the grid (without ``mask``).
        mask (Tensor[B, *S] bool, optional): a padded batch (True = padding).
        block, head (int): RoPE-Mixed's block and head.

    Returns:
        Tensor[2 * dim, *S] (no mask) or Tensor[B, 2 * dim, *S], float32, CPU.

    Raises:
        TypeError: not a vision RoPE module. ValueError: neither or both of shape / mask.
    """
    _check_rope(rope)
    if (shape is None) == (mask is None):
        raise ValueError("give a shape or a mask")
    was = rope.training
    rope.eval()
    try:
        with torch.no_grad():
            table = rope.get_embed(list(shape)) if mask is None else rope.get_embed(mask=mask)
    finally:
        rope.train(was)
    if isinstance(rope, MixedRotaryEmbedding):
        table = table[block, head] if mask is None else table[block, :, head]
    spatial = tuple(shape) if mask is None else tuple(mask.shape[1:])
    table = table.float().cpu()
    if mask is None:
        return table.T.reshape(-1, *spatial)
    return table.transpose(1, 2).reshape(table.shape[0], -1, *spatial)


def rope_periods(rope: nn.Module, grid: Sequence[int]) -> Tensor:
    """Period, in grid cells, of every rotated channel pair.

    * :class:`~vispos.DinoV3RotaryEmbedding`: ``P_k * d_a / 2`` along axis ``a`` (coordinates span
      2 over ``d_a`` cells): ``Tensor[num_axes, q]``, grid-dependent by design.
    * :class:`~vispos.MixedRotaryEmbedding`: ``2 pi / |f|``, ``f`` the pair's frequency vector (the
      period along its direction): ``Tensor[depth, heads, head_dim / 2]``.
    * :class:`~vispos.AxialRotaryEmbedding`: ``2 pi theta^(2i / (dim / num_axes))``:
      ``Tensor[num_axes, dim / (2 num_axes)]``, grid-independent.

    Args:
        rope (nn.Module): one of the three.
        grid (sequence of int): the token grid ``S``.

    Returns:
        Tensor, float32 (see above).

    Raises:
        TypeError: another module.
    """
    _check_rope(rope, _VISION_ROPE + (AxialRotaryEmbedding,))
    grid = [int(s) for s in grid]
    if isinstance(rope, DinoV3RotaryEmbedding):
        perm = list(range(len(grid)))
        if rope.grid_indexing == "xy":
            perm[0], perm[1] = perm[1], perm[0]
        sizes = torch.tensor([grid[a] for a in perm], dtype=torch.float32)
        if rope.normalize_coords == "min":
            sizes = sizes.amin().expand_as(sizes)
        elif rope.normalize_coords == "max":
            sizes = sizes.amax().expand_as(sizes)
        return rope.periods.float().cpu()[None, :] * sizes[:, None] / 2
    if isinstance(rope, MixedRotaryEmbedding):
        return 2 * math.pi / rope.freqs.detach().float().cpu().norm(dim=0)
    k = torch.arange(0, rope.axis_dim, 2, dtype=torch.float32) / rope.axis_dim
    return (2 * math.pi * rope.theta**k).expand(rope.num_axes, -1)


def plot_rope_periods(ropes: Mapping[str, nn.Module], grid: Sequence[int] = (32, 32)):
    """The period bands of several RoPE variants at one token grid, and RoPE-Mixed's directions.

    Left: period (cells, log scale) against channel pair, per variant and axis (RoPE-Mixed: pair
    ``k`` of each direction group, the band over the heads and directions of block 0, median
    drawn); the grid's side is marked: longer periods
    vary slowly across the whole image. Right (when a RoPE-Mixed is given): its block-0
    frequency vectors ``(f_x, f_y)``, one colour per head: each head rotates along its own
    directions, the axial variants only along the axes.

    Args:
        ropes (mapping of str to module): label -> DinoV3 / Mixed / Axial RoPE (2D).
        grid (sequence of 2 ints): the token grid ``(H, W)``.

    Returns:
        matplotlib.figure.Figure: 1 or 2 axes.

    Raises:
        TypeError: a module of another kind. ValueError: no modules; a grid that is not 2 ints.

    References:
        Heo et al., ECCV 2024 (RoPE-Mixed); Simeoni et al., DINOv3, 2025.
    """
    if not ropes:
        raise ValueError("ropes must hold at least one module")
    grid = tuple(int(s) for s in grid)
    if len(grid) != 2 or min(grid) < 1:
        raise ValueError(f"grid must be 2 positive ints (H, W), got {grid}")
    mixed = [(name, r) for name, r in ropes.items() if isinstance(r, MixedRotaryEmbedding)]
    fig = new_figure(10.0 if mixed else 6.0, 4.0)
    axes = fig.subplots(1, 2 if mixed else 1, squeeze=False)[0]
    ax = axes[0]
    for i, (name, rope) in enumerate(ropes.items()):
        periods = rope_periods(rope, grid)
        color = f"C{i}"
        if isinstance(rope, MixedRotaryEmbedding):
            # block 0, pairs grouped by direction (num_axes groups of one magnitude ladder):
            # the band spans heads and directions
            heads = periods[0].reshape(-1, periods.shape[-1] // rope.num_axes).numpy()
            x = np.arange(heads.shape[1])
            ax.fill_between(x, heads.min(0), heads.max(0), color=color, alpha=0.25, lw=0)
            ax.plot(x, np.median(heads, 0), color=color, label=f"{name} (block 0, heads' band)")
            continue
        labels = ("H", "W") if rope.num_axes == 2 else ("D", "H", "W")
        same = bool(torch.allclose(periods, periods[:1].expand_as(periods)))
        for a, row in enumerate(periods[:1] if same else periods):
            axis = "" if same else f", axis {labels[a]}"
            ax.plot(np.arange(row.shape[0]), row.numpy(), color=color, ls="-" if a == 0 else "--",
                    marker=".", label=f"{name}{axis}")
    for side in sorted(set(grid)):
        ax.axhline(side, color="grey", lw=0.8, ls=":")
        ax.text(0, side, f" grid side {side}", fontsize=7, va="bottom", color="grey")
    ax.set_yscale("log")
    ax.set_xlabel("rotated pair k (per axis; RoPE-Mixed: per direction)")
    ax.set_ylabel(f"period (cells of a {grid[0]}x{grid[1]} grid)")
    ax.set_title("period bands", fontsize=9)
    ax.legend(fontsize=7)
    if mixed:
        ax = axes[1]
        name, rope = mixed[0]
        f = rope.freqs.detach().float().cpu()[:2, 0]  # [2, heads, pairs]
        for h in range(f.shape[1]):
            ax.scatter(f[0, h], f[1, h], s=10, color=f"C{h % 10}", label=f"head {h}" if h < 6 else None)
            ax.plot(np.stack([np.zeros(f.shape[2]), f[0, h]]), np.stack([np.zeros(f.shape[2]), f[1, h]]),
                    color=f"C{h % 10}", lw=0.5, alpha=0.5)
        lim = float(f.abs().max()) * 1.1
        ax.set_xlim(-lim, lim)
        ax.set_ylim(-lim, lim)
        ax.set_aspect("equal")
        ax.axhline(0, color="grey", lw=0.5)
        ax.axvline(0, color="grey", lw=0.5)
        ax.set_xlabel("f_x (rad / cell)")
        ax.set_ylabel("f_y (rad / cell)")
        ax.set_title(f"{name}: block 0 frequency vectors", fontsize=9)
        ax.legend(fontsize=7, loc="upper right")
    fig.suptitle("vision RoPE: the wavelengths each variant rotates by", fontsize=10)
    return fig


def plot_rope_padding(rope: nn.Module, mask: Tensor, *, names: Sequence[str] | None = None,
                      block: int = 0, head: int = 0):
    """What mask-awareness changes: one row per item of a padded batch, similarity to its
    centre cell under the canvas table (mask-blind), the per-item table (``get_embed(mask=)``)
    and the item alone.

    The mask-blind table normalizes (DINOv3) or counts (RoPE-Mixed) over the canvas, so an
    item's map depends on the batch it lands in; the per-item table equals the item alone on
    every valid cell (each panel's title gives the largest difference between its table and the
    item alone's, over the item's valid cells).
    Padding is hatched grey.

    Args:
        rope (DinoV3RotaryEmbedding or MixedRotaryEmbedding): a 2D module.
        mask (Tensor[B, H, W] bool): True marks padding, at the token grid.
        names (sequence of str, optional): a label per item.
        block, head (int): RoPE-Mixed's block and head.

    Returns:
        matplotlib.figure.Figure: ``3 * B`` axes and a colorbar.

    Raises:
        TypeError: not a vision RoPE; ``mask`` not a bool tensor.
        ValueError: ``mask`` not ``(B, H, W)``; an item with no valid cell.

    References:
        Simeoni et al., DINOv3, 2025; Carion et al., DETR, ECCV 2020 (masks, similarity figure).
    """
    _check_rope(rope)
    check_mask(mask)
    if mask.dim() != 3 or rope.num_axes != 2:
        raise ValueError(f"mask must be (B, H, W) for a 2D module, got {tuple(mask.shape)}")
    mask = mask.cpu()
    canvas = tuple(mask.shape[1:])
    batch = mask.shape[0]
    blind = rope_grid(rope, canvas, block=block, head=head)
    aware = rope_grid(rope, mask=mask, block=block, head=head)
    valid = ~mask
    rows = []
    for b in range(batch):
        cells = valid[b].nonzero()
        if not len(cells):
            raise ValueError(f"item {b} has no valid cell")
        (top, left), (bottom, right) = cells.min(0).values.tolist(), cells.max(0).values.tolist()
        h, w = bottom + 1 - top, right + 1 - left
        query = (top + h // 2, left + w // 2)
        alone = torch.zeros(blind.shape[0], *canvas)
        alone[:, top : top + h, left : left + w] = rope_grid(rope, (h, w), block=block, head=head)
        tables = (blind, aware[b], alone)
        maps = [cosine_similarity_map(t, query).numpy() for t in tables]
        inside = torch.zeros(canvas, dtype=torch.bool)
        inside[top : top + h, left : left + w] = True
        inside &= valid[b]
        diffs = [float((t[:, inside] - alone[:, inside]).abs().max()) for t in tables[:2]]
        rows.append((query, maps, diffs))
    m = [mask[b].numpy() for b in range(batch) for _ in range(3)]
    vmin = similarity_floor([mp for _, maps, _ in rows for mp in maps], m)
    aspect = canvas[1] / canvas[0]
    fig = new_figure(3 * min(2.6 * aspect, 4.0) + 1.0, 2.4 * batch + 0.8)
    axes = fig.subplots(batch, 3, squeeze=False)
    im = None
    titles = ("canvas table (mask-blind)", "get_embed(mask=...)", "item alone")
    for b, (query, maps, diffs) in enumerate(rows):
        for c in range(3):
            ax = axes[b, c]
            im = ax.imshow(maps[c], cmap="viridis", vmin=vmin, vmax=1, interpolation="nearest")
            shade_padding(ax, mask[b])
            mark_query(ax, query[1], query[0], 10)
            label = titles[c] if c == 2 else f"{titles[c]}\ntable vs alone: max |diff| {diffs[c]:.2g}"
            ax.set_title(label if b == 0 or c < 2 else "", fontsize=8)
        name = names[b] if names is not None and b < len(names) else f"item {b}"
        axes[b, 0].set_ylabel(name, fontsize=8)
    no_ticks(axes)
    fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.8, label="cosine similarity (RoPE score)")
    fig.suptitle(f"{type(rope).__name__} on a padded batch: similarity to each item's centre ({PADDING_LEGEND})",
                 fontsize=10)
    return fig
