"""One held-out volume's slices with its ground-truth lesions and each pipeline's prediction.

Reads the ``prediction.pt`` files that ``vispos train --volume --task segment`` writes next to
each run's ``metrics.json`` (the first held-out volume of the seed, its label and the prediction
with the volume alone), so the figure needs no model and no training.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Mapping

import numpy as np
import torch
from torch import Tensor

from ._draw import new_figure

__all__ = ["GROUND_TRUTH", "PREDICTION", "plot_segmentations", "draw_segmentations"]

#: the order of the rows after the ground truth
_ORDER = ("crop", "whole", "invariant")
#: the ground truth's outline in every row: (matplotlib colour, its name in the title)
GROUND_TRUTH = ("#00c0ff", "blue")
#: the predictions' fill (a matplotlib colormap; its top, 1.0, is the colour drawn) and its name
PREDICTION = ("autumn", "yellow")


def plot_segmentations(image: Tensor, label: Tensor, predictions: Mapping[str, Tensor], spacing: Tensor | None = None):
    """Three orthogonal slices through the centre of the lesions: the volume with the ground
    truth outlined, then one row per prediction (filled) with the same outline, each panel at the
    volume's aspect in mm. The title names the colours (:data:`GROUND_TRUTH`, :data:`PREDICTION`).

    Args:
        image (Tensor[D, H, W], float): the volume.
        label (Tensor[D, H, W], integer): ground truth, nonzero = lesion.
        predictions (mapping of str to Tensor[D, H, W], integer): row title -> prediction.
        spacing (Tensor[3], optional): voxel size in mm (D, H, W); default isotropic.

    Returns:
        matplotlib.figure.Figure

    Raises:
        ValueError: ``image`` is not 3-D, or a label / prediction shape differs from it.
    """
    if image.dim() != 3:
        raise ValueError(f"image must be Tensor[D, H, W], got shape {tuple(image.shape)}")
    for name, t in {"label": label, **{f"predictions[{k!r}]": v for k, v in predictions.items()}}.items():
        if tuple(t.shape) != tuple(image.shape):
            raise ValueError(f"{name} must have the image's shape {tuple(image.shape)}, got {tuple(t.shape)}")
    sp = [1.0, 1.0, 1.0] if spacing is None else [float(s) for s in spacing]
    fg = np.argwhere(label.numpy() > 0)
    centre = fg.mean(0).round().astype(int) if len(fg) else np.asarray(image.shape) // 2
    rows = [("ground truth", label)] + list(predictions.items())
    fig = new_figure(7.5, 2.3 * len(rows))
    axes = fig.subplots(len(rows), 3, squeeze=False)
    img = image.float().numpy()
    lo, hi = np.percentile(img, [1, 99])
    for r, (title, seg) in enumerate(rows):
        s = seg.numpy() > 0
        for a in range(3):
            ax = axes[r][a]
            im2, s2 = np.take(img, centre[a], axis=a), np.take(s, centre[a], axis=a)
            rest = [sp[i] for i in range(3) if i != a]
            ax.imshow(im2, cmap="gray", vmin=lo, vmax=hi, aspect=rest[0] / rest[1], interpolation="nearest")
            if r > 0:
                ax.imshow(np.ma.masked_where(~s2, s2.astype(float)), cmap=PREDICTION[0], alpha=0.55, vmin=0, vmax=1,
                          aspect=rest[0] / rest[1], interpolation="nearest")
            ax.contour(np.take(label.numpy() > 0, centre[a], axis=a).astype(float), levels=[0.5],
                       colors=[GROUND_TRUTH[0]], linewidths=1.0 if r == 0 else 0.8)
            ax.set_xticks([])
            ax.set_yticks([])
            if a == 0:
                ax.set_ylabel(title)
            if r == 0:
                ax.set_title(f"axis {a} slice {centre[a]}", fontsize=9)
    fig.suptitle("held-out volume " + "x".join(str(n) for n in image.shape) + " voxels, "
                 + "x".join(f"{v:.2g}" for v in sp) + f" mm; {GROUND_TRUTH[1]} outline = ground truth, "
                 f"{PREDICTION[1]} fill = prediction", fontsize=9)
    return fig


def draw_segmentations(out: str, seed: int, network: str = "segresnet") -> str:
    """Draws ``out/segment3d_seed<seed>.png`` from ``out/<pipeline>/<network>/seed<seed>/prediction.pt``
    (every pipeline found, crop / whole / invariant first). Returns the path written.

    Raises:
        FileNotFoundError: no prediction of that seed and network under ``out``.
        ValueError: the predictions are of different volumes.
    """
    from ..png import save_figure

    found = sorted(glob.glob(os.path.join(glob.escape(out), "*", glob.escape(network), f"seed{seed}", "prediction.pt")))
    if not found:
        raise FileNotFoundError(f"no prediction under {out!r} ({out}/<pipeline>/{network}/seed{seed}/prediction.pt)")
    loaded = {os.path.basename(os.path.dirname(os.path.dirname(os.path.dirname(p)))):
              torch.load(p, map_location="cpu", weights_only=True) for p in found}
    names = [k for k in _ORDER if k in loaded] + sorted(set(loaded) - set(_ORDER))
    first = loaded[names[0]]
    for k in names[1:]:
        if not torch.equal(loaded[k]["label"], first["label"]):
            raise ValueError(f"the predictions of {names[0]!r} and {k!r} are of different held-out volumes; "
                             "train both with the same data flags")
    fig = plot_segmentations(first["image"], first["label"], {k: loaded[k]["prediction"] for k in names},
                             first["spacing"])
    return save_figure(fig, os.path.join(out, f"segment3d_seed{seed}.png"))
