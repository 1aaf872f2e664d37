"""Backbone adapters that turn a backbone into NestedTensor feature levels."""

from .joiner import Joiner
from .timm_backbone import TimmBackbone, load_checkpoint_state

__all__ = ["Joiner", "TimmBackbone", "load_checkpoint_state"]
