"""How far the padding-invariant SAM / ViTDet ViT alone is from timm's stock model alone.

Alone, timm pads an item's token grid to whole windows with zero tokens and attends to them;
vispos' invariant model masks them (the reference it makes every padded batch equal). This
measures the difference on one real photo (scikit-image's astronaut, resized to 336 x 512, so
21 x 32 tokens of 16 pixels: windows of 14 pad 7 rows and 10 columns) for ``samvit_base_patch16``
with timm's initialisation (no pretrained weights are downloaded), on the first block (windowed:
only the windows that pass the item's edge change) and the last (after three global blocks).

Run: ``python benchmarks/measure_sam_window_padding.py`` (about 10 s on 2 CPU cores).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def main() -> None:
    import skimage.data

    from vispos import NestedTensor
    from vispos.backbones import TimmBackbone

    torch.manual_seed(0)
    bb = TimmBackbone("samvit_base_patch16", out_indices=(0, 11), padding_invariant=True).eval()
    image = torch.from_numpy(skimage.data.astronaut()).permute(2, 0, 1).float()[None] / 255
    image = F.interpolate(image, size=(336, 512), mode="bilinear", align_corners=False)
    image = (image - torch.tensor([0.485, 0.456, 0.406])[:, None, None]) / torch.tensor([0.229, 0.224, 0.225])[:, None, None]
    with torch.no_grad():
        ours = [level.tensors[0] for level in bb(NestedTensor(image, None))]
        stock = [level[0] for level in bb.body(image)]
    rows, cols = ours[0].shape[1:]
    edge = torch.zeros(rows, cols, dtype=torch.bool)  # tokens of windows that pass the item's edge
    edge[(rows // 14) * 14:, :] = True
    edge[:, (cols // 14) * 14:] = True
    print(f"token grid {rows} x {cols}, windows of 14: {int(edge.sum())} of {rows * cols} tokens in edge windows")
    for name, a, b in (("block 0 (windowed)", ours[0], stock[0]), ("block 11 (last)", ours[1], stock[1])):
        diff = (a - b).norm(dim=0) / b.norm(dim=0)
        print(f"{name}: relative difference per token, edge windows max {diff[edge].max():.3g} "
              f"mean {diff[edge].mean():.3g}; other windows max {diff[~edge].max():.3g}")


if __name__ == "__main__":
    main()
