"""What a backbone and a spatial position embedding promise the :class:`~vispos.backbones.Joiner`.

Small typed interfaces (``typing.Protocol``), as timm's ``feature_info`` describes a
``features_only`` model: the Joiner and the CLI read them, never ``getattr`` with a default.

* :class:`Backbone`: ``num_channels`` (per level), ``strides`` (per level) and ``num_axes``
  (2 for images, 3 for volumes); called with a :class:`~vispos.NestedTensor`, it returns one
  NestedTensor per level. Any module with these works in the Joiner (a protocol: nothing to
  subclass); vispos' timm, torchvision and volume adapters satisfy it.
* :class:`BackboneAdapter`: the ``nn.Module`` base class of those adapters (their one
  ``forward``: input checks and each level paired with its resized mask). Subclass it only to
  write a new adapter. Its old name ``BackboneBase`` is a deprecated alias.
* :class:`SpatialPositionEmbedding`: ``out_channels(num_axes)``, the channels of its output for
  an input with ``num_axes`` spatial axes. :class:`~vispos.PositionEmbeddingSine`,
  :class:`~vispos.PositionEmbeddingSineDepthAdded` and
  :class:`~vispos.PositionEmbeddingLearned` satisfy it.

References:
    timm ``models/_features.py`` (``FeatureInfo.channels()``, ``.reduction()``);
    Carion et al., DETR ``models/backbone.py`` (``Backbone.num_channels``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, Sequence, runtime_checkable

import torch
import torch.fx as fx
from torch import Tensor, nn

from .. import _deprecation
from ..batching import nested_tensor_from_tensor_list
from ..nested_tensor import NestedTensor
from ..invariance import InvariantRunner, PackedRunner, check_graph_hooks

__all__ = ["Backbone", "BackboneAdapter", "SpatialPositionEmbedding", "backbone_border_effect"]

__getattr__ = _deprecation.alias_getattr(__name__, {"BackboneBase": "vispos.backbones.base:BackboneAdapter"})

_VISPOS = str(Path(__file__).resolve().parents[1])  # vispos' own files: not the caller of a deprecated name


@runtime_checkable
class Backbone(Protocol):
    """What the Joiner requires of a backbone (a ``typing.Protocol``: any module with these
    attributes qualifies, nothing to subclass; see :class:`BackboneAdapter` for vispos' base
    class of adapters).

    Attributes:
        num_channels (sequence of int): channels of each returned level.
        strides (sequence): each level's stride (an int, or a tuple per axis).
        num_axes (int): number of spatial axes of its input and levels (2 or 3).
    """

    num_channels: Sequence[int]
    strides: Sequence[Any]
    num_axes: int

    def __call__(self, x: Any) -> Any: ...


def backbone_axes(backbone: object) -> int | None:
    """``backbone.num_axes`` when ``backbone`` is a :class:`Backbone`, else None. One that reports
    the protocol's former ``n_spatial`` (with ``num_channels`` and ``strides``) is read too, with
    a ``DeprecationWarning`` attributed to the caller's line outside vispos."""
    if isinstance(backbone, Backbone):
        return int(backbone.num_axes)
    if all(hasattr(backbone, name) for name in ("num_channels", "strides", "n_spatial")):
        _deprecation.warn(
            f"{type(backbone).__name__}.n_spatial (the Backbone protocol) is deprecated and will be removed; "
            "name it num_axes instead", skip=(_VISPOS,),
        )
        return int(backbone.n_spatial)
    return None


@runtime_checkable
class SpatialPositionEmbedding(Protocol):
    """A position embedding the Joiner can pair with a backbone."""

    def out_channels(self, num_axes: int) -> int:
        """Channels of the embedding of an input with ``num_axes`` spatial axes."""
        ...


