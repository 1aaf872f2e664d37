"""Held-out detection metrics of the demos, from the field's libraries.

* 2D: COCO-style mAP (IoU 0.50:0.95), AP50 and AP75 from
  ``torchmetrics.detection.MeanAveragePrecision`` (pycocotools backend: 101-point interpolated
  precision, up to 100 detections per image, every query's best non-background class as a
  detection, as DETR's ``PostProcess`` does).
* Both dimensions: the mean IoU of the Hungarian-matched boxes, over every ground-truth box
  (how well the boxes are placed, whatever the scores).

The 3D demo passes MONAI's detection metric to the core through its :class:`DetrTask`.

References:
    Lin et al., Microsoft COCO, ECCV 2014 (``pycocotools.cocoeval``); TorchMetrics
    ``MeanAveragePrecision``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from .task import Records

__all__ = ["coco_map", "matched_ious"]


def matched_ious(pred: Tensor, gt: Tensor, iou: Callable[[Tensor, Tensor], Tensor]) -> Tensor:
    """IoU of each matched pair: ``pred[i]`` against ``gt[i]`` (corners, ``Tensor[N, 2n]``) ->
    ``Tensor[N]`` float32."""
    if pred.shape[0] == 0:
        return torch.zeros(0)
    return torch.diagonal(iou(pred.float(), gt.float())).clone()


def coco_map(preds: Records, gts: Records) -> dict[str, float]:
    """COCO-style mAP, AP50 and AP75 of 2D detections (torchmetrics, pycocotools backend).

    Args:
        preds: per image ``{"boxes": Tensor[N, 4] xyxy pixels, "scores": Tensor[N],
            "labels": Tensor[N] int64}``.
        gts: per image ``{"boxes": Tensor[T, 4] xyxy pixels, "labels": Tensor[T] int64}``.

    Returns:
        dict: ``{"map", "ap50", "ap75"}`` in ``[0, 1]`` (0 where the set has no ground truth,
        instead of COCO's -1).
    """
    from torchmetrics.detection import MeanAveragePrecision

    metric = MeanAveragePrecision(box_format="xyxy", iou_type="bbox", backend="pycocotools")
    metric.update(
        [{k: p[k].detach().cpu() for k in ("boxes", "scores", "labels")} for p in preds],
        [{k: g[k].detach().cpu() for k in ("boxes", "labels")} for g in gts],
    )
    out = metric.compute()
    return {name: max(0.0, float(out[key])) for name, key in (("map", "map"), ("ap50", "map_50"), ("ap75", "map_75"))}
