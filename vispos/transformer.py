"""The DETR transformer encoder over flattened feature levels (positions added to queries and keys).

The encoder adds ``pos`` to queries and keys (not values) in every layer and ignores padded keys
through ``key_padding_mask``, as DETR does; so the output on an item's valid cells does not
depend on how much padding the batch added (tests check it in 2D and 3D). The backbone is another
matter: its convolutions see the padding near the border, which
:func:`vispos.backbones.backbone_border_effect` measures.

References:
    Carion et al., End-to-End Object Detection with Transformers, ECCV 2020
    (``models/transformer.py``: ``TransformerEncoderLayer.forward_post`` / ``forward_pre``).
"""

from __future__ import annotations

import copy

import torch.nn.functional as F
from torch import Tensor, nn

from ._checks import check_bool, check_choice, check_dropout, check_int
from .levels import FlatLevels
from .padding import check_mask

__all__ = ["DetrEncoderLayer", "DetrEncoder"]

_ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}


def set_layer_args(
    layer: nn.Module, d_model: int, nhead: int, dim_feedforward: int, dropout: float,
    activation: str, normalize_before: bool,
) -> None:
    """Checks a DETR transformer layer's arguments and stores them on ``layer`` (``d_model``,
    ``nhead``, ``dim_feedforward``, ``dropout_p``, ``activation_name``, ``normalize_before``,
    ``activation``); shared by the encoder layer here and the demos' decoder layer.

    Raises:
        TypeError: a non-int size, a non-number ``dropout``, a non-bool ``normalize_before``.
        ValueError: a size < 1; ``nhead`` does not divide ``d_model``; ``dropout`` outside
            ``[0, 1)``; an unknown ``activation``.

    References:
        DETR ``models/transformer.py`` (the layers' arguments and their defaults).
    """
    d_model = check_int(d_model, "d_model", minimum=1)
    nhead = check_int(nhead, "nhead", minimum=1)
    dim_feedforward = check_int(dim_feedforward, "dim_feedforward", minimum=1)
    if d_model % nhead:
        raise ValueError(f"nhead={nhead} must divide d_model={d_model}")
    dropout = check_dropout(dropout)
    activation = check_choice(activation, tuple(_ACTIVATIONS), "activation")
    normalize_before = check_bool(normalize_before, "normalize_before")
    layer.d_model, layer.nhead, layer.dim_feedforward = d_model, nhead, dim_feedforward
    layer.dropout_p, layer.activation_name, layer.normalize_before = float(dropout), activation, normalize_before
    layer.activation = _ACTIVATIONS[activation]