class BackboneAdapter(_deprecation.RenamedAttributes, nn.Module):
    """Base class of vispos' backbone adapters (timm, torchvision, volumes): their one ``forward``.

    Not the contract the Joiner checks (that is the :class:`Backbone` protocol, which any module
    can satisfy without subclassing); subclass this to adapt another feature extractor with
    vispos' input checks. Formerly ``BackboneBase`` (a deprecated alias for one release).

    Checks the input (a :class:`~vispos.NestedTensor` of ``num_axes`` axes and ``in_chans``
    channels, on the model's device), runs :meth:`_features` on its tensors and pairs every level
    with the batch's mask resized to it (:meth:`~vispos.NestedTensor.with_features`, DETR's
    nearest rule, which keeps the batch's rectangular sizes). With ``padding_invariant=True`` the
    body is a rewritten graph (:mod:`vispos.invariance`) that fills each layer's padding
    and takes statistics over valid cells, and each level's padding comes from convolution
    arithmetic on every item's box. Subclasses set ``body``, ``in_chans``, ``num_channels``,
    ``strides`` and ``num_axes`` and implement :meth:`_features`.

    Shape:
        - input: NestedTensor ``(B, in_chans, *S)``, ``len(S) == num_axes``.
        - output: list of NestedTensor ``(B, num_channels[l], *S_l)``.

    Raises:
        TypeError: ``x`` is not a NestedTensor; ``x.tensors`` is an integer tensor (convert and
            normalize images first), or floating of another dtype than the weights outside
            ``torch.autocast``.
        ValueError: ``x.tensors`` has another rank or channel count, or is on another device; with
            ``padding_invariant=True``, an arbitrary (non-box) mask, an item whose offset is not a
            multiple of the strides, or an item too small for the backbone.

    References:
        Carion et al., DETR ``models/backbone.py`` (``BackboneBase.forward``).
    """

    num_axes: int = 2
    _renamed = {"n_spatial": "num_axes"}
    in_chans: int
    body: nn.Module
    #: set by ``padding_invariant=True``: runs the rewritten graph and gives each level its padding
    _invariant: InvariantRunner | None = None
    #: set by ``packed=True``: every item's tokens in one sequence (takes a list of images too)
    _packed: PackedRunner | None = None

    @property
    def padding_invariant(self) -> bool:
        """bool: every level of an item in a padded batch equals, on the item's cells, what the
        backbone gives the item alone (``padding_invariant=True`` or ``packed=True`` at construction)."""
        return self._invariant is not None or self._packed is not None

    def _features(self, tensors: Tensor) -> list[Tensor]:  # pragma: no cover - abstract
        """The feature maps of ``tensors``, one per level, each ``Tensor[B, C_l, *S_l]``."""
        raise NotImplementedError

    def forward(self, x: NestedTensor) -> list[NestedTensor]:
        axes = ", ".join("DHW"[-self.num_axes:])
        if self._packed is not None and isinstance(x, (list, tuple)):
            for item in x[:1]:  # the runner checks that the items agree
                _check_device(item, self.body)
                _check_dtype(item, self.body)
            return self._packed(self.body, x)
        if not isinstance(x, NestedTensor):
            raise TypeError(f"x must be a NestedTensor (B, C, {axes}), got {type(x).__name__}")
        tensors = x.tensors
        if tensors.dim() != 2 + self.num_axes or tensors.shape[1] != self.in_chans:
            raise ValueError(
                f"x.tensors must have shape (B, {self.in_chans}, {axes}), got {tuple(tensors.shape)}"
            )
        _check_device(tensors, self.body)
        _check_dtype(tensors, self.body)
        if self._packed is not None:
            return self._packed(self.body, x)
        if isinstance(self.body, fx.GraphModule):
            check_graph_hooks(self.body, "padding_invariant=True" if self._invariant is not None
                              else f"{type(self).__name__} (torch.fx feature extraction)",
                              padding=x.padding if self._invariant is not None else None)
        if self._invariant is not None:
            return self._invariant(self.body, x)
        return [x.with_features(f) for f in self._features(tensors)]


def _check_device(tensors: Tensor, module: nn.Module) -> None:
    """Raises ``ValueError`` when ``tensors`` and ``module``'s first parameter are on different
    devices (torch would otherwise fail deep inside the first convolution)."""
    param = next(iter(module.parameters()), None)
    if param is not None and param.device != tensors.device:
        raise ValueError(
            f"x is on {tensors.device} but the backbone's weights are on {param.device}; move the "
            f"model with .to({str(tensors.device)!r}) or the batch with x.to({str(param.device)!r})"
        )


