"""DETR's sine position embedding, for 1, 2 or 3 spatial axes, mask-aware.

References:
    Carion et al., End-to-End Object Detection with Transformers, ECCV 2020
    (``models/position_encoding.py``, ``PositionEmbeddingSine``);
    Zhu et al., Deformable DETR, ICLR 2021 (``offset=-0.5``).
"""

from __future__ import annotations

import math
from typing import Union

import torch
from torch import Tensor, nn

from .._sincos import check_num_feats, check_temperature, frequency_divisors, sincos_embed
from ..nested_tensor import NestedTensor, _check_mask

__all__ = ["PositionEmbeddingSine", "cumulative_positions"]

_MAX_SPATIAL = 3

SineInput = Union[NestedTensor, Tensor]


def cumulative_positions(
    mask: Tensor,
    *,
    normalize: bool = False,
    scale: float = 2 * math.pi,
    offset: float = 0.0,
    eps: float = 1e-6,
) -> list[Tensor]:
    """DETR's positions: a cumulative count of valid cells along every spatial axis.

    Along axis ``i`` the position of a cell is the number of valid cells up to and including it
    in its line (the first valid cell is 1; padding repeats the last count, or 0 before any valid
    cell). With ``normalize`` it becomes ``(p + offset) / (p_last + eps) * scale`` where
    ``p_last`` is the count at the line's end; otherwise ``p + offset``.

    Args:
        mask (Tensor[B, *S], bool): True marks padding.
        normalize, scale, offset, eps: as in :class:`PositionEmbeddingSine`.

    Returns:
        list of Tensor[B, *S], float32: one per spatial axis, in tensor axis order.

    References:
        DETR ``PositionEmbeddingSine.forward``; Deformable DETR for ``offset=-0.5``.
    """
    not_mask = ~mask
    out = []
    for axis in range(1, mask.dim()):
        pos = not_mask.cumsum(axis, dtype=torch.float32)
        if normalize:
            last = pos.narrow(axis, pos.shape[axis] - 1, 1)
            pos = (pos + offset) / (last + eps) * scale
        elif offset:
            pos = pos + offset
        out.append(pos)
    return out


def _grid_positions(
    spatial: tuple[int, ...],
    device: torch.device,
    *,
    normalize: bool,
    scale: float,
    offset: float,
    eps: float,
) -> list[Tensor]:
    """The unmasked case of :func:`cumulative_positions` as broadcastable 1-D tables.

    Axis ``i`` gets ``arange(1, S_i + 1)`` shaped ``(1, .., S_i, .., 1)`` (rank ``1 + n``), with
    the same arithmetic as the masked path so both give identical float32 values.
    """
    n = len(spatial)
    out = []
    for i, size in enumerate(spatial):
        pos = torch.arange(1, size + 1, device=device, dtype=torch.float32)
        if normalize:
            pos = (pos + offset) / (pos[-1:] + eps) * scale
        elif offset:
            pos = pos + offset
        view = [1] * (n + 1)
        view[i + 1] = size
        out.append(pos.view(view))
    return out


