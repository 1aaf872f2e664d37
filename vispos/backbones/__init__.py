"""Backbone adapters that turn a backbone into NestedTensor feature levels, the multi-scale
:class:`Joiner` (Deformable-DETR's input projections, level embedding and flattening) and a
DETR encoder that consumes them."""

from .base import Backbone, BackboneBase, SpatialPositionEmbedding, backbone_border_effect
from ._common import FrozenBatchNorm3d, format_load_report, freeze_batch_norm
from .encoder import DetrEncoder, DetrEncoderLayer
from .joiner import FlatLevels, Joiner, flatten_levels, unflatten_levels, valid_ratios
from .timm_backbone import TimmBackbone, load_checkpoint_state
from .torchvision_backbone import TorchvisionBackbone
from .volumetric import VOLUME_MODELS, VolumeBackbone

__all__ = [
    "Backbone",
    "BackboneBase",
    "SpatialPositionEmbedding",
    "DetrEncoder",
    "DetrEncoderLayer",
    "FlatLevels",
    "FrozenBatchNorm3d",
    "Joiner",
    "TimmBackbone",
    "TorchvisionBackbone",
    "VOLUME_MODELS",
    "VolumeBackbone",
    "backbone_border_effect",
    "flatten_levels",
    "format_load_report",
    "freeze_batch_norm",
    "load_checkpoint_state",
    "unflatten_levels",
    "valid_ratios",
]
