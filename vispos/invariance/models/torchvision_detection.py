"""torchvision's detectors (Faster R-CNN, Mask R-CNN, RetinaNet, FCOS) made exact per image:
each image of a batch gets the detections, and in training the losses, it gets alone.

:func:`invariant_detector` wraps the model (the whole-model rule of
:func:`~vispos.make_padding_invariant` for these classes). The model runs through its own
``forward``, with these parts replaced for the call (the model is never changed):

* the backbone and its FPN (:class:`~vispos.invariance.models._pyramid.InvariantPyramid`), with
  each image's padding from ``ImageList.image_sizes``;
* the heads' convolution towers, made exact by the rule book, and their last convolutions, which
  read zeros in the padding; classification logits on padding cells are the dtype's lowest value;
* the anchors (points, for FCOS): those whose cell is a padding cell of its level (equivalently,
  whose centre lies in the image's padding) are empty boxes at their centre, so they take no part
  in any top-k (lowest logit), in NMS (removed as small boxes before it) or in matching (the RPN
  labels them "ignore"; RetinaNet's and FCOS's matchers never match an empty box, and their focal
  loss is exactly 0 there); each image's anchors use the strides of its own canvas;
* ``MultiScaleRoIAlign`` (boxes, masks, keypoints) samples each image's maps cropped to the maps
  the image gets alone, so bilinear sampling at the image's edge reads what it reads alone.

Cost: the anchors and the RoI pooling are made once per image (a Python loop over the batch's
images, as torchvision's own matching, sampling and post-processing are); the backbone, FPN and
heads run once on the whole batch.

What "alone" means: torchvision's transform resizes each image and pads the batch to a multiple
of ``size_divisible`` (32). The wrapper treats every cell outside an image's resized size as
padding. So each image's output equals what the *wrapper* gives the image alone, in any batch;
and that equals the *stock model* alone when the resized image's height and width are multiples
of ``size_divisible`` (then the stock model pads nothing).

References:
    Ren et al., Faster R-CNN, NeurIPS 2015; He et al., Mask R-CNN, ICCV 2017; Lin et al., Focal
    Loss for Dense Object Detection (RetinaNet), ICCV 2017; Tian et al., FCOS, ICCV 2019;
    torchvision ``models/detection/`` (``generalized_rcnn.py``, ``rpn.py``, ``roi_heads.py``,
    ``retinanet.py``, ``fcos.py``, ``anchor_utils.py``, ``transform.py``).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch
from torch import Tensor, nn

from ._parts import CallMaps, InvariantTower, MaskedConv, ModelWrapper, Override, refuse_hooks, share_modules
from ._pyramid import InvariantPyramid, Levels

__all__ = ["InvariantDetector", "invariant_detector"]

_POOLS = ("box_roi_pool", "mask_roi_pool", "keypoint_roi_pool")


def invariant_detector(model: nn.Module, probe_size: Any = None) -> "InvariantDetector":
    """``model`` (torchvision's ``FasterRCNN``, ``MaskRCNN``, ``KeypointRCNN``, ``RetinaNet`` or
    ``FCOS`` with a ``BackboneWithFPN``) as an :class:`InvariantDetector`.

    Raises:
        ValueError: a part the wrapper does not know (a backbone without FPN, a head without a
            convolution tower, an anchor generator other than ``AnchorGenerator``), named.
    """
    return InvariantDetector(model, probe_size=probe_size)


def _tower(head: nn.Module, name: str, owner: str) -> InvariantTower:
    """The exact twin of ``head.conv`` (``name``: the head's attribute path in model ``owner``)."""
    tower = getattr(head, "conv", None)
    if not isinstance(tower, nn.Module):
        raise ValueError(f"{owner}: {name} ({type(head).__name__}) has no convolution tower 'conv', which vispos' "
                         "detector wrapper runs")
    return InvariantTower(tower)


class InvariantDetector(ModelWrapper):
    """A torchvision detector made exact per image (see the module docstring). Build it with
    :func:`~vispos.make_padding_invariant`.

    Holds the model's children, parameters and buffers under their own names (shared: its
    ``state_dict`` is the model's); ``train()`` / ``eval()`` switch the model's modules.

    Shape:
        - input: ``images``, a list of ``Tensor[C, H_i, W_i]`` (any sizes), and in training
          ``targets``, a list of dicts (``boxes`` ``Tensor[N_i, 4]``, ``labels`` ``Tensor[N_i]``,
          ``masks`` for Mask R-CNN), as the model takes them.
        - output: the model's own: in eval a list of dicts (``boxes``, ``scores``, ``labels``, and
          ``masks`` / ``keypoints``), in training a dict of losses.

    Raises:
        ValueError: (forward) a canvas that is not a multiple of the backbone's deepest stride; a
            hooked part that the wrapper runs through its own code (named).

    References:
        torchvision ``models/detection/``; Ren et al., Faster R-CNN, NeurIPS 2015.
    """

    def __init__(self, model: nn.Module, probe_size: Any = None) -> None:
        super().__init__()
        share_modules(self, model)
        self.__dict__["_model"] = model
        self.network = type(model).__name__
        name = self.network
        self.__dict__["_pyramid"] = InvariantPyramid(model.backbone, probe_size=probe_size)
        generator = getattr(model, "rpn", model).anchor_generator
        if type(generator).__name__ != "AnchorGenerator":
            raise ValueError(f"{name}: its anchor generator {type(generator).__name__} has no rule in vispos "
                             "(torchvision's AnchorGenerator has one)")
        towers: dict[str, InvariantTower] = {}
        if hasattr(model, "rpn"):
            towers["rpn"] = _tower(model.rpn.head, "rpn.head", name)
        else:
            towers["classification"] = _tower(model.head.classification_head, "head.classification_head", name)
            towers["regression"] = _tower(model.head.regression_head, "head.regression_head", name)
        self.__dict__["_towers"] = towers
        self.training = model.training

    def extra_repr(self) -> str:
        return f"network={self.network}"

    def _traced_parts(self) -> tuple[nn.Module | None, ...]:
        return (self._pyramid.body, *(t.invariant for t in (*self._pyramid.inner, *self._pyramid.layer,
                                                            *self._towers.values())))

    def forward(self, images: list[Tensor], targets: list[dict[str, Tensor]] | None = None) -> Any:
        model = self._model
        maps, call = CallMaps(), {"size_divisible": model.transform.size_divisible}

        def transform(images: Any, targets: Any = None) -> Any:
            image_list, targets = model.transform(images, targets)
            call["images"] = image_list
            return image_list, targets

        def backbone(tensors: Tensor) -> "OrderedDict[str, Tensor]":
            sizes = [tuple(s) for s in call["images"].image_sizes]
            levels = self._pyramid(tensors, sizes, call["size_divisible"], maps, model.training)
            call["levels"] = levels
            return levels.as_dict()

        parts: dict[str, Any] = {"transform": Override(model.transform, call=transform),
                                 "backbone": Override(model.backbone, call=backbone)}
        hooked = {"backbone": model.backbone, "backbone.fpn": model.backbone.fpn}
        if hasattr(model, "rpn"):
            rpn = model.rpn
            head = Override(rpn.head, conv=self._towers["rpn"].bind(maps, model.training),
                            cls_logits=MaskedConv(rpn.head.cls_logits, maps, "lowest"),
                            bbox_pred=MaskedConv(rpn.head.bbox_pred, maps))
            rpn_parts = {"head": head, "anchor_generator": _Anchors(rpn.anchor_generator, call)}
            rpn_parts["assign_targets_to_anchors"] = _ignore_padding(rpn, call, rpn_parts)
            parts["rpn"] = Override(rpn, **rpn_parts)
            pools = {n: _PerImagePool(getattr(model.roi_heads, n), call)
                     for n in _POOLS if getattr(model.roi_heads, n, None) is not None}
            parts["roi_heads"] = Override(model.roi_heads, **pools)
            hooked.update({"rpn": rpn, "rpn.head": rpn.head, "roi_heads": model.roi_heads})
        else:
            cls_head, reg_head = model.head.classification_head, model.head.regression_head
            cls = Override(cls_head, conv=self._towers["classification"].bind(maps, model.training),
                           cls_logits=MaskedConv(cls_head.cls_logits, maps, "lowest"))
            reg_parts = {"conv": self._towers["regression"].bind(maps, model.training),
                         "bbox_reg": MaskedConv(reg_head.bbox_reg, maps)}
            if hasattr(reg_head, "bbox_ctrness"):
                reg_parts["bbox_ctrness"] = MaskedConv(reg_head.bbox_ctrness, maps)
            parts["head"] = Override(model.head, classification_head=cls,
                                     regression_head=Override(reg_head, **reg_parts))
            parts["anchor_generator"] = _Anchors(model.anchor_generator, call)
            hooked.update({"head": model.head, "head.classification_head": cls_head,
                           "head.regression_head": reg_head})
        refuse_hooks(model, {"": model, **hooked}, "make_padding_invariant")
        return Override(model, **parts)(images, targets)


class _Anchors:
    """The model's ``AnchorGenerator`` for one call: each image's anchors on the canvas's grid with
    the strides of the image's own canvas; an anchor whose cell is padding is the empty box at its
    centre. Records each image's valid-anchor flags (``call["valid"]``)."""

    def __init__(self, generator: nn.Module, call: dict) -> None:
        self.generator, self.call = generator, call

    def __call__(self, image_list: Any, feature_maps: list[Tensor]) -> list[Tensor]:
        levels: Levels = self.call["levels"]
        generator = self.generator
        grid_sizes = [f.shape[-2:] for f in feature_maps]
        dtype, device = feature_maps[0].dtype, feature_maps[0].device
        generator.set_cell_anchors(dtype, device)
        per_cell = [len(a) for a in generator.cell_anchors]
        div = self.call["size_divisible"]
        canvas = [tuple(-(-n // div) * div for n in size) for size in image_list.image_sizes]
        anchors, valid_flags = [], []
        for b in range(len(image_list.image_sizes)):
            strides = [[torch.tensor(c // a, dtype=torch.int64, device=device) for c, a in zip(canvas[b], alone[b])]
                       for alone in levels.alone]
            boxes = torch.cat(generator.grid_anchors(grid_sizes, strides))
            valid = torch.cat([(~p.mask[b]).reshape(-1).repeat_interleave(k) if p.kind != "none"
                               else torch.ones(p.spatial[0] * p.spatial[1] * k, dtype=torch.bool, device=device)
                               for p, k in zip(levels.paddings, per_cell)])
            centre = (boxes[:, :2] + boxes[:, 2:]) / 2
            anchors.append(torch.where(valid[:, None], boxes, centre.repeat(1, 2)))
            valid_flags.append(valid)
        self.call["valid"] = valid_flags
        return anchors


def _ignore_padding(rpn: nn.Module, call: dict, parts: dict) -> Any:
    """The RPN's ``assign_targets_to_anchors`` with every padding anchor labelled -1 (ignored by
    the sampler and the loss)."""
    def assign(anchors: list[Tensor], targets: list[dict[str, Tensor]]) -> Any:
        labels, matched = type(rpn).assign_targets_to_anchors(Override(rpn, **parts), anchors, targets)
        labels = [lab.masked_fill(~valid, -1.0) for lab, valid in zip(labels, call["valid"])]
        return labels, matched
    return assign


class _PerImagePool:
    """A ``MultiScaleRoIAlign`` of the model called once per image on the image's maps cropped to
    the maps it gets alone (so the sampling at the image's edge reads what it reads alone), its
    outputs concatenated in image order, as the stock pooler orders them."""

    def __init__(self, pool: nn.Module, call: dict) -> None:
        self.pool, self.call = pool, call

    def __call__(self, features: dict[str, Tensor], proposals: list[Tensor], image_shapes: list[tuple[int, int]]
                 ) -> Tensor:
        levels: Levels = self.call["levels"]
        alone = dict(zip(levels.names, levels.alone))
        outs = []
        for b, (boxes, shape) in enumerate(zip(proposals, image_shapes)):
            crops = OrderedDict((k, v[b:b + 1, :, :alone[k][b][0], :alone[k][b][1]]) for k, v in features.items())
            outs.append(self.pool(crops, [boxes], [shape]))
        return torch.cat(outs)
