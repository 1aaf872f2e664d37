"""Backbone + position embedding, as DETR's ``Joiner``, grown to Deformable-DETR's multi-scale
input: per-level input projections, extra stride-2 levels, a learned level embedding and the
flattened sequence form the transformer encoder consumes. 2D and 3D levels.

References:
    Carion et al., End-to-End Object Detection with Transformers, ECCV 2020
    (``models/backbone.py``, ``Joiner``); Zhu et al., Deformable DETR, ICLR 2021
    (``models/deformable_detr.py``: ``input_proj``, ``level_embed``; ``deformable_transformer.py``:
    flattening, ``spatial_shapes``, ``level_start_index``, ``get_valid_ratio``).
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from .. import _deprecation
from .._checks import check_bool, check_int, count
from ..encodings.grid import _GridEncoding
from ..levels import FlatLevels, flatten_levels, unflatten_levels
from ..nested_tensor import NestedTensor
from ._projections import InvariantProjection, invariant_projections
from .base import SpatialPositionEmbedding, backbone_axes

__all__ = ["Joiner", "FlatLevels", "flatten_levels", "unflatten_levels"]

__getattr__ = _deprecation.alias_getattr(__name__, {"valid_ratios": "vispos.padding:mask_valid_ratios"})

_CONV = {2: nn.Conv2d, 3: nn.Conv3d}
#: where a Joiner keeps its projections' rewritten graphs (a plain attribute, not a submodule)
_GRAPHS = "_invariant_projection_graphs"


def _grid_layout(module: nn.Module) -> tuple[int, bool] | None:
    """``(num_axes, channels_first)`` of a ``positional-encodings``-style grid encoding (vispos'
    own, or the ``positional_encodings`` package's when it is imported), else None. Such a module
    maps a tensor (not a NestedTensor) to an encoding of its shape and takes no ``dtype``."""
    if isinstance(module, _GridEncoding):
        return module.num_axes, module._channels_first
    peer = sys.modules.get("positional_encodings.torch_encodings")
    for n in (1, 2, 3):
        for permute in (False, True):
            cls = getattr(peer, f"PositionalEncoding{'Permute' if permute else ''}{n}D", None)
            if cls is not None and isinstance(module, cls):
                return n, permute
    return None


def _takes_dtype(module: nn.Module) -> bool:
    """Whether ``module.forward`` accepts a ``dtype=`` keyword (DETR's own embeddings do not)."""
    try:
        params = inspect.signature(module.forward).parameters.values()
    except (TypeError, ValueError):  # no introspectable signature: assume vispos' convention
        return True
    return any(p.name == "dtype" or p.kind is p.VAR_KEYWORD for p in params)


def _scale_stride(stride: Any, factor: int) -> Any:
    if isinstance(stride, tuple):
        return tuple(s * factor for s in stride)
    return None if stride is None else stride * factor


class Joiner(nn.Module):
    """Runs a backbone and embeds the positions of every level it returns; optionally projects
    the levels to ``hidden_dim``, adds stride-2 levels and keeps a learned level embedding
    (Deformable-DETR), and flattens them for a transformer (:meth:`flatten`).

    Without ``hidden_dim`` it is DETR's ``Joiner``: the backbone's levels as they are, each with
    its position embedding. With ``hidden_dim`` every backbone level goes through a 1x1
    convolution + ``GroupNorm(num_groups, hidden_dim)``, and ``num_feature_levels - n_backbone``
    extra levels are made by 3x3 stride-2 convolution + GroupNorm (the first from the backbone's
    last raw level, the next from the previous extra level), their masks resized from the input
    mask, exactly as Deformable-DETR. Convolutions are 2D or 3D after the backbone's
    ``num_axes``.

    Args:
        backbone (nn.Module): maps a :class:`NestedTensor` to a list of NestedTensor levels. A
            :class:`~vispos.backbones.base.Backbone` (``num_channels``, ``strides``,
            ``num_axes``: :class:`~vispos.backbones.TimmBackbone`,
            :class:`~vispos.backbones.TorchvisionBackbone`, :class:`~vispos.backbones.VolumeBackbone`)
            is needed for ``hidden_dim``; any other module is taken as a 2D backbone (DETR).
        position_embedding (nn.Module): maps a NestedTensor level to ``Tensor[B, C_pos, *S_l]``
            (e.g. :class:`~vispos.PositionEmbeddingSine`); called with ``dtype=`` the level's dtype
            when its ``forward`` takes that keyword (DETR's own embeddings do not: their output
            is cast to the level's dtype). When it reports ``out_channels(num_axes)``
            (:class:`~vispos.backbones.base.SpatialPositionEmbedding`), ``hidden_dim`` is checked
            against it. A channels-first grid encoding
            (:class:`~vispos.PositionalEncodingPermute2D` / ``3D``, or the
            ``positional_encodings`` package's own) is called on the level's tensor instead (0-based
            positions from the top-left corner, so the valid cells of a padded item get the
            positions they have alone); its ``org_channels`` must equal every level's channels.
        hidden_dim (int, optional): project every level to this many channels. Default None (no
            projection, DETR). Must equal the embedding's ``out_channels(num_axes)``.
        num_feature_levels (int, optional): total levels with ``hidden_dim``; the ones beyond the
            backbone's are extra stride-2 levels. Default: the backbone's count.
        level_embed (bool, optional): keep a learned ``(num_feature_levels, hidden_dim)`` table
            added to ``pos`` by :meth:`flatten`. Default: True when ``hidden_dim`` is given.
        input_proj (bool): build the projections (default True). False keeps the backbone's
            levels (then they must already have ``hidden_dim`` channels to be flattened) and allows
            no extra levels.
        num_groups (int): GroupNorm groups (Deformable-DETR: 32); must divide ``hidden_dim``.
        padding_invariant (bool, optional): GroupNorm of the projections takes each item's
            statistics over its valid cells, an extra level's 3x3 stride-2 convolution sees zeros
            outside the item and its padding comes from convolution arithmetic on each item's box,
            so a padded item gets what it gets alone: each projection is traced and rewritten by
            the rule book of :mod:`vispos.invariance`, as the backbones are (an arbitrary mask keeps
            DETR's nearest rule for the extra levels' masks). Default None: the backbone's own
            ``padding_invariant`` (False for a backbone without one). False: Deformable-DETR's
            numbers (GroupNorm over every cell, extra levels' masks resized from the input's).

    Attributes:
        num_channels (list[int]), strides (list): per output level (extra levels double the last
            stride). ``input_proj`` (nn.ModuleList | None), ``level_embed`` (nn.Parameter | None).

    Shape:
        - input: NestedTensor ``(B, C, *S)``, ``S`` 2D or 3D as the backbone takes.
        - output: ``(features, pos)``: ``features`` a list of NestedTensor ``(B, C_l, *S_l)``
          (``C_l = hidden_dim`` when projecting), ``pos`` a list of ``Tensor[B, C_pos, *S_l]`` in
          each level's dtype. The level embedding is **not** in ``pos``; :meth:`flatten` adds it.

    Raises:
        TypeError: ``backbone`` or ``position_embedding`` is not an ``nn.Module``; non-int sizes;
            the backbone returns something other than NestedTensors; a channel-last grid
            encoding (``PositionalEncoding2D``: the levels are channels-first, use its Permute
            twin).
        ValueError: ``num_feature_levels`` / ``level_embed`` without ``hidden_dim``; fewer levels
            than the backbone gives; extra levels without ``input_proj``; ``hidden_dim`` not
            divisible by ``num_groups`` or not equal to the embedding's channels; a grid
            encoding of another number of axes or channels than the levels.

    Note:
        Without ``padding_invariant``, GroupNorm takes its statistics over every cell, padding
        included, as in Deformable-DETR, so a projected level of a padded item differs from the
        same item alone; the backbone's own convolutions do the same unless it was built with
        ``padding_invariant=True``.

    References:
        DETR ``models/backbone.py``; Zhu et al., Deformable DETR, ICLR 2021.
    """

    def __init__(
        self,
        backbone: nn.Module,
        position_embedding: nn.Module,
        hidden_dim: int | None = None,
        num_feature_levels: int | None = None,
        level_embed: bool | None = None,
        input_proj: bool = True,
        num_groups: int = 32,
        padding_invariant: bool | None = None,
    ) -> None:
        super().__init__()
        for name, mod in (("backbone", backbone), ("position_embedding", position_embedding)):
            if not isinstance(mod, nn.Module):
                raise TypeError(f"{name} must be an nn.Module, got {type(mod).__name__}")
        hidden_dim = check_int(hidden_dim, "hidden_dim", minimum=1, optional=True)
        num_feature_levels = check_int(num_feature_levels, "num_feature_levels", minimum=1, optional=True)
        level_embed = check_bool(level_embed, "level_embed", optional=True)
        input_proj = check_bool(input_proj, "input_proj")
        num_groups = check_int(num_groups, "num_groups", minimum=1)
        padding_invariant = check_bool(padding_invariant, "padding_invariant", optional=True)
        self.backbone = backbone
        self.position_embedding = position_embedding
        axes = backbone_axes(backbone)
        described = axes is not None
        if hidden_dim is not None and not described:
            raise TypeError(
                f"hidden_dim needs a backbone that reports num_channels, strides and num_axes "
                f"(vispos.backbones.Backbone); {type(backbone).__name__} does not"
            )
        # an undescribed backbone (DETR's own, say) is taken as 2D with unknown levels
        self.num_axes = axes if described else 2
        back_channels = list(backbone.num_channels) if described else []
        n_back = len(back_channels)
        if hidden_dim is None:
            if num_feature_levels is not None and num_feature_levels != n_back:
                raise ValueError(
                    f"num_feature_levels={num_feature_levels} needs hidden_dim (extra levels are "
                    f"projected); the backbone gives {count(n_back, 'level')}"
                )
            if level_embed:
                raise ValueError("level_embed=True needs hidden_dim (the level embedding's width)")
        n_levels = n_back if num_feature_levels is None else num_feature_levels
        if hidden_dim is not None:
            if n_back == 0:
                raise ValueError("hidden_dim needs a backbone with num_channels (one per level)")
            if n_levels < n_back:
                raise ValueError(
                    f"num_feature_levels={n_levels} is fewer than the backbone's {count(n_back, 'level')}; "
                    "choose the backbone's levels with its out_indices / return_nodes instead"
                )
            if n_levels > n_back and not input_proj:
                raise ValueError(
                    f"num_feature_levels={n_levels} > {n_back} backbone levels needs input_proj=True"
                )
            if input_proj and hidden_dim % num_groups:
                raise ValueError(f"hidden_dim={hidden_dim} must be divisible by num_groups={num_groups}")
            if isinstance(position_embedding, SpatialPositionEmbedding):
                channels = position_embedding.out_channels(self.num_axes)
                if channels != hidden_dim:
                    raise ValueError(
                        f"hidden_dim={hidden_dim} must equal the position embedding's channels "
                        f"({type(position_embedding).__name__}.out_channels({self.num_axes}) = {channels})"
                    )
        self._grid = _grid_layout(position_embedding)
        if self._grid is not None:
            self._check_grid_encoding(
                position_embedding, back_channels, hidden_dim if input_proj else None
            )
        self._pass_dtype = self._grid is None and _takes_dtype(position_embedding)
        if padding_invariant is None:
            padding_invariant = bool(getattr(backbone, "padding_invariant", False))
        self.padding_invariant = padding_invariant
        self.hidden_dim = hidden_dim
        self.num_feature_levels = n_levels
        self.num_groups = num_groups
        self.use_input_proj = bool(hidden_dim is not None and input_proj)
        self.input_proj: nn.ModuleList | None = None
        if self.use_input_proj:
            conv = _CONV.get(self.num_axes)
            if conv is None:
                raise ValueError(f"input projections need 2D or 3D levels, backbone has num_axes={self.num_axes}")
            projs = [
                nn.Sequential(conv(c, hidden_dim, kernel_size=1), nn.GroupNorm(num_groups, hidden_dim))
                for c in back_channels
            ]
            in_c = back_channels[-1]
            for _ in range(n_levels - n_back):
                projs.append(nn.Sequential(
                    conv(in_c, hidden_dim, kernel_size=3, stride=2, padding=1),
                    nn.GroupNorm(num_groups, hidden_dim),
                ))
                in_c = hidden_dim
            self.input_proj = nn.ModuleList(projs)
            for proj in self.input_proj:  # Deformable-DETR's initialisation
                nn.init.xavier_uniform_(proj[0].weight, gain=1)
                nn.init.constant_(proj[0].bias, 0)
        if self.use_input_proj and padding_invariant:  # refused layers at construction, not first call
            self._invariant_graphs()
        want_embed = hidden_dim is not None if level_embed is None else level_embed
        self.level_embed: nn.Parameter | None = None
        if want_embed:
            self.level_embed = nn.Parameter(torch.empty(n_levels, hidden_dim))
            nn.init.normal_(self.level_embed)

    def _check_grid_encoding(self, enc: nn.Module, back_channels: list[int], hidden_dim: int | None) -> None:
        n, channels_first = self._grid
        name = type(enc).__name__
        if not channels_first:
            raise TypeError(
                f"position_embedding={name}(...) takes channel-last input (B, *S, C), but the "
                f"Joiner's levels are channels-first (B, C, *S): use PositionalEncodingPermute{n}D"
                f"({enc.org_channels}) instead"
            )
        if n != self.num_axes:
            raise ValueError(
                f"position_embedding={name}(...) encodes {n} spatial axes, but the backbone's "
                f"levels have {self.num_axes}; use PositionalEncodingPermute{self.num_axes}D"
            )
        level_channels = [hidden_dim] if hidden_dim is not None else back_channels
        wrong = sorted({c for c in level_channels if c != enc.org_channels})
        if wrong:
            raise ValueError(
                f"position_embedding={name}({enc.org_channels}) must have the levels' channels, "
                f"but they have {level_channels}; build it with channels={level_channels[0]}"
                + ("" if hidden_dim is not None else " or give the Joiner a hidden_dim")
            )

    def _embed(self, level: NestedTensor) -> Tensor:
        """The position embedding of one level, in the level's dtype."""
        dtype = level.tensors.dtype
        if self._grid is not None:
            channels = self.position_embedding.org_channels
            if level.tensors.shape[1] != channels:  # an undescribed backbone, checked here
                raise ValueError(
                    f"position_embedding={type(self.position_embedding).__name__}({channels}) got "
                    f"a level of {level.tensors.shape[1]} channels (shape "
                    f"{tuple(level.tensors.shape)}); build it with that many channels"
                )
            return self.position_embedding(level.tensors).to(dtype)
        if self._pass_dtype:
            return self.position_embedding(level, dtype=dtype)
        return self.position_embedding(level).to(dtype)

    n_spatial = _deprecation.renamed_attribute("n_spatial", "num_axes")

    @property
    def num_channels(self) -> list[int]:
        """Channels of each output level."""
        if self.use_input_proj:
            return [self.hidden_dim] * self.num_feature_levels
        return list(self.backbone.num_channels)

    @property
    def strides(self) -> list[Any]:
        """Stride of each output level (extra levels double the backbone's last)."""
        strides = list(self.backbone.strides)
        for k in range(self.num_feature_levels - len(strides)):
            strides.append(_scale_stride(self.backbone.strides[-1], 2 ** (k + 1)))
        return strides

    def forward(self, x: NestedTensor) -> tuple[list[NestedTensor], list[Tensor]]:
        levels = self.backbone(x)
        for i, level in enumerate(levels):
            if not isinstance(level, NestedTensor):
                raise TypeError(
                    f"backbone must return NestedTensor levels, got {type(level).__name__} at level {i}"
                )
        features: list[NestedTensor] = []
        if self.input_proj is None:
            features = list(levels)
        else:
            n_back = len(levels)
            if n_back != len(self.backbone.num_channels):
                raise ValueError(
                    f"backbone returned {count(n_back, 'level')} but reports {count(len(self.backbone.num_channels), 'channel count')}"
                )
            if self.padding_invariant:
                features = self._project_invariant(levels)
            else:
                for proj, level in zip(self.input_proj, levels):
                    features.append(level.with_features(proj(level.tensors)))
                source = levels[-1].tensors
                for proj in list(self.input_proj)[n_back:]:
                    source = proj(source)
                    features.append(x.with_features(source))
        pos = [self._embed(f) for f in features]
        return features, pos

    def _project_invariant(self, levels: list[NestedTensor]) -> list[NestedTensor]:
        """The projections run by the rule book (``padding_invariant``): statistics over valid
        cells, extra levels on zeros outside each item with paddings by convolution arithmetic
        (see :mod:`vispos.backbones._projections`)."""
        projections = self._invariant_graphs()
        features = [project(level) for project, level in zip(projections, levels)]
        source = levels[-1]
        for project in projections[len(levels):]:
            source = project(source)
            features.append(source)
        return features

    def _invariant_graphs(self) -> list[InvariantProjection]:
        """The rewritten graph of every projection, traced once and kept out of the submodules
        (so out of ``state_dict``); traced again for a projection whose layers were replaced."""
        cached = self.__dict__.get(_GRAPHS)
        graphs = invariant_projections(self.input_proj, self.num_axes, cached)
        if cached is None or len(graphs) != len(cached) or any(a is not b for a, b in zip(graphs, cached)):
            self.__dict__[_GRAPHS] = graphs
        return graphs

    def flatten(self, features: Sequence[NestedTensor], pos: Sequence[Tensor]) -> FlatLevels:
        """Flattens ``forward``'s output into Deformable-DETR's encoder input, adding the level
        embedding (when there is one) to ``pos``. See :func:`flatten_levels`."""
        return flatten_levels(features, pos, self.level_embed)

    def extra_repr(self) -> str:
        return (
            f"hidden_dim={self.hidden_dim}, num_feature_levels={self.num_feature_levels}, "
            f"level_embed={self.level_embed is not None}, input_proj={self.use_input_proj}, "
            f"num_groups={self.num_groups}, padding_invariant={self.padding_invariant}"
        )