_AUTOCAST_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _check_dtype(tensors: Tensor, module: nn.Module) -> None:
    """Raises ``TypeError`` when ``tensors`` cannot go through ``module``'s weights as they are
    (torch would otherwise fail inside the first convolution with "expected scalar type Byte but
    found Float"): an integer batch always (images must be converted to float and normalized
    first), a floating batch of another dtype than the weights unless ``torch.autocast`` is on
    for its device and both are float32 / float16 / bfloat16 (autocast then casts them)."""
    param = next((p for p in module.parameters() if p.is_floating_point()), None)
    if param is None or tensors.dtype == param.dtype:
        return
    if not tensors.is_floating_point():
        raise TypeError(
            f"x.tensors has dtype {tensors.dtype} but the backbone's weights are {param.dtype}; "
            "convert the images to float and normalize them first, e.g. "
            "torchvision.transforms.v2.ToDtype(torch.float32, scale=True) then Normalize(mean, std) "
            "(or x.tensors.float() / 255)"
        )
    device_type = tensors.device.type
    if (
        torch.is_autocast_enabled(device_type)
        and tensors.dtype in _AUTOCAST_DTYPES
        and param.dtype in _AUTOCAST_DTYPES
    ):
        return
    raise TypeError(
        f"x.tensors has dtype {tensors.dtype} but the backbone's weights are {param.dtype}; cast "
        f"the batch with x.to({param.dtype}) or the model with .to({tensors.dtype}), or run under "
        f"torch.autocast({device_type!r}) (float32, float16 and bfloat16 only)"
    )


@_deprecation.renamed_kwargs(padded_size="spatial")
@torch.no_grad()
def backbone_border_effect(
    backbone: nn.Module, item: Tensor, spatial: Sequence[int], pad_value: float = 0.0
) -> list[dict[str, float]]:
    """How much a backbone's features on an item's valid cells change when the item is padded.

    Runs the backbone (in its current mode; call ``eval()`` first for batch norm) on the item
    alone and on the item padded to ``spatial`` (placed at the origin, ``pad_value`` around
    it, as :func:`~vispos.nested_tensor_from_tensor_list` does), and compares each level on the
    cells the alone run produced.

    Args:
        backbone (nn.Module): maps a NestedTensor to NestedTensor levels.
        item (Tensor[C, *S]): one image or volume.
        spatial (sequence of int): the padded batch's spatial size, ``>= S`` on every axis.
        pad_value (float): the padding value.

    Returns:
        list of dict per level: ``max_abs`` (largest absolute change), ``mean_abs``, ``scale``
        (standard deviation of the alone features), ``rel_max`` (``max_abs / scale``) and
        ``frac_cells`` (fraction of the item's cells whose largest channel change exceeds
        ``1e-3 * scale``).

    Raises:
        ValueError: ``spatial`` has the wrong length or is smaller than the item.

    References:
        Carion et al., DETR, ECCV 2020 (padded batches through a convolutional backbone).
    """
    own = tuple(item.shape[1:])
    padded = tuple(int(s) for s in spatial)
    if len(padded) != len(own) or any(p < s for p, s in zip(padded, own)):
        raise ValueError(f"spatial must have {len(own)} entries >= {own}, got {tuple(spatial)}")
    alone = NestedTensor(item[None], torch.zeros((1, *own), dtype=torch.bool, device=item.device))
    filler = item.new_full((item.shape[0], *padded), pad_value)
    batch = nested_tensor_from_tensor_list([item, filler], pad_value=pad_value)
    out = []
    for a, p in zip(backbone(alone), backbone(batch)):
        region = (0, slice(None), *(slice(0, s) for s in a.tensors.shape[2:]))
        ref, got = a.tensors[region].float(), p.tensors[region].float()
        diff = (got - ref).abs()
        scale = float(ref.std()) or 1.0
        per_cell = diff.amax(0)
        out.append({
            "max_abs": float(diff.max()),
            "mean_abs": float(diff.mean()),
            "scale": scale,
            "rel_max": float(diff.max()) / scale,
            "frac_cells": float((per_cell > 1e-3 * scale).float().mean()),
        })
    return out