class DetrEncoderLayer(nn.Module):
    """One DETR encoder layer: self-attention with ``pos`` added to queries and keys, then a
    feed-forward block; post-norm by default, pre-norm with ``normalize_before``.

    Args:
        d_model (int): channels ``C``.
        nhead (int): attention heads; must divide ``d_model``. Default 8.
        dim_feedforward (int): hidden width of the feed-forward block. Default 2048.
        dropout (float): in ``[0, 1)``. Default 0.1 (DETR); 0 for deterministic tests.
        activation (str): ``"relu"`` (DETR) or ``"gelu"``.
        normalize_before (bool): pre-norm. Default False (DETR's default).

    Shape:
        - ``src`` ``Tensor[B, N, C]`` (batch-first), ``pos`` ``Tensor[B, N, C]`` or None,
          ``key_padding_mask`` ``Tensor[B, N]`` bool (True = padding) or None.
        - output ``Tensor[B, N, C]``, ``src``'s dtype.

    Raises:
        TypeError: a non-int size, a non-number ``dropout``, a non-str ``activation``, a non-bool
            ``normalize_before``; at forward, a ``src`` / ``pos`` that is not a tensor or a
            non-bool ``key_padding_mask``.
        ValueError: a non-positive size; ``nhead`` does not divide ``d_model``; ``dropout``
            outside ``[0, 1)``; an unknown ``activation``; at forward, mismatched shapes.

    References:
        DETR ``models/transformer.py`` (``TransformerEncoderLayer``).
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
        self.linear1 = nn.Linear(d_model, dim_feedforward)
        self.linear2 = nn.Linear(dim_feedforward, d_model)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)

    def _attend(self, x: Tensor, pos: Tensor | None, key_padding_mask: Tensor | None) -> Tensor:
        q = k = x if pos is None else x + pos
        return self.self_attn(q, k, value=x, key_padding_mask=key_padding_mask, need_weights=False)[0]

    def _ffn(self, x: Tensor) -> Tensor:
        return self.linear2(self.dropout(self.activation(self.linear1(x))))

    def forward(
        self, src: Tensor, pos: Tensor | None = None, key_padding_mask: Tensor | None = None
    ) -> Tensor:
        _check_inputs(src, pos, key_padding_mask, self.d_model)
        if self.normalize_before:
            src = src + self.dropout1(self._attend(self.norm1(src), pos, key_padding_mask))
            return src + self.dropout2(self._ffn(self.norm2(src)))
        src = self.norm1(src + self.dropout1(self._attend(src, pos, key_padding_mask)))
        return self.norm2(src + self.dropout2(self._ffn(src)))

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, nhead={self.nhead}, dim_feedforward={self.dim_feedforward}, "
            f"dropout={self.dropout_p}, activation={self.activation_name!r}, "
            f"normalize_before={self.normalize_before}"
        )


def _check_inputs(src: Tensor, pos: Tensor | None, mask: Tensor | None, d_model: int) -> None:
    if not isinstance(src, Tensor):
        raise TypeError(f"src must be a Tensor[B, N, {d_model}] (batch-first), got {type(src).__name__}")
    if src.dim() != 3 or src.shape[-1] != d_model:
        raise ValueError(f"src must be a Tensor[B, N, {d_model}] (batch-first), got {tuple(src.shape)}")
    if pos is not None and not isinstance(pos, Tensor):
        raise TypeError(f"pos must be a Tensor of src's shape {tuple(src.shape)} or None, got {type(pos).__name__}")
    if pos is not None and pos.shape != src.shape:
        raise ValueError(f"pos must have src's shape {tuple(src.shape)}, got {tuple(pos.shape)}")
    if mask is not None:
        check_mask(mask, "key_padding_mask")
        if tuple(mask.shape) != tuple(src.shape[:2]):
            raise ValueError(f"key_padding_mask must have shape {tuple(src.shape[:2])}, got {tuple(mask.shape)}")


class DetrEncoder(nn.Module):
    """A stack of :class:`DetrEncoderLayer` (DETR's ``TransformerEncoder``) over flattened levels.

    Args:
        d_model (int): channels ``C``. Default 256.
        nhead, dim_feedforward, dropout, activation, normalize_before: as
            :class:`DetrEncoderLayer` (defaults 8, 2048, 0.1, ``"relu"``, False).
        num_layers (int): Default 6.

    Shape:
        ``forward(src, pos, key_padding_mask)``: ``Tensor[B, N, C]``, ``Tensor[B, N, C]`` or None,
        ``Tensor[B, N]`` bool or None -> ``Tensor[B, N, C]``. Also accepts a
        :class:`~vispos.levels.FlatLevels` as ``src``.

    Raises:
        TypeError: as :class:`DetrEncoderLayer`; a non-int ``num_layers``.
        ValueError: as :class:`DetrEncoderLayer`; ``num_layers < 1``; at forward, a
            :class:`~vispos.levels.FlatLevels` together with ``pos`` / ``key_padding_mask``.

    References:
        DETR ``models/transformer.py`` (``TransformerEncoder``; final LayerNorm only with
        ``normalize_before``).
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
    ) -> None:
        super().__init__()
        num_layers = check_int(num_layers, "num_layers", minimum=1)
        layer = DetrEncoderLayer(d_model, nhead, dim_feedforward, dropout, activation, normalize_before)
        self.layers = nn.ModuleList([copy.deepcopy(layer) for _ in range(num_layers)])
        for lyr in self.layers:  # DETR's xavier initialisation, independent per layer
            for p in lyr.parameters():
                if p.dim() > 1:
                    nn.init.xavier_uniform_(p)
        self.norm = nn.LayerNorm(d_model) if normalize_before else None
        self.d_model, self.num_layers = d_model, num_layers

    def forward(
        self,
        src: Tensor | FlatLevels,
        pos: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
    ) -> Tensor:
        if isinstance(src, FlatLevels):
            if pos is not None or key_padding_mask is not None:
                raise ValueError("pass either FlatLevels or (src, pos, key_padding_mask), not both")
            src, pos, key_padding_mask = src.src, src.pos, src.key_padding_mask
        out = src
        for layer in self.layers:
            out = layer(out, pos, key_padding_mask)
        return out if self.norm is None else self.norm(out)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, num_layers={self.num_layers}"
