"""Whole detectors and segmenters of the field made exact per image: torchvision's Faster R-CNN,
Mask R-CNN, Keypoint R-CNN, RetinaNet and FCOS, its FCN / DeepLabV3 / LR-ASPP segmenters, and
transformers' DETR, Conditional DETR and Deformable DETR.

Each detector family is one :class:`~vispos.invariance.models._rule.WholeModelRule` in the rule
book, keyed by the model's dotted class name (:data:`WHOLE_MODEL_RULES`, registered by
:mod:`vispos.invariance.rules._builtin`); :func:`~vispos.make_padding_invariant` finds it and
returns the wrapper, which shares the model's parameters under their own names and keeps its call
and output types. Importing this package imports neither torchvision's detection package nor
transformers: a family's module is imported when a model of it is wrapped.

* :mod:`.torchvision_detection`: the detectors; :mod:`._pyramid`: their ``BackboneWithFPN``
  (a whole-model row of its own too: ``resnet_fpn_backbone`` alone);
* :mod:`.torchvision_segmentation`: the segmenters' one row (DeepLabV3's ``ASPPPooling``); the
  segmenters themselves go through the graph rewrite, heads' resize to the input's size included;
* :mod:`.transformers_detr`: DETR, Conditional DETR and Deformable DETR.

References:
    torchvision ``models/detection/`` and ``models/segmentation/``; transformers
    ``models/detr``, ``models/conditional_detr``, ``models/deformable_detr``.
"""

from ._rule import WholeModelRule, whole_model_rule

__all__ = ["WHOLE_MODEL_RULES", "WholeModelRule", "whole_model_rule"]

_DETECTION = WholeModelRule("vispos.invariance.models.torchvision_detection", "invariant_detector")
_DETR = WholeModelRule("vispos.invariance.models.transformers_detr", "invariant_detr")

#: ``(dotted class name, rule)``: every whole-model row of the rule book
WHOLE_MODEL_RULES = (
    ("torchvision.models.detection.backbone_utils.BackboneWithFPN",
     WholeModelRule("vispos.invariance.models._pyramid", "invariant_backbone")),
    ("torchvision.models.detection.faster_rcnn.FasterRCNN", _DETECTION),
    ("torchvision.models.detection.mask_rcnn.MaskRCNN", _DETECTION),
    ("torchvision.models.detection.keypoint_rcnn.KeypointRCNN", _DETECTION),
    ("torchvision.models.detection.retinanet.RetinaNet", _DETECTION),
    ("torchvision.models.detection.fcos.FCOS", _DETECTION),
    ("transformers.models.detr.modeling_detr.DetrForObjectDetection", _DETR),
    ("transformers.models.detr.modeling_detr.DetrModel", _DETR),
    ("transformers.models.conditional_detr.modeling_conditional_detr.ConditionalDetrForObjectDetection", _DETR),
    ("transformers.models.conditional_detr.modeling_conditional_detr.ConditionalDetrModel", _DETR),
    ("transformers.models.deformable_detr.modeling_deformable_detr.DeformableDetrForObjectDetection", _DETR),
    ("transformers.models.deformable_detr.modeling_deformable_detr.DeformableDetrModel", _DETR),
)
