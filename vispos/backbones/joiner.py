"""Backbone + position embedding, as DETR's ``Joiner``.

References:
    Carion et al., End-to-End Object Detection with Transformers, ECCV 2020
    (``models/backbone.py``, ``Joiner``).
"""

from __future__ import annotations

from torch import Tensor, nn

from ..nested_tensor import NestedTensor

__all__ = ["Joiner"]


class Joiner(nn.Module):
    """Runs a backbone and embeds the positions of every level it returns.

    Args:
        backbone (nn.Module): maps a :class:`NestedTensor` to a list of NestedTensor levels
            (e.g. :class:`~vispos.backbones.TimmBackbone`).
        position_embedding (nn.Module): maps a NestedTensor level to ``Tensor[B, C_pos, *S_l]``
            (e.g. :class:`~vispos.PositionEmbeddingSine`); called with ``dtype=`` the level's
            dtype when it accepts it.

    Shape:
        - input: NestedTensor ``(B, C, *S)``.
        - output: ``(features, pos)``: ``features`` a list of NestedTensor ``(B, C_l, *S_l)``,
          ``pos`` a list of ``Tensor[B, C_pos, *S_l]`` in each level's dtype.

    Raises:
        TypeError: ``backbone`` or ``position_embedding`` is not an ``nn.Module``; the backbone
            returns something other than NestedTensors.

    References:
        DETR ``models/backbone.py``.
    """

    def __init__(self, backbone: nn.Module, position_embedding: nn.Module) -> None:
        super().__init__()
        for name, mod in (("backbone", backbone), ("position_embedding", position_embedding)):
            if not isinstance(mod, nn.Module):
                raise TypeError(f"{name} must be an nn.Module, got {type(mod).__name__}")
        self.backbone = backbone
        self.position_embedding = position_embedding

    @property
    def num_channels(self) -> list[int]:
        """Channels of each feature level (from the backbone)."""
        return list(self.backbone.num_channels)

    @property
    def strides(self) -> list[int]:
        """Stride of each feature level (from the backbone)."""
        return list(self.backbone.strides)

    def forward(self, x: NestedTensor) -> tuple[list[NestedTensor], list[Tensor]]:
        levels = self.backbone(x)
        features: list[NestedTensor] = []
        pos: list[Tensor] = []
        for i, level in enumerate(levels):
            if not isinstance(level, NestedTensor):
                raise TypeError(
                    f"backbone must return NestedTensor levels, got {type(level).__name__} at level {i}"
                )
            features.append(level)
            pos.append(self.position_embedding(level, dtype=level.tensors.dtype))
        return features, pos
