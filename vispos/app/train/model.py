"""The demos' DETR: backbone -> Joiner (position embedding) -> DetrEncoder -> DetrDecoder -> heads,
in 2D or 3D, with the three position arms of the ablation.

Position arms (``make_position_embedding``), the only difference between runs of one seed:

* ``none``: zeros (:class:`ZeroPosition`);
* ``grid``: positional-encodings' grid over the padded canvas, blind to the mask
  (:class:`MaskBlindGrid`: ``PositionalEncodingPermute2D`` / ``3D``);
* ``sine``: :class:`vispos.PositionEmbeddingSine` with ``normalize=True`` on the mask (DETR:
  positions over each item's own valid extent).

None of them has parameters or draws random numbers, so a model built after
``torch.manual_seed(s)`` has the same initial weights in every arm.

References:
    Carion et al., End-to-End Object Detection with Transformers, ECCV 2020 (``models/detr.py``:
    ``DETR``, ``MLP``; ``models/transformer.py``: ``Transformer.forward``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

import vispos
from vispos import _deprecation
from vispos._checks import check_bool, check_choice, check_int
from vispos.backbones import Joiner
from vispos.transformer import DetrEncoder

from ._args import POS_ARMS
from .decoder import DetrDecoder

__all__ = ["POS_ARMS", "ZeroPosition", "MaskBlindGrid", "make_position_embedding", "MLP", "DetrModel"]

_GRIDS = {2: vispos.PositionalEncodingPermute2D, 3: vispos.PositionalEncodingPermute3D}


class ZeroPosition(nn.Module):
    """Arm (a): no position embedding, ``Tensor[B, num_axes * num_pos_feats, *S]`` of zeros.

    Args:
        num_pos_feats (int): channels per spatial axis.
    """

    def __init__(self, num_pos_feats: int) -> None:
        super().__init__()
        self.num_pos_feats = check_int(num_pos_feats, "num_pos_feats", minimum=1)

    @_deprecation.renamed_kwargs(n_axes="num_axes")
    def out_channels(self, num_axes: int) -> int:
        return num_axes * self.num_pos_feats

    def forward(self, x: vispos.NestedTensor, dtype: torch.dtype | None = None) -> Tensor:
        t = x.tensors
        shape = (t.shape[0], self.out_channels(t.dim() - 2), *t.shape[2:])
        return t.new_zeros(shape, dtype=dtype or t.dtype)

    def extra_repr(self) -> str:
        return f"num_pos_feats={self.num_pos_feats}"


class MaskBlindGrid(nn.Module):
    """Arm (b): positional-encodings' grid encoding of the padded feature map; the mask is ignored.

    Args:
        num_pos_feats (int): channels per spatial axis (the grid gets ``num_axes * num_pos_feats``).
        num_axes (int): 2 (``PositionalEncodingPermute2D``) or 3 (``PositionalEncodingPermute3D``).

    Shape:
        NestedTensor ``(B, C, *S)`` -> ``Tensor[B, num_axes * num_pos_feats, *S]``: integer cell
        positions over the whole padded canvas (positional-encodings' convention).
    """

    n_axes = _deprecation.renamed_attribute("n_axes", "num_axes")

    @_deprecation.renamed_kwargs(n_axes="num_axes")
    def __init__(self, num_pos_feats: int, num_axes: int = 2) -> None:
        super().__init__()
        self.num_pos_feats = check_int(num_pos_feats, "num_pos_feats", minimum=1)
        self.num_axes = check_choice(num_axes, tuple(_GRIDS), "num_axes")
        self.grid = _GRIDS[num_axes](num_axes * num_pos_feats)

    @_deprecation.renamed_kwargs(n_axes="num_axes")
    def out_channels(self, num_axes: int) -> int:
        return num_axes * self.num_pos_feats

    def forward(self, x: vispos.NestedTensor, dtype: torch.dtype | None = None) -> Tensor:
        t = x.tensors
        # the grid's width is the input's channel count: ask it for a tensor of the right width
        width = self.out_channels(self.num_axes)
        pos = self.grid(t if t.shape[1] == width else t.new_empty((t.shape[0], width, *t.shape[2:])))
        return pos if dtype is None else pos.to(dtype)

    def extra_repr(self) -> str:
        return f"num_pos_feats={self.num_pos_feats}, num_axes={self.num_axes}"


@_deprecation.renamed_kwargs(n_axes="num_axes")
def make_position_embedding(arm: str, hidden_dim: int, num_axes: int = 2) -> nn.Module:
    """The position embedding of one ablation arm, ``hidden_dim`` channels over ``num_axes`` axes.

    Raises:
        ValueError: ``arm`` not in :data:`POS_ARMS`; ``hidden_dim`` not divisible by
            ``2 * num_axes`` (sine and cosine per axis).
    """
    if arm not in POS_ARMS:
        raise ValueError(f"pos must be one of {POS_ARMS}, got {arm!r}")
    check_int(hidden_dim, "hidden_dim", minimum=1)
    if hidden_dim % (2 * num_axes):
        raise ValueError(
            f"hidden_dim={hidden_dim} must be divisible by {2 * num_axes} (sine and cosine for each of "
            f"{num_axes} axes)"
        )
    feats = hidden_dim // num_axes
    if arm == "none":
        return ZeroPosition(feats)
    if arm == "grid":
        return MaskBlindGrid(feats, num_axes)
    return vispos.PositionEmbeddingSine(feats, normalize=True)


class MLP(nn.Module):
    """DETR's box head: ``num_layers`` linear layers with ReLU between them."""

    def __init__(self, input_dim: int, hidden_dim: int, output_dim: int, num_layers: int) -> None:
        super().__init__()
        dims = [input_dim] + [hidden_dim] * (num_layers - 1)
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims, dims[1:] + [output_dim]))

    def forward(self, x: Tensor) -> Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x) if i == len(self.layers) - 1 else torch.relu(layer(x))
        return x


