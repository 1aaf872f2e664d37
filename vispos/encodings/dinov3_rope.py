"""DINOv3's rotary embedding over normalized patch-centre coordinates, mask-aware, 2D and 3D.

A drop-in for timm's ``RotaryEmbeddingDinoV3`` (same arguments, methods, buffers and numbers)
that also embeds volumes (``num_axes=3``) and padded batches (``get_embed(mask=...)``).
The sin / cos tables come from the N-D core (:func:`vispos._sincos.sincos_embed`, split
layout, divisors = the periods), evaluated on coordinate *lines*, not on every token.

References:
    Simeoni et al., DINOv3, arXiv:2508.10104, 2025 (``RopePositionEmbedding``);
    Su et al., RoFormer, 2021; timm ``RotaryEmbeddingDinoV3``; transformers
    ``DINOv3ViTRopePositionEmbedding``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from .._checks import check_bool, check_choice, check_float_dtype, check_int, check_multiple, check_number, check_sizes, count
from .._sincos import check_temperature, frequency_divisors, sincos_table
from . import _rope_grid as grid
from ._vision_rope import VisionRope
from .rotary import apply_rot_embed_cat

__all__ = ["DinoV3RotaryEmbedding"]

_NORMALIZE = ("separate", "min", "max")
_INDEXING = ("ij", "xy")


class DinoV3RotaryEmbedding(VisionRope):
    """DINOv3's RoPE: patch centres normalized to ``[-1, 1]``, per-axis period ladders.

    Token ``i`` along axis ``a`` of an ``S_a``-cell grid has the coordinate
    ``p = 2 * (i + 0.5 + grid_offset) / d_a - 1``, with ``d_a = S_a`` (``"separate"``) or the
    smallest / largest ``S`` (``"min"`` / ``"max"``). Each axis rotates ``q = dim / (2 * num_axes)``
    channel pairs by ``2 * pi * p / P_k`` with periods ``P_k = temperature^(k / q)``, or
    ``P_k = min_period * (max_period / min_period)^(k / (q - 1))`` when both periods are given.
    In training mode (only), one coordinate augmentation per call: a shift ``U(-s, s)`` per axis,
    a jitter factor ``exp(U(-ln J, ln J))`` per axis, a rescale factor ``exp(U(-ln R, ln R))``,
    drawn in that order from torch's generator on the module's device.

    **Padded batches.** ``get_embed(mask=...)`` gives every item its own table: coordinates
    counted from the item's first valid cell along every axis and normalized by its own valid
    extent, so each valid token gets exactly the rotation it gets with the item alone,
    whatever side the padding is on (bottom / right as DETR pads, symmetric as MONAI's
    ``SpatialPad``). Padding tokens get the identity rotation (sin 0, cos 1). A mask that is
    not a box (holes) uses each item's bounding box of valid cells. ``with rope.padded(mask):``
    makes every ``get_embed(shape)`` inside the block serve that batch, so an unmodified timm Eva
    runs a padded batch.

    **Volumes / videos.** ``num_axes=3`` takes grids ``(D, H, W)``; each axis is normalized by
    its own extent (``"separate"``) and gets the same period ladder as in 2D.

    Args:
        dim (int): rotated channels per head (the head dim), a positive multiple of
            ``2 * num_axes``.
        temperature (float, optional): the period base. Default 100 (DINOv3).
        min_period, max_period (float, optional): a geometric ladder between the two, used
            when both are given (instead of ``temperature``).
        feat_shape (sequence of int, optional): a grid to precompute (``get_embed()`` without
            ``shape`` returns it).
        normalize_coords (str): ``"separate"`` (default), ``"min"`` or ``"max"``.
        grid_offset (float): added to ``i + 0.5`` before normalizing. Default 0.
        grid_indexing (str): ``"ij"`` (default: coordinate blocks in axis order ``H, W``) or
            ``"xy"`` (the first two swapped, timm's ``swap_shape_xy``).
        rotate_half (bool): the table layout: rotate-half (default, DINOv3 / transformers) or
            interleaved pairs.
        shift_coords (float, optional): augmentation shift ``s >= 0``, in coordinate units.
        jitter_coords (float, optional): augmentation per-axis factor ``J >= 1``.
        rescale_coords (float, optional): augmentation shared factor ``R >= 1``.
        device, dtype: of the buffers (periods are kept at float32 or wider).
        num_axes (int): 2 (images, default) or 3 (volumes, videos).

    Shape:
        - ``get_embed(shape)``: ``Tensor[prod(S), 2 * dim]``, ``[sin, cos]`` concatenated.
        - ``get_embed(mask=mask)`` with ``mask: Tensor[B, *S]``: ``Tensor[B, prod(S), 2 * dim]``.
        - ``forward(x)``: ``x`` channels-first ``Tensor[B, dim, *S]``; returns the same shape.

    Buffers (non-persistent, as timm's): ``periods`` ``Tensor[q]``; ``pos_embed_cached``
    ``Tensor[prod(feat_shape), 2 * dim]`` when ``feat_shape`` is given.

    Raises:
        TypeError: a non-int ``dim`` / ``num_axes``, a non-number period or augmentation
            strength, a non-str choice, a non-bool ``rotate_half``.
        ValueError: ``dim`` not a positive multiple of ``2 * num_axes``; ``num_axes`` not 2 or
            3; a non-positive / non-finite period; only one of ``min_period`` / ``max_period``;
            neither a temperature nor both periods; an unknown ``normalize_coords`` /
            ``grid_indexing``; a negative shift, a jitter or rescale below 1; a ``feat_shape`` of
            another rank; at a call, a grid or mask of another rank, a mask of another grid.

    References:
        Simeoni et al., DINOv3, 2025; timm ``RotaryEmbeddingDinoV3``; transformers
        ``DINOv3ViTRopePositionEmbedding``.
    """

    def __init__(
        self,
        dim: int,
        temperature: float | None = 100.0,
        min_period: float | None = None,
        max_period: float | None = None,
        feat_shape: list[int] | None = None,
        normalize_coords: str = "separate",
        grid_offset: float = 0.0,
        grid_indexing: str = "ij",
        rotate_half: bool = True,
        shift_coords: float | None = None,
        jitter_coords: float | None = None,
        rescale_coords: float | None = None,
        device: Any = None,
        dtype: torch.dtype | None = None,
        num_axes: int = 2,
    ) -> None:
        super().__init__()
        num_axes = check_choice(num_axes, (2, 3), "num_axes")
        dim = check_multiple(dim, 2 * num_axes, "dim", f"each of the {num_axes} axes rotates an equal number of pairs")
        if (min_period is None) != (max_period is None):
            raise ValueError(
                f"give both min_period and max_period, or neither, got min_period={min_period}, max_period={max_period}"
            )
        if min_period is not None:
            min_period = check_number(min_period, "min_period", positive=True)
            max_period = check_number(max_period, "max_period", positive=True)
        elif temperature is None:
            raise ValueError("give a temperature, or both min_period and max_period")
        if temperature is not None:
            temperature = check_temperature(temperature, "temperature")
        if feat_shape is not None:
            feat_shape = list(check_sizes(feat_shape, "feat_shape", ranks=(num_axes,)))
        normalize_coords = check_choice(normalize_coords, _NORMALIZE, "normalize_coords")
        grid_offset = check_number(grid_offset, "grid_offset")
        grid_indexing = check_choice(grid_indexing, _INDEXING, "grid_indexing")
        rotate_half = check_bool(rotate_half, "rotate_half")
        check_float_dtype(dtype, optional=True)
        self.dim = dim
        self.num_axes = num_axes
        self.rotate_half = rotate_half
        self.temperature = float(temperature) if temperature is not None else None
        self.min_period = min_period
        self.max_period = max_period
        self.normalize_coords = normalize_coords
        self._init_augs(shift_coords, jitter_coords, rescale_coords)
        self.feat_shape = feat_shape
        self.grid_offset = grid_offset
        self.grid_indexing = grid_indexing
        q = dim // (2 * num_axes)
        self.register_buffer("periods", torch.empty(q, device=device, dtype=grid.wide_dtype(dtype)), persistent=False)
        if feat_shape is not None:
            shape = (math.prod(feat_shape), 2 * dim)
            self.register_buffer("pos_embed_cached", torch.empty(shape, device=device, dtype=dtype), persistent=False)
        else:
            self.pos_embed_cached = None
        self.reset_parameters()

    # -- buffers (timm's names and life cycle) -------------------------------------------------
    def _init_buffers(self) -> None:
        self.periods.copy_(self._compute_periods())
        if self.feat_shape is not None and self.pos_embed_cached is not None:
            self.pos_embed_cached.copy_(self._create_embed(self.feat_shape, no_aug=True))

    def _apply(self, fn, *args, **kwargs):
        module = super()._apply(fn, *args, **kwargs)
        # ``.half()`` / ``.to(bfloat16)`` cast every floating buffer: periods are rebuilt wide
        if grid.wide_dtype(self.periods.dtype) != self.periods.dtype:
            periods = self._compute_periods().to(self.periods.device)
            self.register_buffer("periods", periods, persistent=False)
        return module

    def _compute_periods(self) -> Tensor:
        """``Tensor[q]`` float32 on the CPU: the period ladder (timm's float ops)."""
        q = self.dim // (2 * self.num_axes)
        if self.min_period is not None:
            exponents = torch.linspace(0, 1, q, dtype=torch.float32)
            return self.min_period * ((self.max_period / self.min_period) ** exponents)
        # T^(2k / (2q)): the core's standard ladder over 2q channels, i.e. DINOv3's base^(k / q)
        return frequency_divisors(2 * q, self.temperature)

    def _cache_embed(self, feat_shape: list[int]) -> None:
        embed = self._create_embed(feat_shape, no_aug=True)
        if self.pos_embed_cached is not None:
            embed = embed.to(dtype=self.pos_embed_cached.dtype)
        self.register_buffer("pos_embed_cached", embed, persistent=False)
        self.feat_shape = list(feat_shape)

    def update_feat_shape(self, feat_shape: list[int]) -> None:
        """Recomputes ``pos_embed_cached`` for a new grid when one was cached (timm's behaviour:
        a module built without ``feat_shape`` keeps computing per call)."""
        feat_shape = list(check_sizes(feat_shape, "feat_shape", ranks=(self.num_axes,)))
        if self.feat_shape is not None and feat_shape != self.feat_shape:
            self._cache_embed(feat_shape)

    # -- the table ----------------------------------------------------------------------------
    def _create_embed(
        self,
        shape: list[int] | tuple[int, ...],
        no_aug: bool = False,
        boxes: grid.ItemBoxes | None = None,
        dtype: torch.dtype | None = None,
    ) -> Tensor:
        """``Tensor[prod(S), 2 * dim]`` (``boxes`` None) or ``Tensor[B, prod(S), 2 * dim]``."""
        device, cdtype = self.periods.device, self.periods.dtype
        batched = boxes is not None
        if boxes is None:
            boxes = grid.grid_boxes(tuple(shape), device)
        spatial, n = boxes.spatial, self.num_axes
        perm = grid.axis_order(n, self.grid_indexing)
        lines = grid.coordinate_lines(
            boxes, perm, centered=True, normalize_coords=self.normalize_coords, grid_offset=self.grid_offset
        )
        if not no_aug:
            lines = self._augment(lines)
        out_dtype = dtype if dtype is not None else cdtype
        # angles 2 * pi * p / P_k in timm's float order, once per line cell: [B, n, 2q, M]
        table = sincos_table((2 * math.pi) * lines.to(cdtype), self.periods, layout="split")
        table = table.unflatten(2, (2, -1)).movedim(-1, 2)  # [B, n, M, 2, q]
        batch, q, width = boxes.batch, table.shape[-1], 2 * self.dim
        parts = []
        for j, axis in enumerate(perm):  # one table per axis, zero in the other axes' channels
            part = torch.zeros((batch, spatial[axis], width), dtype=out_dtype, device=device)
            grid.write_cat(part, table[:, j, : spatial[axis]], j * q, self.rotate_half)
            parts.append((axis, grid.line_view(part, axis, n)))
        out = torch.empty((batch, *spatial, width), dtype=out_dtype, device=device)
        grid.sum_axes([p for _, p in sorted(parts, key=lambda ap: ap[0])], out)  # D + H first, then W
        out = out.view(batch, math.prod(spatial), width)
        grid.identity_at_padding(out.unsqueeze(0).unsqueeze(2), boxes)
        return out if batched else out[0]

    def get_embed(
        self,
        shape: list[int] | None = None,
        dtype: torch.dtype | None = None,
        *,
        mask: Any = None,
    ) -> Tensor:
        """The ``[sin, cos]`` table of a grid, or of every item of a padded batch.

        Args:
            shape (sequence of int, optional): the grid ``S`` (``num_axes`` ints). Default: the
                cached ``feat_shape`` (or ``mask``'s grid).
            dtype (torch.dtype, optional): output dtype. Default: the periods' dtype (float32),
                or the cache's dtype for the cached table. Angles are float32 either way.
            mask (Tensor[B, *S] bool, Padding or NestedTensor, optional): True marks padding;
                or a :class:`~vispos.Padding` (boxes anywhere, e.g. ``starts="symmetric"``), or
                a :class:`~vispos.NestedTensor` of token features (its ``padding``). Boxes
                known on the host are used as they are; a mask is classified once
                (:meth:`Padding.from_mask <vispos.Padding.from_mask>`).

        Returns:
            Tensor[prod(S), 2 * dim] without ``mask``; Tensor[B, prod(S), 2 * dim] with it
            (row-major tokens; sin 0 / cos 1 at padding); inside :meth:`padded` without ``mask``,
            the scope's batch as Tensor[B, 1, prod(S), 2 * dim]. A new tensor on every call (the
            cached table is copied out). In training mode with augmentation, one draw per call,
            shared by every item of a batch (as DINOv3 draws once per batch).

        Raises:
            TypeError: a non-int size; a non-bool mask; a non-floating ``dtype``.
            ValueError: no shape, no ``feat_shape`` and no mask; a shape of another rank or one
                that disagrees with ``mask``'s grid.
        """
        check_float_dtype(dtype, optional=True)
        padding = mask if mask is not None else self._scoped()
        if padding is not None:
            boxes = self._read(shape, padding)
            embed = self._create_embed(boxes.spatial, boxes=boxes, dtype=dtype)
            return embed if mask is not None else embed.unsqueeze(1)
        return self._grid_embed(shape, dtype)

    def _grid_embed(self, shape: Any, dtype: torch.dtype | None) -> Tensor:
        """The table of one unpadded grid (``shape``, or the cached ``feat_shape``)."""
        if shape is not None:
            return self._create_embed(self._check_shape(shape), dtype=dtype)
        if self.feat_shape is None:
            raise ValueError("get_embed() needs a shape (or a mask) when the module has no feat_shape")
        if self.pos_embed_cached is None or (self.training and self.aug_active):
            return self._create_embed(self.feat_shape, dtype=dtype)
        cached = self.pos_embed_cached
        return cached.to(dtype) if dtype is not None and dtype != cached.dtype else cached.clone()

    def get_batch_embeds(
        self,
        shapes: list[tuple[int, ...]],
        seq_len: int | None = None,
        dtype: torch.dtype | None = None,
    ) -> Tensor | list[Tensor]:
        """Tables of several grids, each normalized by its own size (timm's NaFlex path).

        Args:
            shapes (list of tuples): grids, ``num_axes`` ints each.
            seq_len (int, optional): pad each table with zeros to this many tokens and stack.
            dtype (torch.dtype, optional): as in :meth:`get_embed`.

        Returns:
            list of Tensor[prod(S_i), 2 * dim], or Tensor[len(shapes), seq_len, 2 * dim] (zero
            rows past each grid, as timm pads). ``[]`` for no shapes.

        Raises:
            TypeError / ValueError: a bad grid (as :meth:`get_embed`); ``seq_len`` not an int
                at least every grid's token count.
        """
        if not shapes:
            return []
        check_float_dtype(dtype, optional=True)
        return self._stack([self._grid_embed(self._check_shape(s, "shapes[i]"), dtype) for s in shapes], seq_len)

    def forward(self, x: Tensor, *, mask: Any = None) -> Tensor:
        """Rotates a channels-first map ``x`` (``Tensor[B, dim, *S]``) at its own grid.

        Args:
            x (Tensor[B, dim, *S], float): ``num_axes`` spatial axes.
            mask (Tensor[B, *S] bool, optional): padding; each item is rotated at its own
                coordinates and padding cells are left as they are.

        Returns:
            Tensor[B, dim, *S]: like ``x`` (a new tensor).

        Raises:
            TypeError: ``x`` not a floating tensor. ValueError: another rank or channel count;
                a mask of another grid or batch.
        """
        self._check_input(x)
        if mask is None:
            embed = self._grid_embed(list(x.shape[2:]), None)
        else:
            embed = self.get_embed(list(x.shape[2:]), mask=mask)
            if embed.shape[0] != x.shape[0]:
                raise ValueError(f"mask has {count(embed.shape[0], 'item')} but x has {x.shape[0]}")
        flat = x.flatten(2).transpose(1, 2)  # (B, N, C)
        out = apply_rot_embed_cat(flat, embed, half=self.rotate_half)
        return out.transpose(1, 2).reshape(x.shape)

    @classmethod
    def from_timm(cls, module: nn.Module) -> "DinoV3RotaryEmbedding":
        """The vispos twin of a timm ``RotaryEmbeddingDinoV3`` (same configuration, device,
        dtype and mode), e.g. ``model.rope = DinoV3RotaryEmbedding.from_timm(model.rope)``.

        Raises:
            TypeError: ``module`` is not a ``RotaryEmbeddingDinoV3``.
        """
        if type(module).__name__ != "RotaryEmbeddingDinoV3":
            raise TypeError(f"module must be a timm RotaryEmbeddingDinoV3, got {type(module).__name__}")
        cached = getattr(module, "pos_embed_cached", None)
        twin = cls(
            module.dim, module.temperature, module.min_period, module.max_period, module.feat_shape,
            module.normalize_coords, module.grid_offset, module.grid_indexing, module.rotate_half,
            module.shift_coords, module.jitter_coords, module.rescale_coords,
            device=module.periods.device, dtype=cached.dtype if cached is not None else None,
        )
        return twin.train(module.training)

    def extra_repr(self) -> str:
        periods = (
            f"min_period={self.min_period}, max_period={self.max_period}"
            if self.min_period is not None else f"temperature={self.temperature}"
        )
        return (
            f"dim={self.dim}, {periods}, feat_shape={self.feat_shape}, normalize_coords={self.normalize_coords!r}, "
            f"grid_offset={self.grid_offset}, grid_indexing={self.grid_indexing!r}, rotate_half={self.rotate_half}"
            f"{self._augs_repr()}, num_axes={self.num_axes}"
        )
