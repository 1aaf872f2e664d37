"""A small 3D DETR trained on padded batches of real MRI volumes, and the 3D position-embedding ablation.

Data (:mod:`vispos.app.train.volumes3d`): solid ellipsoids and cuboids (the two classes) with exact 3D boxes,
drawn with a contrast relative to the surrounding tissue into random crops of real volumes that
installed packages ship (nilearn's MNI152 T1 / GM / WM maps and nibabel's EPI test volume for
training; nibabel's ``anatomical.nii`` and dipy's anisotropic b0 held out), resampled by MONAI
to one isotropic spacing. Every crop side is drawn on its own, so every batch is padded by
:class:`vispos.PaddedCollate`.

Model and training come from the shared core (:mod:`vispos.app.train`, also used by the 2D task): a
small MONAI 3D ResNet (``monai.networks.nets.ResNet``, reduced widths, cut at stride 4) through
:class:`vispos.backbones.VolumeBackbone` -> :class:`vispos.backbones.Joiner` -> ``DetrEncoder``
-> DETR's decoder (zero targets, learned query positions, memory positions on the
cross-attention's keys only) -> class head and 3D box head ``(cz, cy, cx, d, h, w)`` normalised
by each item's own valid size. Hungarian matching (``scipy``) and DETR's losses with MONAI's 3D
box geometry (``monai.data.box_utils``: ``convert_box_mode``, ``box_giou``, ``box_iou``); held-out
AP at 3D IoU 0.25 and 0.5 and mAP over IoU 0.10:0.50 from MONAI's detection metrics
(``COCOMetric`` with ``matching_batch``), and the mean IoU of matched boxes.

Position embeddings (``--pos``, same seed, data, initial weights and steps in every arm):
``none`` (zeros), ``grid`` (``vispos.PositionalEncodingPermute3D`` over the padded canvas, blind
to the mask), ``sine`` (``vispos.PositionEmbeddingSine(normalize=True)`` on the 3D mask).

    vispos train --volume --steps 2000 --out runs/detr3d --pos sine --seed 0 --threads 1
    vispos train --volume --out runs/detr3d --report     # tables over seeds, curves
    torchrun --nproc_per_node 2 -m vispos.app.train.task3d --steps 2000 --batch-size 2 --out runs/ddp3d
    vispos train --volume --tiny --out /tmp/detr3d-tiny    # seconds, for CI

Writes ``OUT/<arm>/seed<S>/metrics.json``, optionally ``checkpoint.pt`` next to it, and
``OUT/ablation.md`` and ``OUT/curves.png`` over every run found under ``OUT``. See
docs/training3d.md.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable, Sequence
from typing import NoReturn

import numpy as np
import torch
from torch import Tensor, nn

from ...backbones import VolumeBackbone
from ._task_args import FLAGS_3D, check_volume_names
from .cli import run
from .criterion import BoxOps
from .task import DetrTask
from .volumes3d import CLASSES, LesionsInVolumes, available_volumes, smallest_extent_mm

__all__ = ["BOX_OPS_3D", "TASK", "backbone_stride", "build_backbone", "build_datasets", "monai_ap", "main"]


# ------------------------------------------------------------------------------- box geometry
def _corners(boxes: Tensor) -> Tensor:
    from monai.data.box_utils import convert_box_mode

    return convert_box_mode(boxes, src_mode="cccwhd", dst_mode="xyzxyz")


def _giou(a: Tensor, b: Tensor) -> Tensor:
    from monai.data.box_utils import box_giou

    return box_giou(a, b)


def _iou(a: Tensor, b: Tensor) -> Tensor:
    from monai.data.box_utils import box_iou

    return box_iou(a, b)


def _scale_3d(size: Tensor) -> Tensor:
    return torch.cat([size, size], -1)


#: 3D boxes ``(cz, cy, cx, d, h, w)`` normalised by the item's ``(D, H, W)``: MONAI's ``cccwhd`` /
#: ``xyzxyz`` modes with MONAI's axes 0, 1, 2 taken as the tensor's ``D, H, W``; MONAI's
#: (generalized) IoU, differentiable.
BOX_OPS_3D = BoxOps(3, _corners, _giou, _iou, _scale_3d)


# ---------------------------------------------------------------------------------- metric
#: the IoU thresholds of ``ap25`` and ``ap50``, and the range ``map`` averages over (start, end, step)
IOU_LIST = (0.25, 0.5)
IOU_RANGE = (0.1, 0.5, 0.05)
#: what the metric names of the 3D task mean, printed at the end of every run
METRIC_LEGEND = (f"held-out metrics (MONAI's 3D box AP, up to 100 detections per crop): ap25 and ap50, AP at "
                 f"IoU {IOU_LIST[0]:.2f} and {IOU_LIST[1]:.2f}; map, AP averaged over IoU {IOU_RANGE[0]:.2f} to "
                 f"{IOU_RANGE[1]:.2f} in steps of {IOU_RANGE[2]:.2f}")


def monai_ap(preds: Sequence[dict[str, Tensor]], gts: Sequence[dict[str, Tensor]]) -> dict[str, float]:
    """AP at 3D IoU 0.25 and 0.5 and mAP over IoU 0.10:0.50 (step 0.05), up to 100 detections per
    volume, from MONAI's detection metrics (``matching_batch`` with ``box_iou``, then ``COCOMetric``).

    Args:
        preds: per volume ``{"boxes": Tensor[N, 6] corners (d0, h0, w0, d1, h1, w1) in voxels,
            "scores": Tensor[N], "labels": Tensor[N] int64}``.
        gts: per volume ``{"boxes": Tensor[T, 6] corners in voxels, "labels": Tensor[T] int64}``.

    Returns:
        dict: ``{"ap25", "ap50", "map"}`` in ``[0, 1]``: MONAI's per-class values, averaged over
        the classes that have ground truth (as pycocotools does; MONAI's own class mean counts a
        class without ground truth as -1); 0 when no class has any.

    References:
        MONAI ``monai.apps.detection.metrics`` (after nnDetection, Baumgartner et al., MICCAI 2021;
        COCO's 101-point interpolated AP, Lin et al., ECCV 2014).
    """
    from monai.apps.detection.metrics.coco import COCOMetric
    from monai.apps.detection.metrics.matching import matching_batch
    from monai.data.box_utils import box_iou

    metric = COCOMetric(classes=CLASSES, iou_list=IOU_LIST, iou_range=IOU_RANGE,
                        max_detection=(100,), per_class=True, verbose=False)

    def np_(t: Tensor, dtype: type) -> np.ndarray:
        return t.detach().cpu().numpy().astype(dtype)

    matched = matching_batch(
        iou_fn=box_iou, iou_thresholds=metric.iou_thresholds,
        pred_boxes=[np_(p["boxes"], np.float32).reshape(-1, 6) for p in preds],
        pred_classes=[np_(p["labels"], np.int64) for p in preds],
        pred_scores=[np_(p["scores"], np.float32) for p in preds],
        gt_boxes=[np_(g["boxes"], np.float32).reshape(-1, 6) for g in gts],
        gt_classes=[np_(g["labels"], np.int64) for g in gts],
        max_detections=100,
    )
    logger = logging.getLogger("monai.apps.detection.metrics.coco")
    level = logger.level
    logger.setLevel(logging.ERROR)  # "no results found for class ..." early in training
    try:
        out, _ = metric(matched)
    finally:
        logger.setLevel(level)
    keys = {"ap25": f"AP_IoU_{IOU_LIST[0]:.2f}_MaxDet_100", "ap50": f"AP_IoU_{IOU_LIST[1]:.2f}_MaxDet_100",
            "map": "mAP_IoU_" + "_".join(f"{v:.2f}" for v in IOU_RANGE) + "_MaxDet_100"}
    result = {}
    for name, key in keys.items():
        # MONAI's own class mean counts a class without ground truth as -1; COCO leaves it out
        per_class = [out[f"{c}_{key}"] for c in CLASSES if out[f"{c}_{key}"] >= 0]
        result[name] = float(np.mean(per_class)) if per_class else 0.0
    return result


# ------------------------------------------------------------------------------- the task
#: --stem-kernel: a cubic stem kernel of k has 16 * k**3 weights per input channel at width 16
MAX_STEM_KERNEL = 15


def validate(args: argparse.Namespace, error: Callable[[str, str], NoReturn]) -> None:
    if len(args.widths) > 4:
        error("--widths", f"a ResNet has at most 4 stages, got {len(args.widths)}")
    if args.crop[0] > args.crop[1]:
        error("--crop", f"MIN must be <= MAX, got {args.crop[0]} {args.crop[1]}")
    stride = backbone_stride(args.widths)
    if args.crop[0] < stride:
        error("--crop", f"MIN must be >= {stride} voxels (the backbone's stride), got {args.crop[0]}")
    if args.min_object > args.max_object:
        error("--min-object", f"must be <= --max-object {args.max_object}, got {args.min_object}")
    if args.max_object > args.crop[0]:
        error("--max-object", f"must be <= the smallest crop side {args.crop[0]}, got {args.max_object}")
    if args.size_divisibility > args.crop[1]:
        error("--size-divisibility", f"must be <= the largest crop side {args.crop[1]} (a larger one only adds "
                                     f"padding), got {args.size_divisibility}")
    if args.contrast[0] > args.contrast[1]:
        error("--contrast", f"MIN must be <= MAX, got {args.contrast[0]} {args.contrast[1]}")
    check_volume_names(args, error)
    if not available_volumes(args.volumes):
        error("--volumes", f"none of {args.volumes} is available (packages or files missing)")
    if not available_volumes(args.heldout_volumes):
        error("--heldout-volumes", f"none of {args.heldout_volumes} is available (packages or files missing)")
    if args.stem_kernel > MAX_STEM_KERNEL:
        error("--stem-kernel", f"must be at most {MAX_STEM_KERNEL} (MONAI's default is 7), got {args.stem_kernel}")
    # every volume, resampled, must hold one feature cell and the largest lesion along each axis
    need = max(stride, args.max_object)
    for flag, names in (("--volumes", args.volumes), ("--heldout-volumes", args.heldout_volumes)):
        for name in available_volumes(names):
            side = smallest_extent_mm(name) / args.spacing
            if side < need:
                error("--spacing", f"{args.spacing:g} mm leaves {name!r} ({flag}) {side:.1f} voxels along its "
                                   f"shortest axis; at least {need} are needed (the backbone's stride "
                                   f"{stride} and --max-object {args.max_object})")


def build_datasets(args: argparse.Namespace) -> tuple[LesionsInVolumes, LesionsInVolumes]:
    """``(train, held-out)``: crops of different volumes; item ``i`` depends only on ``(seed, i)``."""
    common = dict(spacing=args.spacing, crop=tuple(args.crop), max_objects=args.max_objects,
                  min_size=args.min_object, max_size=args.max_object, contrast=tuple(args.contrast))
    train = LesionsInVolumes(available_volumes(args.volumes), args.train_images, args.seed, **common)
    held = LesionsInVolumes(available_volumes(args.heldout_volumes), args.eval_images, 10_000 + args.seed, **common)
    return train, held


def backbone_stride(widths: Sequence[int]) -> int:
    """The stride of :func:`build_backbone`'s output: ``2 ** (len(widths) + 1)`` (stem stride 2,
    max pooling, then every stage after the first halves)."""
    return 2 ** (len(widths) + 1)


def build_backbone(args: argparse.Namespace) -> nn.Module:
    """A MONAI 3D ResNet (basic blocks, one per stage, widths ``--widths``; stem: stride 2 and
    max pooling, so stage ``k`` is at stride ``2 ** (k + 1)``) cut at its last used stage,
    adapted by :class:`vispos.backbones.VolumeBackbone` (``pretrained`` weights: none)."""
    from monai.networks.nets import ResNet

    widths = list(args.widths) + [args.widths[-1]] * (4 - len(args.widths))
    net = ResNet(
        "basic", layers=[1, 1, 1, 1], block_inplanes=widths, spatial_dims=3, n_input_channels=1,
        conv1_t_size=args.stem_kernel, conv1_t_stride=2, num_classes=1,
    )
    return VolumeBackbone(net, return_nodes=[f"layer{len(args.widths)}"], in_chans=1,
                          padding_invariant=args.padding_invariant)


TASK = DetrTask.from_flags(
    FLAGS_3D,
    classes=CLASSES,
    box_ops=BOX_OPS_3D,
    validate=validate,
    build_datasets=build_datasets,
    build_backbone=build_backbone,
    metric=monai_ap,
    metric_names=("ap25", "ap50", "map"),
    headline="ap25",
    metric_legend=METRIC_LEGEND,
)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m vispos.app.train.task3d`` (and ``python -m demos.train_detr3d`` in a clone): see
    the module docstring and ``--help``."""
    return run(TASK, argv)


if __name__ == "__main__":
    raise SystemExit(main())
