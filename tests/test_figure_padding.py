"""Every figure draws padding one way: opaque grey (hatched in a darker grey) on top of the padded
cells, never the colour scale through it, and names it with one legend
(:data:`vispos.app.figures._draw.PADDING_LEGEND`). Before: a half-transparent grey let the
similarity colours show through the hatching, mask panels drew padding white, and titles said
"grey = padding", "white = padding" and "padding shaded" side by side."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import vispos
from vispos.app import figures
from vispos.app.figures._draw import PADDING_COLOR, PADDING_HATCH_COLOR, PADDING_LEGEND, slice_plane

PAD = np.round(np.array(PADDING_COLOR) * 255)
HATCH = np.round(np.array(PADDING_HATCH_COLOR) * 255)


def _level(batch: vispos.NestedTensor, stride: int) -> vispos.NestedTensor:
    mask = F.interpolate(batch.mask[:, None].float(), scale_factor=1 / stride)[:, 0].bool()
    return vispos.NestedTensor(torch.zeros(mask.shape[0], 4, *mask.shape[1:]), mask)


def _pixels(fig):
    fig.canvas.draw()
    return np.asarray(fig.canvas.buffer_rgba())[..., :3].astype(float)


def _cell_samples(ax, buf, mask):
    """RGB of 9 points inside each True cell of ``mask`` (drawn at ``x = col, y = row``)."""
    rows, cols = np.nonzero(mask)
    offsets = np.array([(dx, dy) for dx in (-0.3, 0, 0.3) for dy in (-0.3, 0, 0.3)])
    pts = (np.stack([cols, rows], 1)[:, None, :] + offsets[None]).reshape(-1, 2)
    xy = ax.transData.transform(pts)
    x, y = np.floor(xy[:, 0]).astype(int), buf.shape[0] - 1 - np.floor(xy[:, 1]).astype(int)
    return buf[y, x]


def _assert_padding_drawn(ax, buf, mask):
    mask = np.asarray(mask, dtype=bool)
    assert mask.any()
    pad = _cell_samples(ax, buf, mask)
    # grey: the padding colour, the hatch colour or an antialiased mix of the two; never the scale
    assert np.abs(pad - pad.mean(1, keepdims=True)).max() <= 3, f"{ax.get_title()!r}: colour shows through padding"
    assert pad.min() >= HATCH[0] - 3 and pad.max() <= PAD[0] + 3, ax.get_title()
    assert (np.abs(pad - PAD).max(1) <= 2).mean() > 0.25, ax.get_title()  # the padding colour; the hatch the rest
    valid = _cell_samples(ax, buf, ~mask)
    assert (np.abs(valid - PAD).max(1) > 2).mean() > 0.9, ax.get_title()  # valid cells are not drawn as padding


def _legends(fig) -> list[str]:
    import matplotlib.text

    texts = " ".join(t.get_text() for t in fig.findobj(matplotlib.text.Text))
    assert "padding shaded" not in texts
    return re.findall(r"[\w ,]*?= padding", texts)


def _assert_one_legend(fig):
    found = _legends(fig)
    assert found and {f.strip() for f in found} == {PADDING_LEGEND}, found


def test_demo_figure_draws_padding_opaque_grey_with_one_legend():
    """The demo's image figure (:func:`plot_level_similarity`) on a tiny padded batch: every padded
    cell of the input, of the level mask and of every similarity map is grey in the pixels."""
    torch.manual_seed(0)
    batch = vispos.nested_tensor_from_tensor_list([torch.rand(3, 32, 48), torch.rand(3, 48, 24)])
    levels = [_level(batch, 8), _level(batch, 16)]
    pos = [vispos.PositionEmbeddingSine(8, normalize=True)(lv) for lv in levels]
    fig = figures.plot_level_similarity(batch, levels, pos, imagenet_normalized=False)
    buf = _pixels(fig)
    axes = np.asarray(fig.axes[: 2 * 2 * 4]).reshape(4, 4)  # (item, level) rows; image or mask, then 3 maps
    for i in range(2):
        for lvl in range(2):
            row = axes[2 * i + lvl]
            _assert_padding_drawn(row[0], buf, (batch.mask if lvl == 0 else levels[lvl].mask)[i].numpy())
            for ax in row[1:]:
                _assert_padding_drawn(ax, buf, levels[lvl].mask[i].numpy())
    _assert_one_legend(fig)


def test_volume_figure_draws_padding_opaque_grey_with_one_legend():
    torch.manual_seed(0)
    batch = vispos.nested_tensor_from_tensor_list([torch.rand(1, 16, 12, 8), torch.rand(1, 8, 16, 12)])
    level = _level(batch, 2)
    pos = vispos.PositionEmbeddingSine(12, normalize=True)(level)
    fig = figures.plot_volume_level_similarity(batch, [level], [pos])
    buf = _pixels(fig)
    per_volume = [ax for sub in fig.subfigs[:2] for ax in sub.axes] if hasattr(fig, "subfigs") else None
    axes = per_volume or [ax for ax in fig.axes if ax.get_images()][:12]
    for i in range(2):
        maps = axes[6 * i + 3 : 6 * i + 6]  # the level's row: sagittal, coronal, axial
        m = level.mask[i].numpy()
        q = tuple(s // 2 for s in level.image_sizes[i])
        for axis, ax in enumerate(maps):
            sliced = slice_plane(m, axis, q[axis])
            if sliced.any():
                _assert_padding_drawn(ax, buf, sliced)
    _assert_one_legend(fig)


@pytest.mark.parametrize("kind", ["batch", "coords", "similarity", "rope"])
def test_every_padding_figure_names_padding_with_the_one_legend(kind):
    mask = torch.zeros(2, 6, 8, dtype=torch.bool)
    mask[1, 4:] = True
    mask[1, :, 5:] = True
    if kind == "batch":
        fig = figures.plot_padded_batch(vispos.nested_tensor_from_tensor_list([torch.rand(3, 6, 8), torch.rand(3, 4, 5)]))
        buf = _pixels(fig)
        _assert_padding_drawn(fig.axes[3], buf, mask[1].numpy())  # the mask panel: grey, not white
    elif kind == "coords":
        fig = figures.plot_normalized_coords(mask)
        buf = _pixels(fig)
        for ax in fig.axes[5:8]:  # item 1: its mask, normalised y and x
            _assert_padding_drawn(ax, buf, mask[1].numpy())
    elif kind == "similarity":
        pos = figures.encode_grid(vispos.PositionEmbeddingSine(8, normalize=True), (6, 8))
        fig = figures.plot_similarity(pos, [(1, 1)], mask=mask[1])
        _assert_padding_drawn(fig.axes[0], _pixels(fig), mask[1].numpy())
    else:
        fig = figures.plot_rope_padding(vispos.DinoV3RotaryEmbedding(16), mask)
    _assert_one_legend(fig)
