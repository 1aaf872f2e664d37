"""Shared drawing for the demos: an input slice beside a few channels of its encoding."""

from __future__ import annotations

import os

import torch


def save_channels(image: torch.Tensor, encoding: torch.Tensor, channels: list[int], path: str, title: str) -> str:
    """Writes ``image`` (H, W[, 3]) and ``encoding[c]`` (C, H, W) for each channel ``c`` to a PNG."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(2.6 * (1 + len(channels)), 2.8), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 1 + len(channels), squeeze=False)[0]
    axes[0].imshow(image.numpy(), cmap="gray")
    axes[0].set_title("input", fontsize=8)
    for ax, c in zip(axes[1:], channels):
        im = ax.imshow(encoding[c].numpy(), cmap="RdBu", vmin=-1, vmax=1)
        ax.set_title(f"channel {c}", fontsize=8)
    for ax in axes:
        ax.set_axis_off()
    fig.colorbar(im, ax=list(axes[1:]), shrink=0.8)
    fig.suptitle(title, fontsize=9)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=80)
    return path
