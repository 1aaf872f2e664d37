"""Backbone adapters that turn a backbone into NestedTensor feature levels, and the multi-scale
:class:`Joiner` (Deformable-DETR's input projections, level embedding and flattening).

Helpers are split by concern: ``_checkpoints`` (local state dicts and load reports),
``_batch_norm`` (frozen batch norm), ``_freezing`` (frozen stages), ``_stems`` (input channels),
``_graph`` (torchvision feature extraction shared by the 2D and 3D adapters). The DETR encoder
that consumes the levels lives in :mod:`vispos.transformer`, and the flattened levels both share
in :mod:`vispos.levels` (``FlatLevels`` and its functions are re-exported here).
``vispos.backbones.DetrEncoder`` / ``DetrEncoderLayer`` (moved), ``BackboneBase``
(now :class:`BackboneAdapter`) and ``valid_ratios`` (now
:func:`vispos.padding.mask_valid_ratios`) are deprecated aliases that warn, naming the new home.
"""

from .. import _deprecation
from ._batch_norm import FrozenBatchNorm3d, freeze_batch_norm
from ._checkpoints import format_load_report, load_checkpoint_state
from .base import Backbone, BackboneAdapter, SpatialPositionEmbedding, backbone_border_effect
from .joiner import FlatLevels, Joiner, flatten_levels, unflatten_levels
from .pyramid import ChannelLayerNorm, SimpleFeaturePyramid
from .timm_backbone import TimmBackbone
from .torchvision_backbone import TorchvisionBackbone
from .volumetric import VOLUME_MODELS, VolumeBackbone

#: old names, each a deprecated alias naming its new home (resolved on first access, so this
#: package never imports :mod:`vispos.transformer`, its consumer)
__getattr__ = _deprecation.alias_getattr(__name__, {
    "DetrEncoder": "vispos.transformer:DetrEncoder",  # moved
    "DetrEncoderLayer": "vispos.transformer:DetrEncoderLayer",
    "BackboneBase": "vispos.backbones.base:BackboneAdapter",  # renamed
    "valid_ratios": "vispos.padding:mask_valid_ratios",  # one home, beside Padding.valid_ratios
})


__all__ = [
    "Backbone",
    "BackboneAdapter",
    "ChannelLayerNorm",
    "SimpleFeaturePyramid",
    "SpatialPositionEmbedding",
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
]
