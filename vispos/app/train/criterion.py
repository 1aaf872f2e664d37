"""DETR's Hungarian matcher and set criterion, with the box geometry injected per dimension.

The matcher and the losses are the same in 2D and 3D; what differs is how a center-size box
becomes corners and how (generalized) IoU is computed. A :class:`BoxOps` carries exactly that:
:data:`BOX_OPS_2D` uses ``torchvision.ops``; the 3D demo passes one built on
``monai.data.box_utils``.

Normalisation across processes: DETR divides the box losses by the number of target boxes,
all-reduced over ranks and divided by the world size. The class loss here is normalised the
same way (its weight sum all-reduced), so that under ``DistributedDataParallel`` the averaged
gradient equals that of one process holding the whole global batch. In one process both are
exactly DETR's (``F.cross_entropy`` with ``weight``, and ``num_boxes``).

References:
    Carion et al., End-to-End Object Detection with Transformers, ECCV 2020 (``models/matcher.py``:
    ``HungarianMatcher``; ``models/detr.py``: ``SetCriterion``); Rezatofighi et al., Generalized
    Intersection over Union, CVPR 2019.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torchvision.ops import box_convert, box_iou, generalized_box_iou

from vispos import _deprecation

__all__ = ["BoxOps", "BOX_OPS_2D", "hungarian_match", "SetCriterion"]


@dataclass(frozen=True)
class BoxOps:
    """The box geometry of one dimensionality.

    Attributes:
        num_axes (int): spatial axes (2 or 3); boxes have ``2 * num_axes`` numbers.
        to_corners (callable): ``Tensor[N, 2 * num_axes]`` center-size -> corners (min then max).
        giou (callable): corners ``Tensor[N, 2n]``, ``Tensor[M, 2n]`` -> ``Tensor[N, M]`` generalized
            IoU (differentiable).
        iou (callable): the same for IoU.
        size_scale (callable): ``Tensor[num_axes]`` an item's unpadded size in tensor axis order
            (``H, W`` or ``D, H, W``) -> ``Tensor[2 * num_axes]`` that turns its normalised corners
            into pixels / voxels (``(W, H, W, H)`` in 2D, where boxes are ``x, y``).
    """

    num_axes: int
    to_corners: Callable[[Tensor], Tensor]
    giou: Callable[[Tensor, Tensor], Tensor]
    iou: Callable[[Tensor, Tensor], Tensor]
    size_scale: Callable[[Tensor], Tensor]

    n_axes = _deprecation.renamed_attribute("n_axes", "num_axes")


def _xyxy(boxes: Tensor) -> Tensor:
    return box_convert(boxes, "cxcywh", "xyxy")


def _scale_2d(size: Tensor) -> Tensor:
    h, w = size.unbind(-1)
    return torch.stack([w, h, w, h], -1)


#: 2D boxes ``(cx, cy, w, h)`` normalised by the image's ``(W, H)``; ``torchvision.ops`` geometry.
BOX_OPS_2D = BoxOps(2, _xyxy, generalized_box_iou, box_iou, _scale_2d)


@torch.no_grad()
def hungarian_match(
    logits: Tensor, boxes: Tensor, targets: Sequence[dict[str, Tensor]], box_ops: BoxOps,
    cost_class: float = 1.0, cost_bbox: float = 5.0, cost_giou: float = 2.0,
) -> list[tuple[Tensor, Tensor]]:
    """DETR's matcher: per item, the one-to-one assignment of queries to targets of least cost
    ``-cost_class * p(class) + cost_bbox * L1 + -cost_giou * GIoU`` (``scipy``'s
    ``linear_sum_assignment``).

    Args:
        logits (Tensor[B, Q, K + 1]): class logits (last = no object).
        boxes (Tensor[B, Q, 2n]): predicted center-size boxes.
        targets (sequence of dict): per item ``"labels"`` ``Tensor[T] int64`` and ``"boxes"``
            ``Tensor[T, 2n]`` center-size, in the predictions' units.
        box_ops (BoxOps): the geometry.

    Returns:
        list of ``(query indices, target indices)``, ``Tensor[min(Q, T)]`` int64 each, on the CPU.
    """
    from scipy.optimize import linear_sum_assignment

    prob = logits.float().softmax(-1)
    out = []
    for b, tgt in enumerate(targets):
        labels, tboxes = tgt["labels"].to(logits.device), tgt["boxes"].to(boxes.device, boxes.dtype)
        if labels.numel() == 0:
            empty = torch.empty(0, dtype=torch.int64)
            out.append((empty, empty))
            continue
        cost = (
            -cost_class * prob[b][:, labels]
            + cost_bbox * torch.cdist(boxes[b].float(), tboxes.float(), p=1)
            - cost_giou * box_ops.giou(box_ops.to_corners(boxes[b].float()), box_ops.to_corners(tboxes.float()))
        )
        rows, cols = linear_sum_assignment(cost.cpu().numpy())
        out.append((torch.as_tensor(rows, dtype=torch.int64), torch.as_tensor(cols, dtype=torch.int64)))
    return out


def _identity(t: Tensor) -> Tensor:
    return t


class SetCriterion:
    """DETR's set loss, summed over the decoder layers (auxiliary losses).

    Per layer: Hungarian matching, then ``class_weight * CE`` (no-object weight ``eos_coef``)
    ``+ l1_weight * L1 + giou_weight * (1 - GIoU)`` over the matched pairs.

    Args:
        num_classes (int): ``K`` (the logits have ``K + 1``).
        box_ops (BoxOps): the geometry (2D or 3D).
        class_weight, l1_weight, giou_weight (float): loss weights, also the matching costs.
            Defaults 1, 5, 2 (DETR).
        eos_coef (float): cross-entropy weight of the no-object class. Default 0.1 (DETR).
        all_reduce (callable): sums a tensor over processes (identity in one process).
        world_size (int): number of processes.

    ``criterion(outputs, targets)`` takes DETR's output dict (``pred_logits``, ``pred_boxes``,
    ``aux_outputs``) and returns ``{"loss": the weighted total summed over layers (what is
    optimised), "loss_last": the last layer's weighted total, "loss_ce", "loss_l1", "loss_giou":
    the last layer's terms, unweighted}``, 0-d tensors.
    """

    def __init__(
        self, num_classes: int, box_ops: BoxOps, class_weight: float = 1.0, l1_weight: float = 5.0,
        giou_weight: float = 2.0, eos_coef: float = 0.1, all_reduce: Callable[[Tensor], Tensor] = _identity,
        world_size: int = 1,
    ) -> None:
        self.num_classes, self.box_ops = num_classes, box_ops
        self.class_weight, self.l1_weight, self.giou_weight = class_weight, l1_weight, giou_weight
        self.eos_coef, self.all_reduce, self.world_size = eos_coef, all_reduce, world_size

    def match(self, logits: Tensor, boxes: Tensor, targets: Sequence[dict[str, Tensor]]) -> list[tuple[Tensor, Tensor]]:
        return hungarian_match(logits, boxes, targets, self.box_ops, self.class_weight, self.l1_weight, self.giou_weight)

    def _normalizer(self, value: Tensor) -> Tensor:
        """DETR's ``num_boxes``: the global value over processes, per process, at least 1."""
        return torch.clamp(self.all_reduce(value) / self.world_size, min=1.0)

    def layer_losses(self, logits: Tensor, boxes: Tensor, targets: Sequence[dict[str, Tensor]],
                     num_boxes: Tensor) -> dict[str, Tensor]:
        """The three unweighted terms of one decoder layer's output."""
        matches = self.match(logits, boxes, targets)
        k = self.num_classes
        target_classes = torch.full(logits.shape[:2], k, dtype=torch.int64, device=logits.device)
        src, tgt = [], []
        for b, (rows, cols) in enumerate(matches):
            target_classes[b, rows.to(logits.device)] = targets[b]["labels"][cols].to(logits.device)
            src.append(boxes[b, rows.to(boxes.device)])
            tgt.append(targets[b]["boxes"][cols].to(boxes.device, boxes.dtype))
        weight = torch.ones(k + 1, device=logits.device)
        weight[-1] = self.eos_coef
        nll = F.cross_entropy(logits.transpose(1, 2).float(), target_classes, weight, reduction="sum")
        loss_ce = nll / self._normalizer(weight[target_classes].sum().detach())
        src_t, tgt_t = torch.cat(src), torch.cat(tgt)
        loss_l1 = F.l1_loss(src_t, tgt_t, reduction="sum") / num_boxes
        ops = self.box_ops
        giou = torch.diag(ops.giou(ops.to_corners(src_t), ops.to_corners(tgt_t)))
        loss_giou = (1 - giou).sum() / num_boxes
        return {"loss_ce": loss_ce, "loss_l1": loss_l1, "loss_giou": loss_giou}

    def __call__(self, outputs: dict[str, Any], targets: Sequence[dict[str, Tensor]]) -> dict[str, Tensor]:
        device = outputs["pred_logits"].device
        count = torch.tensor(float(sum(len(t["labels"]) for t in targets)), device=device)
        num_boxes = self._normalizer(count)
        layers = [*outputs.get("aux_outputs", []), outputs]
        totals, last = [], {}
        for out in layers:
            last = self.layer_losses(out["pred_logits"], out["pred_boxes"], targets, num_boxes)
            totals.append(
                self.class_weight * last["loss_ce"] + self.l1_weight * last["loss_l1"]
                + self.giou_weight * last["loss_giou"]
            )
        return {"loss": sum(totals[1:], totals[0]), "loss_last": totals[-1], **last}
