"""Writes every vispos figure: the gallery behind README and the documentation site.

Each figure comes from one :mod:`vispos.app.figures` function on a vispos encoder (the same figures
``vispos plot KIND`` draws one at a time), plus the 3D similarity figure of the main job on
volumes cut from nilearn's MNI152 template (the embedding alone, no backbone: each level's
mask is the batch mask resized to the level).

    python -m demos.gallery --out gallery/
"""

from __future__ import annotations

import argparse
import os

import torch

import vispos
from vispos.app import figures as viz
from vispos.app.png import save_figure
from vispos.app.data import sample_images, sample_volumes


def _save(fig, folder: str, name: str, dpi: int, written: list[str]) -> None:
    written.append(save_figure(fig, os.path.join(folder, name), dpi=dpi))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="gallery", help="folder for the PNGs (created)")
    parser.add_argument("--dpi", type=int, default=80)
    parser.add_argument("--small", action="store_true", help="tiny inputs (tests)")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    small = args.small
    written: list[str] = []

    # 1D: the classic frequency plot and its curves
    sine1d = vispos.PositionEmbeddingSine(16 if small else 64)
    length = 24 if small else 100
    pos1d = viz.encode_grid(sine1d, (length,))
    _save(viz.plot_channels(pos1d, title=f"PositionEmbeddingSine({sine1d.num_pos_feats}), 1D: "
                            "channel against position"), args.out, "channels_1d.png", args.dpi, written)
    f = pos1d.shape[0]
    _save(viz.plot_sincos_curves(pos1d, sorted({0, 1, f // 8, f // 4, f // 2}),
                                 wavelengths=viz.channel_wavelengths(sine1d, length),
                                 positions=torch.arange(1, length + 1),
                                 title="sin / cos channels of PositionEmbeddingSine, wavelengths in cells"),
          args.out, "curves.png", args.dpi, written)
    # 2D channels of the positional-encodings layout
    grid = (12, 16) if small else (48, 64)
    pe2d = vispos.PositionalEncodingPermute2D(16 if small else 64)
    _save(viz.plot_channels(viz.encode_grid(pe2d, grid), max_panels=8,
                            title=f"PositionalEncodingPermute2D({pe2d.org_channels}): first-axis (row) block, then column block"),
          args.out, "channels_2d.png", args.dpi, written)
    # ladders
    _save(viz.plot_wavelengths(16 if small else 128), args.out, "wavelengths.png", args.dpi, written)
    # 2D similarity of DETR's embedding on a padded item
    mask = torch.zeros(grid, dtype=torch.bool)
    mask[:, grid[1] * 3 // 4:] = True
    detr = vispos.PositionEmbeddingSine(8 if small else 128, normalize=True)
    _save(viz.plot_similarity(viz.encode_grid(detr, grid, mask=mask), mask=mask,
                              title="DETR sine (normalize=True) on an item padded on the right"),
          args.out, "similarity_2d.png", args.dpi, written)
    # 3D similarity: orthogonal slices
    vol = (8, 10, 9) if small else (24, 32, 28)
    sine3d = vispos.PositionEmbeddingSine(8 if small else 32, normalize=True, offset=-0.5)
    pos3d = viz.encode_grid(sine3d, vol)
    centre = tuple(s // 2 for s in vol)
    corner = tuple(s // 5 for s in vol)
    _save(viz.plot_similarity(pos3d, [centre, corner], title="3D sine (offset -0.5): slices through each query"),
          args.out, "similarity_3d.png", args.dpi, written)
    # a padded batch of real photos, and what normalize does to it
    samples = sample_images(["astronaut", "coffee", "camera"] if not small else ["astronaut", "chelsea"],
                            max_size=48 if small else 192)
    # portrait crop of the camera photo, so items are padded along both axes
    samples = [(n, t[:, :, : t.shape[2] * 2 // 3] if n == "camera" else t) for n, t in samples]
    batch = vispos.nested_tensor_from_tensor_list([t for _, t in samples])
    _save(viz.plot_padded_batch(batch, names=[n for n, _ in samples]), args.out, "padded_batch.png",
          args.dpi, written)
    stride = 8 if small else 16
    h, w = batch.tensors.shape[-2:]
    _save(viz.plot_normalized_coords(vispos.interpolate_mask(batch.mask, (h // stride, w // stride))),
          args.out, "normalized_coords.png", args.dpi, written)
    # rotary
    _save(viz.plot_rotary_invariance(vispos.RotaryEmbedding(16 if small else 32), 16 if small else 64),
          args.out, "rotary.png", args.dpi, written)
    # vision RoPE: period bands, and the padded batch mask-blind against mask-aware
    _save(viz.plot_rope_periods(viz.rope_variants(), (32, 32)), args.out, "rope_periods.png", args.dpi, written)
    tokens = vispos.interpolate_mask(batch.mask, (h // stride, w // stride))
    _save(viz.plot_rope_padding(vispos.DinoV3RotaryEmbedding(16 if small else 64), tokens,
                                names=[n for n, _ in samples]), args.out, "rope_padding.png", args.dpi, written)
    # a backbone's features alone against in a padded batch: stock and padding_invariant=True
    from vispos.app.data import imagenet_normalize
    from vispos.backbones import TimmBackbone

    torch.manual_seed(0)
    name = "resnet18" if small else "resnet50"
    stock = TimmBackbone(name, out_indices=(2, 3, 4))
    g = torch.Generator().manual_seed(0)
    for m in stock.modules():  # trained-like batch norms (timm's zero-initialised last norms hide the leak)
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            with torch.no_grad():
                m.running_mean.copy_(torch.rand(m.running_mean.shape, generator=g) - 0.5)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
                m.weight.copy_(torch.rand(m.weight.shape, generator=g) + 0.5)
                m.bias.copy_(torch.rand(m.bias.shape, generator=g) - 0.5)
    invariant = TimmBackbone(name, out_indices=(2, 3, 4), padding_invariant=True)
    invariant.load_state_dict(stock.state_dict())
    photos = dict(sample_images(["coffee", "astronaut"], max_size=96 if small else 448))
    item, partner = imagenet_normalize(photos["coffee"]), imagenet_normalize(photos["astronaut"])
    _save(viz.plot_padding_leak({f"{name}, stock": stock.eval(), f"{name}, padding_invariant=True": invariant.eval()},
                                item, partner, level_names=["C3", "C4", "C5"]),
          args.out, "padding_leak.png", args.dpi, written)
    # the main job's volume figure, on three MNI152 crops
    volumes = sample_volumes(max_size=24 if small else 64)
    vbatch = vispos.nested_tensor_from_tensor_list([t for _, t in volumes])
    levels, pos = [], []
    for s in ((4, 8) if small else (4, 8, 16, 32)):
        size = tuple(max(1, d // s) for d in vbatch.tensors.shape[2:])
        level = vispos.NestedTensor(torch.zeros(len(volumes), 1, *size), vispos.interpolate_mask(vbatch.mask, size))
        levels.append(level)
        pos.append(sine3d(level))
    _save(viz.plot_volume_level_similarity(vbatch, levels, pos, names=[n for n, _ in volumes],
                                           strides=[4, 8] if small else [4, 8, 16, 32]),
          args.out, "volume_similarity.png", args.dpi, written)
    for p in written:
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
