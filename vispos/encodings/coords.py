"""Sine embeddings of arbitrary points and boxes (query positions, reference points, proposals).

A point or box ``(..., n)`` with coordinates in ``[0, 1]`` is scaled to ``[0, scale]`` and every
coordinate is embedded with DETR's interleaved sine (``num_pos_feats`` channels each) through the
N-D core :func:`vispos._sincos.sincos_embed`. The coordinate blocks are concatenated in input
order, except that DAB-DETR / DINO put ``y`` before ``x`` (``swap_xy=True``, the default).

References:
    Liu et al., DAB-DETR: Dynamic Anchor Boxes are Better Queries for DETR, ICLR 2022
    (``gen_sineembed_for_position`` and ``ref_point_head``); Zhang et al., DINO, ICLR 2023;
    Zhu et al., Deformable DETR, ICLR 2021 (``get_proposal_pos_embed``, two-stage).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .. import _deprecation
from .._checks import as_real, check_bool, check_int, check_number, describe
from .._sincos import check_num_feats, check_temperature, sincos_embed

__all__ = ["sine_embed_coords", "CoordSineEmbedding"]


def _check_coords(coords: object, num_coords: int | None = None, name: str = "coords") -> Tensor:
    if not isinstance(coords, Tensor):
        raise TypeError(f"{name} must be a floating Tensor (..., n), got {describe(coords)}")
    if not coords.is_floating_point():
        raise TypeError(
            f"{name} must be a floating tensor of normalised coordinates in [0, 1], got {coords.dtype}"
        )
    if coords.dim() < 1 or coords.shape[-1] < 1:
        raise ValueError(f"{name} must have shape (..., n) with n >= 1 coordinates, got {tuple(coords.shape)}")
    if num_coords is not None and coords.shape[-1] != num_coords:
        raise ValueError(
            f"{name} must have shape (..., {num_coords}) (num_coords={num_coords}), got {tuple(coords.shape)}"
        )
    return coords


@_deprecation.renamed_kwargs(coords="pos_tensor", swap_xy="exchange_xy")
def sine_embed_coords(
    pos_tensor: Tensor,
    num_pos_feats: int = 128,
    temperature: float = 10000,
    exchange_xy: bool = True,
    *,
    scale: float = 2 * math.pi,
) -> Tensor:
    """Sine embedding of points ``(x, y)``, boxes ``(cx, cy, w, h)`` or any ``n`` coordinates.

    detrex's ``get_sine_pos_embed(pos_tensor, num_pos_feats=128, temperature=10000,
    exchange_xy=True)`` under the same names and argument order (a drop-in), with vispos'
    ``scale`` keyword-only at the end. Coordinate ``c`` becomes ``p = c * scale`` and then
    ``sin(p / d_0), cos(p / d_0), sin(p / d_1), ...`` with ``d_k = temperature^(2k /
    num_pos_feats)`` (DETR's interleaved layout). With ``exchange_xy`` the blocks of the first
    two coordinates are swapped, giving DAB-DETR / DINO's ``(y, x, w, h)`` order of
    ``gen_sineembed_for_position`` (for ``n = 2`` and ``n = 4``); ``exchange_xy=False`` keeps the
    input order, as Deformable-DETR's two-stage ``get_proposal_pos_embed`` does (pass
    ``proposals.sigmoid()``: that function takes logits).

    Differentiable with respect to ``pos_tensor`` (DAB-DETR learns its anchor boxes). Angles are
    computed in float32 (float64 for float64 input) and cast once to ``pos_tensor.dtype``.

    Args:
        pos_tensor (Tensor[..., n], float): normalised coordinates, usually in ``[0, 1]`` (not
            checked: no host synchronisation).
        num_pos_feats (int): channels per coordinate (positive, even). Default 128 (DINO, with
            ``d_model = 256``).
        temperature (float): ``T`` of the frequency ladder. Default 10000.
        exchange_xy (bool): emit the first two coordinates as ``(y, x)``. Default True (DINO).
        scale (float, keyword-only): multiplier of the coordinates. Default ``2 * pi``.

    Returns:
        Tensor[..., n * num_pos_feats]: in ``pos_tensor.dtype`` on its device.

    Raises:
        TypeError: ``pos_tensor`` is not a floating tensor; a non-int ``num_pos_feats``; a
            non-number ``temperature`` / ``scale``; a non-bool ``exchange_xy``; an old and a new
            keyword together (``coords=`` and ``swap_xy=`` are the deprecated names of
            ``pos_tensor=`` and ``exchange_xy=``).
        ValueError: ``pos_tensor`` has no coordinate axis; odd or non-positive
            ``num_pos_feats``; non-positive ``temperature`` or ``scale``.

    References:
        Liu et al., DAB-DETR, ICLR 2022; Zhang et al., DINO, ICLR 2023
        (``gen_sineembed_for_position``); detrex ``detrex/layers/position_embedding.py``
        (``get_sine_pos_embed``); Zhu et al., Deformable DETR, ICLR 2021.
    """
    if isinstance(as_real(exchange_xy), float):  # the fourth positional argument was scale before
        _deprecation.warn(
            "sine_embed_coords(pos_tensor, num_pos_feats, temperature, scale) is deprecated and will "
            "be removed: the fourth positional argument is exchange_xy (detrex's order); pass scale= "
            "by keyword",
            skip=(__file__,),
        )
        scale, exchange_xy = exchange_xy, True
    coords = _check_coords(pos_tensor, name="pos_tensor")
    num_pos_feats = check_num_feats(num_pos_feats)
    temperature = check_temperature(temperature)
    scale = float(check_number(scale, "scale", positive=True))
    exchange_xy = check_bool(exchange_xy, "exchange_xy")
    compute = torch.float64 if coords.dtype == torch.float64 else torch.float32
    # scale in float32 first, exactly as the peers do, then divide (sincos_embed's default).
    scaled = coords.to(compute) * scale
    order = list(range(coords.shape[-1]))
    if exchange_xy and len(order) >= 2:
        order[0], order[1] = 1, 0
    positions = [scaled[..., i] for i in order]
    return sincos_embed(
        positions,
        num_pos_feats,
        temperature=temperature,
        layout="interleaved",
        channel_dim=-1,
        dtype=coords.dtype,
        compute_dtype=compute,
    )


class CoordSineEmbedding(nn.Module):
    """Sine embedding of points or boxes followed by an MLP: DAB-DETR's ``ref_point_head``.

    ``out = MLP(sine_embed_coords(coords))`` with ``num_layers`` Linear layers and ReLU between
    them (none after the last): ``n * num_pos_feats -> hidden_dim -> ... -> d_model``. The layers
    live in ``self.layers`` (a ``ModuleList``), so the ``state_dict`` keys are DAB-DETR / DINO's
    ``ref_point_head.layers.{i}.{weight,bias}``.

    Args:
        num_coords (int): ``n``: 2 for points, 4 for boxes. Default 4.
        d_model (int): output size. Default 256.
        num_pos_feats (int, optional): channels per coordinate; ``d_model // 2`` when not given
            (DAB-DETR: ``query_dim // 2 * d_model`` inputs for 4 coordinates).
        hidden_dim (int, optional): hidden size of the MLP; ``d_model`` when not given.
        num_layers (int): Linear layers (``>= 1``). Default 2.
        temperature (float): as :func:`sine_embed_coords`. Default 10000.
        scale (float): as :func:`sine_embed_coords`. Default ``2 * pi``.
        swap_xy (bool): as :func:`sine_embed_coords`. Default True.

    Shape:
        - coords: ``Tensor[..., num_coords]``, float, normalised to ``[0, 1]``.
        - output: ``Tensor[..., d_model]`` in the MLP's dtype.

    Raises:
        TypeError: non-int sizes; non-number ``temperature`` / ``scale``; at ``forward``,
            ``coords`` not a floating tensor.
        ValueError: non-positive sizes; odd ``num_pos_feats``; at ``forward``, the last dim of
            ``coords`` is not ``num_coords``.

    References:
        Liu et al., DAB-DETR, ICLR 2022 (``ref_point_head = MLP(2 * d_model, d_model, d_model, 2)``);
        Zhang et al., DINO, ICLR 2023.
    """

    def __init__(
        self,
        num_coords: int = 4,
        d_model: int = 256,
        num_pos_feats: int | None = None,
        hidden_dim: int | None = None,
        num_layers: int = 2,
        temperature: float = 10000,
        scale: float = 2 * math.pi,
        swap_xy: bool = True,
    ) -> None:
        super().__init__()
        num_coords = check_int(num_coords, "num_coords", minimum=1)
        d_model = check_int(d_model, "d_model", minimum=1)
        num_layers = check_int(num_layers, "num_layers", minimum=1)
        if num_pos_feats is None:
            if d_model % 4:
                raise ValueError(
                    f"num_pos_feats defaults to d_model // 2, which must be even; got d_model={d_model}. "
                    "Pass num_pos_feats explicitly"
                )
            num_pos_feats = d_model // 2
        num_pos_feats = check_num_feats(num_pos_feats)
        if hidden_dim is None:
            hidden_dim = d_model
        hidden_dim = check_int(hidden_dim, "hidden_dim", minimum=1)
        temperature = check_temperature(temperature)
        scale = float(check_number(scale, "scale", positive=True))
        swap_xy = check_bool(swap_xy, "swap_xy")
        self.num_coords = num_coords
        self.d_model = d_model
        self.num_pos_feats = num_pos_feats
        self.hidden_dim = hidden_dim
        self.num_layers = num_layers
        self.temperature = temperature
        self.scale = scale
        self.swap_xy = swap_xy
        sizes = [num_coords * num_pos_feats] + [hidden_dim] * (num_layers - 1) + [d_model]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:]))

    def forward(self, coords: Tensor) -> Tensor:
        """Embeds ``coords`` (``Tensor[..., num_coords]``) into ``Tensor[..., d_model]``."""
        _check_coords(coords, self.num_coords)
        weight = self.layers[0].weight
        out = sine_embed_coords(
            coords, self.num_pos_feats, self.temperature, self.swap_xy, scale=self.scale
        ).to(weight.dtype)
        for i, layer in enumerate(self.layers):
            out = layer(out)
            if i < len(self.layers) - 1:
                out = torch.relu(out)
        return out

    def extra_repr(self) -> str:
        return (
            f"num_coords={self.num_coords}, d_model={self.d_model}, num_pos_feats={self.num_pos_feats}, "
            f"hidden_dim={self.hidden_dim}, num_layers={self.num_layers}, temperature={self.temperature}, "
            f"scale={self.scale}, swap_xy={self.swap_xy}"
        )