class PositionEmbeddingSine(nn.Module):
    """DETR's sinusoidal position embedding for 1, 2 or 3 spatial axes, mask-aware.

    Each spatial axis gets ``num_pos_feats`` channels: positions are counted along the axis over
    valid cells (see :func:`cumulative_positions`), optionally normalised to ``[0, scale]``, and
    embedded with interleaved ``sin, cos`` at frequencies ``w_k = temperature^(-2k /
    num_pos_feats)``. The axis blocks are concatenated in tensor axis order (``D, H, W``; in 2D
    this is DETR's ``pos_y`` then ``pos_x``). In 2D it equals DETR's ``PositionEmbeddingSine``
    and transformers' ``DetrSinePositionEmbedding``; ``offset=-0.5`` gives Deformable-DETR /
    detrex / mmdet; ``temperature=20`` gives DINO's.

    Args:
        num_pos_feats (int): channels per spatial axis (positive, even). Default 64.
        temperature (float): ``T`` of the frequency ladder. Default 10000.
        normalize (bool): map positions to ``[0, scale]`` using each line's valid length.
        scale (float, optional): the normalised range; ``2 * pi`` when ``normalize`` and not
            given. Only valid with ``normalize=True``.
        offset (float): added to the 1-based count before normalising (Deformable-DETR: -0.5).
        eps (float): added to the denominator when normalising (DETR: 1e-6).

    Shape:
        - input: a :class:`NestedTensor` ``(B, C, *S)``; a bool mask ``Tensor[B, *S]`` (True =
          padding); or a floating feature map ``Tensor[B, C, *S]`` meaning "no padding". ``S`` has
          1 to 3 axes.
        - output: ``Tensor[B, n * num_pos_feats, *S]``, channels-first, ``n = len(S)``; float32
          unless ``forward(..., dtype=...)`` says otherwise (angles are computed in float32 in
          any case and cast once). For an unmasked feature map the result is a broadcast
          (expanded, read-only) view over the batch; call ``.contiguous()`` for a writable copy.

    Padding: cells in the padding get DETR's values (the count stops at the last valid cell).
    A line with no valid cell has count 0; with ``normalize`` and ``offset != 0`` that is
    ``offset / eps * scale`` (about -3e6 for Deformable-DETR), a finite but huge angle whose
    sin/cos depend on float32 rounding. Those cells are reproduced bit for bit from the peers
    and are meant to be masked, as DETR-family attention does.

    Raises:
        TypeError: a non-int ``num_pos_feats``; a non-bool mask (with a hint on how to convert);
            an input of another type.
        ValueError: odd or non-positive ``num_pos_feats``; ``scale`` without ``normalize``;
            non-positive ``temperature`` or ``scale``; negative ``eps``; an input of the wrong
            rank.

    References:
        Carion et al., End-to-End Object Detection with Transformers, ECCV 2020; Zhu et al.,
        Deformable DETR, ICLR 2021; Zhang et al., DINO, ICLR 2023 (temperature 20).
    """

    def __init__(
        self,
        num_pos_feats: int = 64,
        temperature: float = 10000,
        normalize: bool = False,
        scale: float | None = None,
        offset: float = 0.0,
        eps: float = 1e-6,
    ) -> None:
        super().__init__()
        check_num_feats(num_pos_feats)
        check_temperature(temperature)
        if not isinstance(normalize, bool):
            raise TypeError(f"normalize must be a bool, got {normalize!r}")
        if scale is not None and not normalize:
            raise ValueError(f"normalize should be True if scale is passed (got scale={scale}, normalize=False)")
        if scale is None:
            scale = 2 * math.pi
        for name, value in (("scale", scale), ("offset", offset), ("eps", eps)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise TypeError(f"{name} must be a finite number, got {value!r}")
        if scale <= 0:
            raise ValueError(f"scale must be > 0, got {scale}")
        if eps < 0:
            raise ValueError(f"eps must be >= 0, got {eps}")
        self.num_pos_feats = num_pos_feats
        self.temperature = temperature
        self.normalize = normalize
        self.scale = float(scale)
        self.offset = float(offset)
        self.eps = float(eps)
        self.register_buffer(
            "dim_t", frequency_divisors(num_pos_feats, temperature, repeat=2), persistent=False
        )

    # ------------------------------------------------------------------------------------ api
    def forward(self, x: SineInput, dtype: torch.dtype | None = None) -> Tensor:
        """Embeds the positions of ``x``'s cells; see the class docstring for shapes.

        Args:
            x (NestedTensor | Tensor[B, *S] bool | Tensor[B, C, *S] float): what to embed.
            dtype (torch.dtype, optional): output dtype; float32 when not given.
        """
        mask, spatial, batch, device = self._parse(x)
        out_dtype = torch.float32 if dtype is None else dtype
        divisors = self._divisors(device)
        if mask is None:
            positions = _grid_positions(
                spatial, device, normalize=self.normalize, scale=self.scale,
                offset=self.offset, eps=self.eps,
            )
            pos = sincos_embed(
                positions, self.num_pos_feats, shape=(1, *spatial), dtype=out_dtype,
                divisors=divisors,
            )
            return pos.expand(batch, *pos.shape[1:])
        positions = cumulative_positions(
            mask, normalize=self.normalize, scale=self.scale, offset=self.offset, eps=self.eps
        )
        return sincos_embed(
            positions, self.num_pos_feats, shape=tuple(mask.shape), dtype=out_dtype,
            divisors=divisors,
        )

    def extra_repr(self) -> str:
        return (
            f"num_pos_feats={self.num_pos_feats}, temperature={self.temperature}, "
            f"normalize={self.normalize}, scale={self.scale}, offset={self.offset}, eps={self.eps}"
        )

    # -------------------------------------------------------------------------------- helpers
    def _divisors(self, device: torch.device) -> list[Tensor]:
        dim_t = self.dim_t
        if dim_t.device != device or dim_t.dtype != torch.float32:
            dim_t = frequency_divisors(self.num_pos_feats, self.temperature, device=device, repeat=2)
        return [dim_t] * _MAX_SPATIAL

    @staticmethod
    def _parse(x: SineInput) -> tuple[Tensor | None, tuple[int, ...], int, torch.device]:
        if isinstance(x, NestedTensor):
            tensors, mask = x.decompose()
            spatial = tuple(tensors.shape[2:])
            return mask, spatial, tensors.shape[0], tensors.device
        if not isinstance(x, Tensor):
            raise TypeError(
                "x must be a NestedTensor, a bool mask (B, *S) or a feature map (B, C, *S), "
                f"got {type(x).__name__}"
            )
        if x.dtype == torch.bool:
            if not 2 <= x.dim() <= 1 + _MAX_SPATIAL:
                raise ValueError(
                    f"a mask must have shape (B, *S) with 1 to 3 spatial axes, got {tuple(x.shape)}"
                )
            return x, tuple(x.shape[1:]), x.shape[0], x.device
        if x.dtype in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64):
            _check_mask(x)  # raises the conversion hint
        if not 3 <= x.dim() <= 2 + _MAX_SPATIAL:
            raise ValueError(
                "a feature map must have shape (B, C, *S) with 1 to 3 spatial axes, got "
                f"{tuple(x.shape)}; pass a bool mask (B, *S) to embed padded positions"
            )
        return None, tuple(x.shape[2:]), x.shape[0], x.device
