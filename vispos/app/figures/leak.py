"""Figures of what padding does to a backbone's features: an item alone against the same item in a
padded batch, level by level, for a stock and a padding-invariant backbone.

Each function returns a ``matplotlib.figure.Figure`` and never shows or writes it.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from matplotlib.colors import LogNorm
from torch import Tensor, nn

from ... import _deprecation
from ...batching import nested_tensor_from_tensor_list
from ...nested_tensor import NestedTensor
from ._draw import PADDING_LEGEND, display_images, new_figure, no_ticks, shade_padding

__all__ = ["padding_leak_maps", "plot_padding_leak"]

_FLOOR = 1e-8  # the colour scale's floor: float32 rounding sits at about 1e-7 .. 1e-6


@torch.no_grad()
def padding_leak_maps(backbone: nn.Module, item: Tensor, partner: Tensor) -> list[Tensor]:
    """Per level, how much each of the item's cells changes when the item is batched (at the
    origin, DETR's layout) beside a larger ``partner``: ``max over channels |batch - alone|``
    divided by the standard deviation of the level alone.

    Args:
        backbone (nn.Module): maps a NestedTensor to NestedTensor levels (in its current mode).
        item (Tensor[C, H, W]): the item. partner (Tensor[C, H2, W2]): its batch partner.

    Returns:
        list of Tensor[H_l, W_l] (float32, CPU): one map per level, over the item's own cells.

    Raises:
        ValueError: ``item`` or ``partner`` is not ``(C, H, W)`` with the same ``C``.
    """
    if item.dim() != 3 or partner.dim() != 3 or item.shape[0] != partner.shape[0]:
        raise ValueError(
            f"item and partner must be (C, H, W) with the same C, got {tuple(item.shape)} and {tuple(partner.shape)}"
        )
    alone = backbone(NestedTensor(item[None], None))
    batched = backbone(nested_tensor_from_tensor_list([item, partner]))
    maps = []
    for a, b in zip(alone, batched):
        ref = a.tensors[0].float()
        got = b.tensors[(0, slice(None), *(slice(0, s) for s in ref.shape[1:]))].float()
        maps.append(((got - ref).abs().amax(0) / (ref.std() + 1e-12)).cpu())
    return maps


@_deprecation.renamed_kwargs(normalized="imagenet_normalized")
def plot_padding_leak(
    backbones: Mapping[str, nn.Module],
    item: Tensor,
    partner: Tensor,
    *,
    level_names: list[str] | None = None,
    imagenet_normalized: bool = True,
):
    """An item's features alone against in a padded batch, as difference maps, one row per backbone.

    Column 0 shows the item and, as padding, the canvas its partner forces on it; then one map per
    level (:func:`padding_leak_maps`) on a shared logarithmic scale, so float32 rounding (about
    ``1e-7``) and a leak of the padding (about ``1``) read apart at a glance.

    Args:
        backbones (mapping of str to nn.Module): e.g. ``{"stock": ..., "padding_invariant=True":
            ...}``, in their current mode.
        item (Tensor[3, H, W]) and partner (Tensor[3, H2, W2]): images (ImageNet-normalised when
            ``imagenet_normalized``).
        level_names (list of str, optional): a title per level (default ``level 0``, ...).
        imagenet_normalized (bool): undo ImageNet normalisation to draw the item.

    Returns:
        matplotlib.figure.Figure: ``len(backbones) x (1 + levels)`` axes and a colour bar.

    Raises:
        ValueError: no backbones; images of another shape than ``(3, H, W)``; ``level_names`` of
            another length than the levels.

    References:
        Carion et al., DETR, ECCV 2020 (padded batches; facebookresearch/detr#217, #239).
    """
    if not backbones:
        raise ValueError("backbones must name at least one backbone")
    if item.dim() != 3 or item.shape[0] != 3 or partner.shape[:1] != item.shape[:1]:
        raise ValueError(f"item and partner must be (3, H, W) images, got {tuple(item.shape)} and {tuple(partner.shape)}")
    rows = {name: padding_leak_maps(bb, item, partner) for name, bb in backbones.items()}
    n_levels = len(next(iter(rows.values())))
    if level_names is not None and len(level_names) != n_levels:
        raise ValueError(f"level_names must have {n_levels} entries, got {len(level_names)}")
    names = level_names or [f"level {i}" for i in range(n_levels)]
    top = max(float(m.max()) for maps in rows.values() for m in maps)
    norm = LogNorm(vmin=_FLOOR, vmax=max(top, 10 * _FLOOR))
    image = display_images(item[None], imagenet_normalized)[0].permute(1, 2, 0).numpy()
    canvas = tuple(max(a, b) for a, b in zip(item.shape[1:], partner.shape[1:]))
    fig = new_figure(2.6 * (1 + n_levels) + 0.8, 2.6 * len(rows) + 0.6)
    axes = fig.subplots(len(rows), 1 + n_levels, squeeze=False)
    shown = None
    for r, (name, maps) in enumerate(rows.items()):
        ax = axes[r, 0]
        padded = np.ones((*canvas, 3))
        padded[: item.shape[1], : item.shape[2]] = image
        ax.imshow(padded)
        outside = np.ones(canvas, dtype=bool)
        outside[: item.shape[1], : item.shape[2]] = False
        shade_padding(ax, outside)
        ax.set_title(f"{name}\nitem in a {canvas[0]}x{canvas[1]} canvas", fontsize=8)
        for c, m in enumerate(maps):
            shown = axes[r, 1 + c].imshow(m.clamp(min=_FLOOR).numpy(), norm=norm, cmap="magma")
            axes[r, 1 + c].set_title(f"{names[c]} {tuple(m.shape)}: max {float(m.max()):.1e}", fontsize=8)
        for ax in axes[r]:
            no_ticks(ax)
    fig.colorbar(shown, ax=axes.ravel().tolist(), shrink=0.8, label="|batch - alone| / std (max over channels)")
    fig.suptitle(f"an item's features in a padded batch against alone ({PADDING_LEGEND})", fontsize=10)
    return fig
