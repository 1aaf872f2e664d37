"""Backbone adapters that turn a backbone into NestedTensor feature levels, and the multi-scale
:class:`Joiner` (Deformable-DETR's input projections, level embedding and flattening).

Helpers are split by concern: ``_checkpoints`` (local state dicts and load reports),
``_batch_norm`` (frozen batch norm), ``_freezing`` (frozen stages), ``_stems`` (input channels),
``_graph`` (torchvision feature extraction shared by the 2D and 3D adapters). The DETR encoder
that consumes the levels lives in :mod:`vispos.transformer`; ``vispos.backbones.DetrEncoder``
and ``DetrEncoderLayer`` still resolve to it (loaded on first access, so this package never
imports its consumer).
"""

from typing import Any

from ._batch_norm import FrozenBatchNorm3d, freeze_batch_norm
from ._checkpoints import format_load_report, load_checkpoint_state
from .base import Backbone, BackboneBase, SpatialPositionEmbedding, backbone_border_effect
from .joiner import FlatLevels, Joiner, flatten_levels, unflatten_levels, valid_ratios
from .timm_backbone import TimmBackbone
from .torchvision_backbone import TorchvisionBackbone
from .volumetric import VOLUME_MODELS, VolumeBackbone

#: names that moved to :mod:`vispos.transformer` (issue 19) and still resolve here
_MOVED_TO_TRANSFORMER = ("DetrEncoder", "DetrEncoderLayer")


def __getattr__(name: str) -> Any:
    """``vispos.backbones.DetrEncoder`` / ``DetrEncoderLayer``: the classes of
    :mod:`vispos.transformer`, imported on first access (PEP 562)."""
    if name in _MOVED_TO_TRANSFORMER:
        from .. import transformer

        return getattr(transformer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Backbone",
    "BackboneBase",
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
    "valid_ratios",
]
