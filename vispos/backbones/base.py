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

from torch import Tensor, nn

from ..nested_tensor import NestedTensor
from ._common import check_input_device

__all__ = ["Backbone", "BackboneBase", "SpatialPositionEmbedding"]


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


class BackboneBase(nn.Module):
    """The one ``forward`` of vispos' backbone adapters (timm, torchvision, volumes).

    Checks the input (a :class:`~vispos.NestedTensor` of ``n_spatial`` axes and ``in_chans``
    channels, on the model's device), runs :meth:`_features` on its tensors and pairs every level
    with the batch's mask resized to it (:meth:`~vispos.NestedTensor.with_features`, which keeps
    the batch's rectangular sizes). Subclasses set ``body``, ``in_chans``, ``num_channels``,
    ``strides`` and ``n_spatial`` and implement :meth:`_features`.

    Shape:
        - input: NestedTensor ``(B, in_chans, *S)``, ``len(S) == n_spatial``.
        - output: list of NestedTensor ``(B, num_channels[l], *S_l)``.

    Raises:
        TypeError: ``x`` is not a NestedTensor.
        ValueError: ``x.tensors`` has another rank or channel count, or is on another device.

    References:
        Carion et al., DETR ``models/backbone.py`` (``BackboneBase.forward``).
    """

    n_spatial: int = 2
    in_chans: int
    body: nn.Module

    def _features(self, tensors: Tensor) -> list[Tensor]:  # pragma: no cover - abstract
        """The feature maps of ``tensors``, one per level, each ``Tensor[B, C_l, *S_l]``."""
        raise NotImplementedError

    def forward(self, x: NestedTensor) -> list[NestedTensor]:
        axes = ", ".join("DHW"[-self.n_spatial:])
        if not isinstance(x, NestedTensor):
            raise TypeError(f"x must be a NestedTensor (B, C, {axes}), got {type(x).__name__}")
        tensors = x.tensors
        if tensors.dim() != 2 + self.n_spatial or tensors.shape[1] != self.in_chans:
            raise ValueError(
                f"x.tensors must have shape (B, {self.in_chans}, {axes}), got {tuple(tensors.shape)}"
            )
        check_input_device(tensors, self.body)
        return [x.with_features(f) for f in self._features(tensors)]
