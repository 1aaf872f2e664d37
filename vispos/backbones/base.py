"""What a backbone and a spatial position embedding promise the :class:`~vispos.backbones.Joiner`.

Small typed interfaces (``typing.Protocol``), as timm's ``feature_info`` describes a
``features_only`` model: the Joiner and the CLI read them, never ``getattr`` with a default.

* :class:`Backbone`: ``num_channels`` (per level), ``strides`` (per level) and ``n_spatial``
  (2 for images, 3 for volumes); called with a :class:`~vispos.NestedTensor`, it returns one
  NestedTensor per level. vispos' timm, torchvision and volume adapters satisfy it.
* :class:`SpatialPositionEmbedding`: ``out_channels(n_axes)``, the channels of its output for an
  input with ``n_axes`` spatial axes. :class:`~vispos.PositionEmbeddingSine`,
  :class:`~vispos.PositionEmbeddingSineDepthAdded` and
  :class:`~vispos.PositionEmbeddingLearned` satisfy it.

References:
    timm ``models/_features.py`` (``FeatureInfo.channels()``, ``.reduction()``);
    Carion et al., DETR ``models/backbone.py`` (``Backbone.num_channels``).
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

__all__ = ["Backbone", "SpatialPositionEmbedding"]


@runtime_checkable
class Backbone(Protocol):
    """A feature extractor the Joiner can wrap.

    Attributes:
        num_channels (sequence of int): channels of each returned level.
        strides (sequence): each level's stride (an int, or a tuple per axis).
        n_spatial (int): number of spatial axes of its input and levels (2 or 3).
    """

    num_channels: Sequence[int]
    strides: Sequence[Any]
    n_spatial: int

    def __call__(self, x: Any) -> Any: ...


@runtime_checkable
class SpatialPositionEmbedding(Protocol):
    """A position embedding the Joiner can pair with a backbone."""

    def out_channels(self, n_axes: int) -> int:
        """Channels of the embedding of an input with ``n_axes`` spatial axes."""
        ...
