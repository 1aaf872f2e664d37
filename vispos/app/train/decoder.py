"""DETR's transformer decoder: learned query positions on queries and keys, memory positions on
the cross-attention's keys only.

What each attention sees, per layer (DETR ``models/transformer.py``, ``forward_post``):

* self-attention: ``query = key = tgt + query_pos``, ``value = tgt``;
* cross-attention: ``query = tgt + query_pos``, ``key = memory + pos``, ``value = memory``, padded
  memory cells ignored through ``memory_key_padding_mask``;
* then a feed-forward block; post-norm (DETR's default) or pre-norm (``normalize_before``).

The decoder starts from zero targets (:class:`DetrDecoder` is called with
``tgt = zeros_like(query_pos)``) and applies its final LayerNorm to every layer's output, so the
heads see one normalised output per layer (DETR's ``return_intermediate`` for the auxiliary
losses). The encoder side is :class:`vispos.transformer.DetrEncoder` (positions on queries and
keys).

References:
    Carion et al., End-to-End Object Detection with Transformers, ECCV 2020
    (``models/transformer.py``: ``TransformerDecoderLayer``, ``TransformerDecoder``).
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from vispos._checks import check_bool, check_int
from vispos.padding import check_mask
from vispos.transformer import set_layer_args

__all__ = ["DetrDecoderLayer", "DetrDecoder"]


def _with_pos(x: Tensor, pos: Tensor | None) -> Tensor:
    return x if pos is None else x + pos


class DetrDecoderLayer(nn.Module):
    """One DETR decoder layer: self-attention over the queries, cross-attention into the memory,
    feed-forward block.

    Args:
        d_model (int): channels ``C``.
        nhead (int): attention heads; must divide ``d_model``. Default 8.
        dim_feedforward (int): hidden width of the feed-forward block. Default 2048.
        dropout (float): in ``[0, 1)``. Default 0.1 (DETR).
        activation (str): ``"relu"`` (DETR) or ``"gelu"``.
        normalize_before (bool): pre-norm. Default False (DETR's default, post-norm).

    Shape:
        - ``tgt`` ``Tensor[B, Q, C]``, ``query_pos`` ``Tensor[B, Q, C]`` or ``Tensor[Q, C]`` or
          None; ``memory`` ``Tensor[B, N, C]``, ``pos`` ``Tensor[B, N, C]`` or None;
          ``memory_key_padding_mask`` ``Tensor[B, N]`` bool (True = padding) or None.
        - output ``Tensor[B, Q, C]``, ``tgt``'s dtype.

    Raises:
        TypeError: a non-int size, a non-bool flag or a non-bool mask.
        ValueError: ``nhead`` does not divide ``d_model``; ``dropout`` outside ``[0, 1)``; an
            unknown ``activation``; at forward, shapes that do not fit ``d_model`` or each other.

    References:
        DETR ``models/transformer.py`` (``TransformerDecoderLayer.forward_post`` / ``forward_pre``).
    """

    def __init__(
        self,
        d_model: int,
        nhead: int = 8,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        activation: str = "relu",
        normalize_before: bool = False,
    ) -> None:
        super().__init__()
        set_layer_args(self, d_model, nhead, dim_feedforward, dropout, activation, normalize_before)
        d_model, nhead, dim_feedforward, dropout = self.d_model, self.nhead, self.dim_feedforward, self.dropout_p
        self.self_attn = nn.MultiheadAttention(d_model, nhead, dropout=dropout, batch_first=True)
        self.multihead_attn = nn.MultiheadAttention(d_model, nhead, dropout=dropout, batch_first=True)
        self.linear1 = nn.Linear(d_model, dim_feedforward)
        self.linear2 = nn.Linear(dim_feedforward, d_model)
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(d_model), nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.dropout1, self.dropout2, self.dropout3 = nn.Dropout(dropout), nn.Dropout(dropout), nn.Dropout(dropout)

    def _self(self, x: Tensor, query_pos: Tensor | None) -> Tensor:
        q = k = _with_pos(x, query_pos)
        return self.self_attn(q, k, value=x, need_weights=False)[0]

    def _cross(self, x: Tensor, memory: Tensor, pos: Tensor | None, query_pos: Tensor | None,
               mask: Tensor | None) -> Tensor:
        return self.multihead_attn(
            query=_with_pos(x, query_pos), key=_with_pos(memory, pos), value=memory,
            key_padding_mask=mask, need_weights=False,
        )[0]

    def _ffn(self, x: Tensor) -> Tensor:
        return self.linear2(self.dropout(self.activation(self.linear1(x))))

    def forward(
        self,
        tgt: Tensor,
        memory: Tensor,
        pos: Tensor | None = None,
        query_pos: Tensor | None = None,
        memory_key_padding_mask: Tensor | None = None,
    ) -> Tensor:
        _check_inputs(tgt, memory, pos, query_pos, memory_key_padding_mask, self.d_model)
        if query_pos is not None and query_pos.dim() == 2:
            query_pos = query_pos.expand(tgt.shape[0], -1, -1)
        mask = memory_key_padding_mask
        if self.normalize_before:
            tgt = tgt + self.dropout1(self._self(self.norm1(tgt), query_pos))
            tgt = tgt + self.dropout2(self._cross(self.norm2(tgt), memory, pos, query_pos, mask))
            return tgt + self.dropout3(self._ffn(self.norm3(tgt)))
        tgt = self.norm1(tgt + self.dropout1(self._self(tgt, query_pos)))
        tgt = self.norm2(tgt + self.dropout2(self._cross(tgt, memory, pos, query_pos, mask)))
        return self.norm3(tgt + self.dropout3(self._ffn(tgt)))

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, nhead={self.nhead}, dim_feedforward={self.dim_feedforward}, "
            f"dropout={self.dropout_p}, activation={self.activation_name!r}, "
            f"normalize_before={self.normalize_before}"
        )


def _shape(x: object) -> object:
    return tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__


def _check_inputs(tgt: Tensor, memory: Tensor, pos: Tensor | None, query_pos: Tensor | None,
                  mask: Tensor | None, d_model: int) -> None:
    if not isinstance(tgt, Tensor) or tgt.dim() != 3 or tgt.shape[-1] != d_model:
        raise ValueError(f"tgt must be a Tensor[B, Q, {d_model}] (batch-first), got {_shape(tgt)}")
    if not isinstance(memory, Tensor) or memory.dim() != 3 or memory.shape[-1] != d_model \
            or memory.shape[0] != tgt.shape[0]:
        raise ValueError(
            f"memory must be a Tensor[{tgt.shape[0]}, N, {d_model}] (tgt's batch), got {_shape(memory)}"
        )
    if pos is not None and (not isinstance(pos, Tensor) or pos.shape != memory.shape):
        raise ValueError(f"pos must have memory's shape {tuple(memory.shape)}, got {_shape(pos)}")
    if query_pos is not None and (
        not isinstance(query_pos, Tensor) or tuple(query_pos.shape) not in (tuple(tgt.shape), tuple(tgt.shape[1:]))
    ):
        raise ValueError(
            f"query_pos must have tgt's shape {tuple(tgt.shape)} or {tuple(tgt.shape[1:])}, got {_shape(query_pos)}"
        )
    if mask is not None:
        check_mask(mask, "memory_key_padding_mask")
        if tuple(mask.shape) != tuple(memory.shape[:2]):
            raise ValueError(
                f"memory_key_padding_mask must have shape {tuple(memory.shape[:2])}, got {tuple(mask.shape)}"
            )


class DetrDecoder(nn.Module):
    """A stack of :class:`DetrDecoderLayer` with a final LayerNorm (DETR's ``TransformerDecoder``).

    Args:
        d_model (int): channels ``C``. Default 256.
        nhead, dim_feedforward, dropout, activation, normalize_before: as
            :class:`DetrDecoderLayer` (defaults 8, 2048, 0.1, ``"relu"``, False).
        num_layers (int): Default 6.
        return_intermediate (bool): return every layer's normalised output (for DETR's auxiliary
            losses), not only the last. Default True.

    Shape:
        ``forward(tgt, memory, pos, query_pos, memory_key_padding_mask)`` with the shapes of
        :class:`DetrDecoderLayer` -> ``Tensor[L, B, Q, C]`` (``L = num_layers``, last layer last)
        with ``return_intermediate``, else ``Tensor[B, Q, C]``. DETR starts from
        ``tgt = torch.zeros_like(query_pos)``.

    Raises:
        TypeError / ValueError: as :class:`DetrDecoderLayer`; ``num_layers < 1``.

    References:
        DETR ``models/transformer.py`` (``TransformerDecoder``, ``Transformer._reset_parameters``:
        xavier-uniform initialisation of every weight matrix).
    """

    def __init__(
        self,
        d_model: int = 256,
        nhead: int = 8,
        num_layers: int = 6,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        activation: str = "relu",
        normalize_before: bool = False,
        return_intermediate: bool = True,
    ) -> None:
        super().__init__()
        check_int(num_layers, "num_layers", minimum=1)
        check_bool(return_intermediate, "return_intermediate")
        layer = DetrDecoderLayer(d_model, nhead, dim_feedforward, dropout, activation, normalize_before)
        self.layers = nn.ModuleList([copy.deepcopy(layer) for _ in range(num_layers)])
        for p in self.layers.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
        self.norm = nn.LayerNorm(d_model)
        self.d_model, self.num_layers, self.return_intermediate = d_model, num_layers, return_intermediate

    def forward(
        self,
        tgt: Tensor,
        memory: Tensor,
        pos: Tensor | None = None,
        query_pos: Tensor | None = None,
        memory_key_padding_mask: Tensor | None = None,
    ) -> Tensor:
        out, intermediate = tgt, []
        for layer in self.layers:
            out = layer(out, memory, pos, query_pos, memory_key_padding_mask)
            if self.return_intermediate:
                intermediate.append(self.norm(out))
        if self.return_intermediate:
            return torch.stack(intermediate)
        return self.norm(out)

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, num_layers={self.num_layers}, "
            f"return_intermediate={self.return_intermediate}"
        )
