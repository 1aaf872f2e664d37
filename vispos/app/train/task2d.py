"""A small DETR trained on padded batches of real photographs, and the position-embedding ablation.

Data (:mod:`vispos.app.train.shapes2d`): solid shapes with exact boxes (three classes:
rectangle, circle, triangle) pasted onto real photographs shipped with scikit-image and
matplotlib, flipped and resized to several scales, so every batch is padded by
:class:`vispos.PaddedCollate`. Held-out images use other photographs.

Model and training come from the shared core (:mod:`vispos.app.train`, also used by the 3D task): a
timm backbone (``pretrained=False``) -> :class:`vispos.backbones.Joiner` -> ``DetrEncoder`` ->
DETR's decoder (zero targets, learned query positions on queries and keys at every layer, memory
positions on the cross-attention's keys only) -> class and box heads; Hungarian matching and
DETR's losses with ``torchvision.ops`` geometry; held-out COCO mAP / AP50 / AP75 from
``torchmetrics`` and the mean IoU of matched boxes.

Position embeddings (``--pos``, same seed, data, initial weights and steps in every arm):
``none`` (zeros), ``grid`` (``vispos.PositionalEncodingPermute2D`` over the padded canvas, blind
to the mask), ``sine`` (``vispos.PositionEmbeddingSine(normalize=True)`` on the mask).

    vispos train --steps 3000 --out runs/detr --pos sine --seed 0 --threads 1
    vispos train --out runs/detr --report     # tables over seeds, curves
    torchrun --nproc_per_node 2 -m vispos.app.train.task2d --steps 3000 --batch-size 4 --out runs/ddp
    vispos train --tiny --out /tmp/detr-tiny    # seconds, for CI

Writes ``OUT/<arm>/seed<S>/metrics.json`` (per step: losses, learning rate, seconds, resident
memory, padded fraction; every ``--eval-every`` steps the held-out metrics), optionally
``checkpoint.pt`` next to it, and ``OUT/ablation.md`` and ``OUT/curves.png`` over every run found
under ``OUT``. See docs/training.md.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import NoReturn

from ...backbones import TimmBackbone
from ._task_args import FLAGS_2D, MAX_SIDE, TRAIN_PHOTOS
from .cli import run
from .criterion import BOX_OPS_2D
from .metrics import coco_map
from .shapes2d import CLASSES, HELDOUT_PHOTOS, ShapesOnPhotos, load_photos
from .task import DetrTask

__all__ = ["TASK", "build_backbone", "build_datasets", "main"]


def validate(args: argparse.Namespace, error) -> NoReturn | None:
    if args.photos > len(TRAIN_PHOTOS):
        error("--photos", f"at most {len(TRAIN_PHOTOS)} training photographs exist, got {args.photos}")
    if args.photo_size > MAX_SIDE:
        error("--photo-size", f"must be <= {MAX_SIDE}, got {args.photo_size}")
    if any(s > MAX_SIDE for s in args.scales):
        error("--scales", f"must be <= {MAX_SIDE}, got {args.scales}")
    if args.min_object > args.max_object:
        error("--min-object", f"must be <= --max-object {args.max_object}, got {args.min_object}")
    if args.max_object > args.photo_size:
        error("--max-object", f"must be <= --photo-size {args.photo_size}, got {args.max_object}")
    if args.queries < args.max_objects:
        error("--queries", f"must be >= --max-objects {args.max_objects} (one query per object), got {args.queries}")
    if args.size_divisibility > max(args.scales):
        error("--size-divisibility", f"must be <= the largest of --scales ({max(args.scales)}): a larger one "
              f"only adds padding, got {args.size_divisibility}")
    import timm

    if not timm.is_model(args.backbone):
        error("--backbone", f"not a timm model name: {args.backbone!r}")
    try:
        TimmBackbone(args.backbone, out_indices=(args.out_index,), pretrained=False)
    except (ValueError, IndexError) as exc:
        error("--out-index", str(exc))
    if args.padding_invariant:
        try:
            build_backbone(args)
        except ValueError as exc:
            error("--padding-invariant", f"--backbone {args.backbone}: {exc}")
    return None


def build_datasets(args: argparse.Namespace) -> tuple[ShapesOnPhotos, ShapesOnPhotos]:
    obj = dict(max_objects=args.max_objects, min_size=args.min_object, max_size=args.max_object)
    train = ShapesOnPhotos(load_photos(TRAIN_PHOTOS[: args.photos], args.photo_size), args.train_images,
                           args.seed, args.scales, True, **obj)
    held = ShapesOnPhotos(load_photos(HELDOUT_PHOTOS, args.photo_size), args.eval_images, args.seed + 1,
                          args.scales, False, **obj)
    return train, held


def build_backbone(args: argparse.Namespace) -> TimmBackbone:
    return TimmBackbone(args.backbone, out_indices=(args.out_index,), pretrained=False,
                        padding_invariant=args.padding_invariant)


TASK = DetrTask.from_flags(
    FLAGS_2D,
    classes=CLASSES,
    box_ops=BOX_OPS_2D,
    validate=validate,
    build_datasets=build_datasets,
    build_backbone=build_backbone,
    metric=coco_map,
    metric_names=("map", "ap50", "ap75"),
    headline="ap50",
)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m vispos.app.train.task2d`` (and ``python -m demos.train_detr`` in a clone); see
    the module docstring and ``--help``."""
    return run(TASK, argv)


if __name__ == "__main__":
    raise SystemExit(main())