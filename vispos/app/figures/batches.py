"""Figures of padded batches: items as padded into the batch, their masks, DETR's normalised coordinates.

Each function returns a ``matplotlib.figure.Figure`` and never shows or writes it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from ... import _deprecation
from ...encodings.sine import cumulative_positions
from ...nested_tensor import NestedTensor
from ...padding import check_mask
from ._draw import PADDING_LEGEND, display_images, draw_mask, new_figure, no_ticks, shade_padding

__all__ = ["plot_padded_batch", "plot_normalized_coords"]


@_deprecation.renamed_kwargs(normalized="imagenet_normalized")
def plot_padded_batch(
    batch: NestedTensor, *, names: Sequence[str] | None = None, imagenet_normalized: bool = False
):
    """A padded 2D batch: each item as padded into the batch, and its mask.

    One row per item: the padded image with its padding drawn over it, then the mask; padding is
    hatched grey in both (:data:`~vispos.app.figures._draw.PADDING_LEGEND`).

    Args:
        batch (NestedTensor[B, C, H, W]): 1 or 3 channels; values in ``[0, 1]`` unless
            ``imagenet_normalized``.
        names (sequence of str, optional): a title per item.
        imagenet_normalized (bool): the batch is ImageNet-normalised (undo it for display).

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
    if batch.num_axes != 2 or t.shape[0] == 0 or t.shape[1] not in (1, 3):
        raise ValueError(f"batch must be a non-empty 2D NestedTensor with 1 or 3 channels, got {tuple(t.shape)}")
    b = t.shape[0]
    if names is not None and len(names) != b:
        raise ValueError(f"names must have one entry per item ({b}), got {len(names)}")
    images = display_images(t, imagenet_normalized)
    mask = torch.zeros(b, *t.shape[2:], dtype=torch.bool) if batch.mask is None else batch.mask.cpu()
    h, w = t.shape[2:]
    fig = new_figure(2 * min(3.2, 2.6 * w / h) + 0.4, 2.5 * b + 0.5)
    axes = fig.subplots(b, 2, squeeze=False)
    for i in range(b):
        img = images[i].permute(1, 2, 0).numpy()
        axes[i, 0].imshow(img[..., 0] if img.shape[-1] == 1 else img, cmap="gray", vmin=0, vmax=1)
        shade_padding(axes[i, 0], mask[i])
        size = "x".join(map(str, batch.image_sizes[i]))
        axes[i, 0].set_title(f"{names[i] if names is not None else f'item {i}'}: {size} valid", fontsize=9)
        draw_mask(axes[i, 1], mask[i])
        axes[i, 1].set_title(f"mask ({float(mask[i].float().mean()):.0%} padding)", fontsize=9)
    no_ticks(axes)
    fig.suptitle(f"padded batch {tuple(t.shape)} ({PADDING_LEGEND})", fontsize=10)
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
    check_mask(mask)
    if mask.dim() != 3 or mask.shape[0] < 1:
        raise ValueError(f"mask must have shape (B, H, W) with B >= 1, got {tuple(mask.shape)}")
    mask = mask.cpu()
    py, px = cumulative_positions(mask, normalize=True, scale=scale, offset=offset, eps=eps)
    by, bx = cumulative_positions(torch.zeros_like(mask), normalize=True, scale=scale, offset=offset, eps=eps)
    b, h, w = mask.shape
    fig = new_figure(5 * min(2.4, 2.0 * w / h) + 1.0, 2.1 * b + 0.6)
    axes = fig.subplots(b, 5, squeeze=False)
    im = None
    for i in range(b):
        m = mask[i].numpy()
        draw_mask(axes[i, 0], m)
        axes[i, 0].set_title(f"item {i} mask", fontsize=8)
        panels = ((py[i], "normalised y", True), (px[i], "normalised x", True),
                  (by[i], "mask-blind y", False), (bx[i], "mask-blind x", False))
        for ax, (val, name, masked) in zip(axes[i, 1:], panels):
            shown = np.ma.masked_array(val.numpy(), mask=m if masked else np.zeros_like(m))
            im = ax.imshow(shown, cmap="magma", vmin=0, vmax=scale, interpolation="nearest")
            if masked:
                shade_padding(ax, m)
            valid = val.numpy()[~m]
            top = float(valid.max()) if valid.size else 0.0
            ax.set_title(f"{name}: valid max {top:.2f}", fontsize=8)
            if not masked and m.any():
                ax.contour(m.astype(float), levels=[0.5], colors="cyan", linewidths=1.2)
    no_ticks(axes)
    fig.colorbar(im, ax=axes[:, 1:].ravel().tolist(), shrink=0.7, label=f"position (scale = {scale:.3g})")
    fig.suptitle(f"DETR normalize: each item's valid cells span [0, scale]; mask-blind does not ({PADDING_LEGEND})",
                 fontsize=10)
    return fig