class DetrModel(nn.Module):
    """DETR over a vispos backbone, 2D or 3D, optionally with reference points.

    ``backbone`` -> :class:`~vispos.backbones.Joiner` (1x1 projection to ``hidden_dim`` +
    GroupNorm, ``position_embedding`` per level) -> :class:`~vispos.transformer.DetrEncoder`
    (positions on queries and keys) -> :class:`DetrDecoder` (zero targets, learned query
    positions on queries and keys at every layer, memory positions on the cross-attention's keys
    only) -> a linear class head and a 3-layer MLP box head (sigmoid), on every decoder layer.

    With ``reference_points`` (Deformable / Conditional DETR's box parametrisation), each query
    has a reference centre ``ref = sigmoid(Linear(query_pos))`` (``Tensor[Q, num_axes]``) and every
    layer predicts its box centre relative to it: ``centre = sigmoid(logit(ref) + head[:n])``,
    ``size = sigmoid(head[n:])``. The attention is unchanged (positions only on queries and keys,
    the values position-free); the query's identity reaches the box through its reference, which
    plain DETR can only learn through the attended content (its slow convergence).

    Args:
        backbone (nn.Module): a :class:`vispos.backbones.Backbone` (TimmBackbone, VolumeBackbone).
        position_embedding (nn.Module): e.g. from :func:`make_position_embedding`.
        num_classes (int): object classes ``K`` (a no-object class is added).
        hidden_dim, num_queries, enc_layers, dec_layers, nhead, dim_feedforward (int): sizes.
        dropout (float): in the transformer. Default 0 (deterministic runs).
        num_groups (int): GroupNorm groups of the input projection.
        normalize_before (bool): pre-norm encoder and decoder layers (DETR's ``--pre_norm``).
        reference_points (bool): predict box centres relative to per-query reference points.
            Default False (plain DETR).

    Shape:
        ``forward(NestedTensor (B, C, *S))`` -> ``{"pred_logits": Tensor[B, Q, K + 1],
        "pred_boxes": Tensor[B, Q, 2 * num_axes], "aux_outputs": [{...} per earlier decoder layer]}``
        (DETR's output dict), plus ``"reference_points": Tensor[Q, num_axes]`` with
        ``reference_points``. Boxes are center-size in ``[0, 1]``, relative to each item's own
        (unpadded) size, coordinates in the order the task's box ops use.

    Raises:
        TypeError / ValueError: from the Joiner, encoder and decoder (sizes, divisibility).
    """

    n_axes = _deprecation.renamed_attribute("n_axes", "num_axes")

    def __init__(
        self, backbone: nn.Module, position_embedding: nn.Module, num_classes: int, hidden_dim: int = 64,
        num_queries: int = 10, enc_layers: int = 2, dec_layers: int = 2, nhead: int = 4,
        dim_feedforward: int = 128, dropout: float = 0.0, num_groups: int = 8, normalize_before: bool = False,
        reference_points: bool = False,
    ) -> None:
        super().__init__()
        check_int(num_classes, "num_classes", minimum=1)
        check_int(num_queries, "num_queries", minimum=1)
        self.joiner = Joiner(backbone, position_embedding, hidden_dim=hidden_dim, level_embed=False,
                             num_groups=num_groups)
        self.num_axes = self.joiner.num_axes
        self.encoder = DetrEncoder(hidden_dim, nhead, enc_layers, dim_feedforward, dropout=dropout,
                                   normalize_before=normalize_before)
        self.decoder = DetrDecoder(hidden_dim, nhead, dec_layers, dim_feedforward, dropout=dropout,
                                   normalize_before=normalize_before)
        self.query_embed = nn.Embedding(num_queries, hidden_dim)
        self.class_embed = nn.Linear(hidden_dim, num_classes + 1)
        self.bbox_embed = MLP(hidden_dim, hidden_dim, 2 * self.num_axes, 3)
        self.num_classes, self.num_queries = num_classes, num_queries
        self.reference_points: nn.Linear | None = None
        if check_bool(reference_points, "reference_points"):
            self.reference_points = nn.Linear(hidden_dim, self.num_axes)
            nn.init.xavier_uniform_(self.reference_points.weight)  # Deformable DETR's initialisation
            nn.init.zeros_(self.reference_points.bias)

    def forward(self, x: vispos.NestedTensor) -> dict[str, Any]:
        flat = self.joiner.flatten(*self.joiner(x))
        memory = self.encoder(flat)
        query_pos = self.query_embed.weight[None].expand(memory.shape[0], -1, -1)
        hs = self.decoder(
            torch.zeros_like(query_pos), memory, pos=flat.pos, query_pos=query_pos,
            memory_key_padding_mask=flat.key_padding_mask,
        )  # (L, B, Q, C)
        logits, raw = self.class_embed(hs), self.bbox_embed(hs)
        out: dict[str, Any] = {}
        if self.reference_points is not None:
            ref = self.reference_points(self.query_embed.weight).sigmoid()  # (Q, n)
            n = self.num_axes
            raw = torch.cat([raw[..., :n] + torch.logit(ref, eps=1e-5), raw[..., n:]], -1)
            out["reference_points"] = ref
        boxes = raw.sigmoid()
        out.update({
            "pred_logits": logits[-1], "pred_boxes": boxes[-1],
            "aux_outputs": [{"pred_logits": lg, "pred_boxes": bx} for lg, bx in zip(logits[:-1], boxes[:-1])],
        })
        return out

    def extra_repr(self) -> str:
        return (f"num_classes={self.num_classes}, num_queries={self.num_queries}, num_axes={self.num_axes}, "
                f"reference_points={self.reference_points is not None}")
