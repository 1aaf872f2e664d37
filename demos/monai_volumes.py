"""Volumes and MONAI: real MNI152 scans of different sizes and spacings, end to end.

Three scans of nilearn's MNI152 template (``vispos.data``) as a scanner would deliver them
(isotropic, thick slices, a partial field of view), each at its own size and spacing, go
through a MONAI dict pipeline (``CropForegroundd``, symmetric ``DivisiblePadd``) and a
``monai.data.DataLoader`` with vispos' ``NestedPadCollate``: one padded batch whose mask marks
every padded voxel, MONAI's symmetric padding included. DETR's sine embedding places every voxel
at its physical coordinate (``spacing`` from the batch's affines), and a figure shows its
similarity on the thick-slice scan, drawn to scale in millimetres. ``AnySizeUNETR`` segments the
padded batch; the predictions decollate and invert (``Invertd``) back to each scan's own grid.

    python -m demos.monai_volumes --out monai-volumes.png
"""

from __future__ import annotations

import argparse

import torch

from vispos.app.data import mni152_template


def scans(base: float, max_size: int | None) -> list[dict]:
    """Three MNI152 scans as MONAI dict samples: ``MetaTensor`` images with their affines."""
    from monai.data import MetaTensor
    from monai.transforms import SpatialCropd, Spacingd

    volume = mni152_template(resolution=2, max_size=max_size)  # (1, D, H, W), RAS+ axes
    step = 2.0 * 99 / volume.shape[1]  # the template is 99 voxels of 2 mm along its first axis
    affine = torch.diag(torch.tensor([step, step, step, 1.0], dtype=torch.float64))
    template = {"image": MetaTensor(volume, affine=affine)}
    iso = Spacingd("image", (base, base, base))(dict(template))
    thick = Spacingd("image", (base, base, 3 * base))(dict(template))  # thick axial slices
    depth = iso["image"].shape[-1]
    top = SpatialCropd("image", roi_start=(0, 0, depth // 2), roi_end=iso["image"].shape[1:])(dict(iso))
    names = ["isotropic", "thick slices", "superior half"]
    return [{"image": d["image"].as_tensor(), "affine": d["image"].affine, "name": n} for d, n in zip((iso, thick, top), names)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spacing", type=float, default=3.0, help="voxel size of the isotropic scan (mm)")
    parser.add_argument("--max-size", type=int, default=None, help="shrink the template first (tests)")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    parser.add_argument("--hidden-size", type=int, default=96, help="UNETR's transformer width")
    parser.add_argument("--out", default="monai-volumes.png", help="the similarity figure (PNG)")
    args = parser.parse_args(argv)

    from monai.data import DataLoader, Dataset, MetaTensor
    from monai.transforms import Compose, CropForegroundd, DivisiblePadd, Invertd

    from vispos import PositionEmbeddingSine
    from vispos.app.figures import plot_similarity
    from vispos.app.png import save_figure
    from vispos.monai import AnySizeUNETR, NestedPadCollate, decollate_nested_batch, meta_spacing

    data = scans(args.spacing, args.max_size)
    pipeline = Compose(
        [
            CropForegroundd("image", source_key="image", select_fn=lambda x: x > x.min()),
            DivisiblePadd("image", k=16),  # MONAI's symmetric padding: masked by the collate
        ]
    )
    dataset = Dataset([{"image": MetaTensor(d["image"], affine=d["affine"]), "name": d["name"]} for d in data], pipeline)
    loader = DataLoader(
        dataset, batch_size=3, num_workers=args.workers, pin_memory=torch.cuda.is_available(),
        collate_fn=NestedPadCollate(size_divisibility=16),
    )
    batch = next(iter(loader))
    image = batch["image"]  # a NestedTensor: a batched MetaTensor and the mask (True = padding)
    print(f"batch {tuple(image.tensors.shape)}, padding {float(image.mask.float().mean()):.1%} of the voxels")
    for d, spacing, mask in zip(data, meta_spacing(image), image.mask):
        mm = "x".join(f"{float(s):g}" for s in spacing)
        print(f"  {d['name']:14s} scan {tuple(d['image'].shape[1:])} of {mm} mm, {int((~mask).sum())} valid voxels")

    # DETR's sine embedding in millimetres: one length (the template's 200 mm) for every axis
    spacing = meta_spacing(image)
    sine = PositionEmbeddingSine(32, normalize=True, extent=200.0)
    pos = sine(image, spacing=spacing)
    print(f"PositionEmbeddingSine in mm -> {tuple(pos.shape)}")
    b = [d["name"] for d in data].index("thick slices")
    item = pos[(b, slice(None), *image.padding.region(b))]  # the scan's own cells
    query = tuple(s // 2 for s in item.shape[1:])
    mm = " x ".join(f"{float(v):g}" for v in spacing[b])
    fig = plot_similarity(
        item, [query], spacing=spacing[b].tolist(),
        title=f"thick-slice MNI152 scan ({mm} mm voxels, drawn to scale), positions in mm",
    )
    save_figure(fig, args.out, dpi=80)
    print(f"wrote {args.out}")

    model = AnySizeUNETR(
        in_channels=1, out_channels=2, img_size=(96, 96, 96), feature_size=8,
        hidden_size=args.hidden_size, mlp_dim=2 * args.hidden_size, num_heads=4,
    ).eval()
    with torch.no_grad():
        batch["pred"] = model(image)  # a MetaTensor: it decollates and inverts like the image
    print(f"AnySizeUNETR -> {tuple(batch['pred'].shape)} logits")
    for item in decollate_nested_batch(batch):  # each sample at its own size again
        back = Invertd("pred", transform=pipeline, orig_keys="image")(item)  # undo crop and pad
        print(f"  {item['name']:14s} prediction on the scan's own grid: {tuple(back['pred'].shape[1:])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
