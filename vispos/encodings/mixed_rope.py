"""RoPE-Mixed: learnable rotary frequencies per block and head, mask-aware, 2D and 3D.

A drop-in for timm's ``RotaryEmbeddingMixed`` (same arguments, parameter, buffers, methods and
numbers) that also embeds volumes (``num_axes=3``) and padded batches (``get_embed(mask=...)``).

References:
    Heo et al., Rotary Position Embedding for Vision Transformer, ECCV 2024 (naver-ai/rope-vit,
    ``init_random_2d_freqs`` / ``compute_mixed_cis``); timm ``RotaryEmbeddingMixed``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from .._checks import check_bool, check_choice, check_float_dtype, check_index, check_int, check_number, check_sizes, count
from .._sincos import sincos_inplace
from . import _rope_grid as grid
from ._vision_rope import VisionRope
from .rotary import apply_rot_embed_cat

__all__ = ["MixedRotaryEmbedding", "init_mixed_freqs"]

_AXIS_NAMES = ("t_x", "t_y", "t_z")


def init_mixed_freqs(
    head_dim: int,
    depth: int,
    num_heads: int,
    temperature: float = 10.0,
    rotate: bool = True,
    *,
    num_axes: int = 2,
    device: Any = None,
    dtype: torch.dtype | None = None,
) -> Tensor:
    """RoPE-Mixed's initial frequencies: one random frame per block and head.

    The ``head_dim / 2`` frequencies of a head form ``num_axes`` groups of
    ``L = head_dim / (2 * num_axes)`` magnitudes ``m_l = 1 / temperature^(2 * num_axes * l / head_dim)``;
    group ``g`` points along direction ``u_g`` of the head's random orthonormal frame, so the
    frequency of axis ``a`` is ``m_l * u_g[a]``. In 2D the frame is the paper's rotation by
    ``theta ~ U(0, 2 pi)`` (``u_0 = (cos theta, sin theta)``, ``u_1`` at ``theta + pi / 2``), drawn
    as ``torch.rand(depth, num_heads, 1)``: the same random stream, hence the same values, as the
    paper's per-block, per-head loop and timm's ``init_random_2d_freqs``. In 3D (our extension)
    the frame is a uniformly random rotation (QR of a Gaussian matrix, signs fixed).

    Args:
        head_dim (int): channels per head, a positive multiple of ``2 * num_axes``.
        depth (int): blocks. num_heads (int): heads per block.
        temperature (float): the magnitude base. Default 10 (the paper's RoPE-Mixed).
        rotate (bool): draw the random frames; False gives every block and head the axis-aligned
            frame (timm's ``rotate=False``: zero angles; in 3D the identity). Default True.
        num_axes (int): 2 or 3.
        device, dtype: of the result (float32 by default).

    Returns:
        Tensor[num_axes, depth, num_heads, head_dim // 2]: frequencies per axis, in radians per cell.

    Raises:
        TypeError / ValueError: as the constructor of :class:`MixedRotaryEmbedding`.

    References:
        Heo et al., ECCV 2024 (naver-ai/rope-vit ``init_random_2d_freqs``).
    """
    num_axes = check_choice(num_axes, (2, 3), "num_axes")
    head_dim = check_int(head_dim, "head_dim", minimum=1)
    if head_dim % (2 * num_axes):
        raise ValueError(f"head_dim must be a multiple of {2 * num_axes} ({num_axes} axes of pairs), got {head_dim}")
    depth = check_int(depth, "depth", minimum=1)
    num_heads = check_int(num_heads, "num_heads", minimum=1)
    temperature = check_number(temperature, "temperature", positive=True)
    rotate = check_bool(rotate, "rotate")
    check_float_dtype(dtype, optional=True)
    mag = 1.0 / (temperature ** (torch.arange(0, head_dim, 2 * num_axes, device=device, dtype=dtype) / head_dim))
    if num_axes == 2:
        if rotate:
            angles = torch.rand(depth, num_heads, 1, device=device, dtype=dtype) * 2 * torch.pi
        else:
            angles = torch.zeros(depth, num_heads, 1, device=device, dtype=dtype)
        fx = torch.cat([mag * torch.cos(angles), mag * torch.cos(angles + torch.pi / 2)], dim=-1)
        fy = torch.cat([mag * torch.sin(angles), mag * torch.sin(angles + torch.pi / 2)], dim=-1)
        return torch.stack([fx, fy], dim=0)
    if rotate:
        gauss = torch.randn(depth, num_heads, 3, 3, device=device, dtype=torch.float32)
        frame, r = torch.linalg.qr(gauss)
        frame = frame * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)  # Haar
    else:
        frame = torch.eye(3, device=device).expand(depth, num_heads, 3, 3)
    frame = frame.to(mag.dtype)  # frame[d, h, axis, group]
    return (frame.permute(2, 0, 1, 3).unsqueeze(-1) * mag).flatten(-2)


class MixedRotaryEmbedding(VisionRope):
    """RoPE-Mixed: each block and head rotates its channel pairs by learned 2D (3D) frequencies.

    The token at integer grid position ``t = (t_0, .., t_{n-1})`` (channel order: ``x, y`` for
    ``grid_indexing="xy"``, the default, as in the paper; ``H, W`` for ``"ij"``) rotates pair
    ``k`` of head ``h`` in block ``d`` by ``sum_a t_a * freqs[a, d, h, k]``: the frequencies mix the
    axes, so a head can attend along any direction (the paper's RoPE-Mixed). ``freqs`` is the
    learnable parameter, initialised by :func:`init_mixed_freqs` (the paper's random frames).
    Interleaved pairs, as timm and the paper rotate. In training mode with augmentation, one
    coordinate transform per call (shift in cells, jitter per axis, rescale), DINOv3's draws.

    **Padded batches.** ``get_embed(mask=...)`` counts every item's positions from its own first
    valid cell along each axis (the same integers as the item alone, wherever it sits in the
    canvas) and writes the identity rotation (sin 0, cos 1) at padding tokens. ``with rope.padded(mask):``
    makes every ``get_embed(shape)`` inside the block serve that batch (timm's Eva calls it with
    the patch grid).

    **Volumes / videos.** ``num_axes=3`` takes grids ``(D, H, W)`` (channels ``x = W``, ``y = H``,
    ``z = D`` with ``"xy"``... swapped as timm swaps the first two axes; ``D, H, W`` with ``"ij"``).

    Args:
        dim (int): the model width, ``num_heads * head_dim``; ``head_dim`` a multiple of
            ``2 * num_axes``.
        depth (int): transformer blocks (one frequency set each).
        num_heads (int): attention heads.
        temperature (float): base of the initial magnitudes. Default 10.
        feat_shape (sequence of int, optional): a grid whose positions are precomputed
            (buffers ``t_x``, ``t_y`` (, ``t_z``)); ``get_embed()`` then needs no shape.
        grid_indexing (str): ``"xy"`` (default) or ``"ij"``.
        device, dtype: of ``freqs`` (float32 by default; angles are float32 always).
        shift_coords, jitter_coords, rescale_coords (float, optional): training-only coordinate
            augmentation, in cell units (see :class:`~vispos.DinoV3RotaryEmbedding`).
        num_axes (int): 2 (default) or 3.

    Shape:
        - ``get_embed(shape)``: ``Tensor[depth, num_heads, prod(S), 2 * head_dim]``, ``[sin, cos]``.
        - ``get_embed(mask=mask)`` (``Tensor[B, *S]``): ``Tensor[depth, B, num_heads, prod(S),
          2 * head_dim]``: ``[i]`` is block ``i``'s table for ``q, k`` of shape ``(B, heads, N, hd)``.
        - ``forward(x, block_index)``: ``x`` channels-first ``Tensor[B, dim, *S]``; same shape out.

    Raises:
        TypeError: non-int ``dim`` / ``depth`` / ``num_heads`` / ``num_axes``; a non-number
            temperature or augmentation strength; a non-str ``grid_indexing``.
        ValueError: ``dim`` not a multiple of ``num_heads``, ``head_dim`` not a multiple of
            ``2 * num_axes``; non-positive sizes; bad ``grid_indexing``; bad augmentation
            strengths; a ``feat_shape`` of another rank; at a call, a grid or mask of another
            rank.
        IndexError: ``forward``'s ``block_index`` outside ``[-depth, depth)``.

    References:
        Heo et al., Rotary Position Embedding for Vision Transformer, ECCV 2024; timm
        ``RotaryEmbeddingMixed``.
    """

    def __init__(
        self,
        dim: int,
        depth: int,
        num_heads: int,
        temperature: float = 10.0,
        feat_shape: list[int] | None = None,
        grid_indexing: str = "xy",
        device: Any = None,
        dtype: torch.dtype | None = None,
        shift_coords: float | None = None,
        jitter_coords: float | None = None,
        rescale_coords: float | None = None,
        num_axes: int = 2,
    ) -> None:
        super().__init__()
        num_axes = check_choice(num_axes, (2, 3), "num_axes")
        dim = check_int(dim, "dim", minimum=1)
        num_heads = check_int(num_heads, "num_heads", minimum=1)
        depth = check_int(depth, "depth", minimum=1)
        temperature = check_number(temperature, "temperature", positive=True)
        if dim % num_heads:
            raise ValueError(f"dim must be a multiple of num_heads={num_heads}, got {dim}")
        grid_indexing = check_choice(grid_indexing, ("ij", "xy"), "grid_indexing")
        if feat_shape is not None:
            feat_shape = list(check_sizes(feat_shape, "feat_shape", ranks=(num_axes,)))
        self.dim = dim
        self.depth = depth
        self.num_heads = num_heads
        self.num_axes = num_axes
        self.temperature = temperature
        self.feat_shape = feat_shape
        self.grid_indexing = grid_indexing
        self._init_augs(shift_coords, jitter_coords, rescale_coords)
        head_dim = dim // num_heads
        freqs = init_mixed_freqs(head_dim, depth, num_heads, temperature, num_axes=num_axes, device=device, dtype=dtype)
        self.freqs = nn.Parameter(freqs)
        names = _AXIS_NAMES[:num_axes]
        if feat_shape is not None:
            for name, line in zip(names, self._grid_values(feat_shape)):
                self.register_buffer(name, line.to(dtype=grid.wide_dtype(dtype)), persistent=False)
        else:
            for name in names:
                setattr(self, name, None)

    def _grid_values(self, feat_shape: list[int]) -> list[Tensor]:
        """Per-token positions of every coordinate channel (timm's ``get_mixed_grid``), float32."""
        boxes = grid.grid_boxes(tuple(feat_shape), self.freqs.device)
        perm = grid.axis_order(self.num_axes, self.grid_indexing)
        lines = grid.coordinate_lines(boxes, perm, centered=False)[0]  # [n, M]
        out = []
        for j, axis in enumerate(perm):
            view = [1] * self.num_axes
            view[axis] = feat_shape[axis]
            out.append(lines[j, : feat_shape[axis]].view(view).expand(*feat_shape).reshape(-1).clone())
        return out

    def _lines(self) -> list[Tensor | None]:
        return [getattr(self, name) for name in _AXIS_NAMES[: self.num_axes]]

    def _init_buffers(self) -> None:
        if self.feat_shape is not None:
            for buf, line in zip(self._lines(), self._grid_values(self.feat_shape)):
                buf.copy_(line)

    def _apply(self, fn, *args, **kwargs):
        module = super()._apply(fn, *args, **kwargs)
        lines = self._lines()
        if lines[0] is not None and grid.wide_dtype(lines[0].dtype) != lines[0].dtype:
            for name, line in zip(_AXIS_NAMES, self._grid_values(self.feat_shape)):
                self.register_buffer(name, line.to(device=lines[0].device), persistent=False)
        return module

    def update_feat_shape(self, feat_shape: list[int]) -> None:
        """Recomputes the position buffers for a new grid when a grid was cached."""
        feat_shape = list(check_sizes(feat_shape, "feat_shape", ranks=(self.num_axes,)))
        if self.feat_shape is not None and feat_shape != self.feat_shape:
            for name, buf, line in zip(_AXIS_NAMES, self._lines(), self._grid_values(feat_shape)):
                setattr(self, name, line.to(buf.device, buf.dtype))
            self.feat_shape = feat_shape

    def no_weight_decay(self) -> set[str]:
        """``{"freqs"}``: frequencies are excluded from weight decay (timm, the paper)."""
        return {"freqs"}

    # -- the tables ---------------------------------------------------------------------------
    def _create_embed(
        self, spatial: tuple[int, ...], boxes: grid.ItemBoxes | None, dtype: torch.dtype | None, freqs: Tensor
    ) -> Tensor:
        """``Tensor[depth', B, heads, N, 2 * head_dim]`` for ``freqs`` (a slice of blocks)."""
        device, n = freqs.device, self.num_axes
        if boxes is None:
            boxes = grid.grid_boxes(spatial, device)
        perm = grid.axis_order(n, self.grid_indexing)
        lines = grid.coordinate_lines(boxes, perm, centered=False)  # [B, n, M] float32
        if self.training and self.aug_active:
            lines = self._augment(lines)
            if dtype is None:
                dtype = grid.wide_dtype(freqs.dtype)
        out_dtype = dtype if dtype is not None else freqs.dtype
        f = freqs.float().repeat_interleave(2, dim=-1)  # (n, D, H, 2K): each pair's two channels
        depth, heads, hd = f.shape[1:]
        batch = boxes.batch
        # per channel, t_a(cell) * f: [D, B, H, 1.., S_a, ..1, hd]; the float ops of timm's
        # get_mixed_freqs (one product per cell, then the sum over channels)
        parts = []
        for j, axis in enumerate(perm):
            t = lines[:, j, : spatial[axis]]  # [B, S_a]
            prod = t.view(1, batch, 1, -1, 1) * f[j].view(depth, 1, heads, 1, hd)
            parts.append((j, grid.line_view(prod.flatten(0, 2), axis, n)))
        parts = [p for _, p in sorted(parts, key=lambda jp: jp[0])]  # x + y (+ z), timm's order
        tokens = math.prod(spatial)
        if freqs.requires_grad and torch.is_grad_enabled():
            angles = parts[0]
            for p in parts[1:]:
                angles = angles + p
            out = torch.cat([angles.sin(), angles.cos()], dim=-1).to(out_dtype)
        else:
            work = torch.empty((depth * batch * heads, *spatial, 2 * hd), dtype=torch.float32, device=device)
            angles = work.narrow(-1, 0, hd)
            grid.sum_axes(parts, angles)  # the angles, in the sine slots
            sincos_inplace(angles, work.narrow(-1, hd, hd))
            out = work if out_dtype == torch.float32 else work.to(out_dtype)
        out = out.view(depth, batch, heads, tokens, 2 * hd)
        grid.identity_at_padding(out, boxes)
        return out

    def _resolve(self, shape: Any, mask: Any, scoped: bool = False) -> tuple[tuple[int, ...], grid.ItemBoxes | None]:
        if mask is None and scoped:
            mask = self._scoped()
        if mask is not None:
            boxes = self._read(shape, mask)
            return boxes.spatial, boxes
        if shape is None:
            if self.feat_shape is None:
                raise ValueError("get_embed() needs a shape (or a mask) when the module has no feat_shape")
            return tuple(self.feat_shape), None
        return tuple(self._check_shape(shape)), None

    def get_embed(
        self, shape: list[int] | None = None, dtype: torch.dtype | None = None, *, mask: Any = None
    ) -> Tensor:
        """Every block's and head's ``[sin, cos]`` table, of a grid or of a padded batch.

        Args:
            shape (sequence of int, optional): the grid ``S``. Default: ``feat_shape`` (or
                ``mask``'s grid).
            dtype (torch.dtype, optional): output dtype. Default: ``freqs``' dtype (at least
                float32 while augmenting). Angles and sin / cos are float32 whatever it is.
            mask (Tensor[B, *S] bool, Padding or NestedTensor, optional): True marks padding;
                or a :class:`~vispos.Padding`, or a :class:`~vispos.NestedTensor` of token
                features (as in :meth:`DinoV3RotaryEmbedding.get_embed`).

        Returns:
            Tensor[depth, heads, prod(S), 2 * head_dim] without ``mask``;
            Tensor[depth, B, heads, prod(S), 2 * head_dim] with it (or inside :meth:`padded`).
            Differentiable in ``freqs``.

        Raises:
            TypeError: a non-int size, a non-bool mask, a non-floating dtype.
            ValueError: no shape, no ``feat_shape`` and no mask; a grid of another rank, or one
                that disagrees with the mask's.
        """
        check_float_dtype(dtype, optional=True)
        spatial, boxes = self._resolve(shape, mask, scoped=True)
        out = self._create_embed(spatial, boxes, dtype, self.freqs)
        return out if boxes is not None else out[:, 0]

    def get_batch_embeds(
        self, shapes: list[tuple[int, ...]], seq_len: int | None = None, dtype: torch.dtype | None = None
    ) -> Tensor | list[Tensor]:
        """Tables of several grids (positions do not depend on the grid's size, so each is the
        top-left corner of the largest; one augmentation draw per grid while augmenting).

        Args:
            shapes (list of tuples): grids. seq_len (int, optional): pad with zeros and stack.
            dtype (torch.dtype, optional): as in :meth:`get_embed`.

        Returns:
            list of Tensor[depth, heads, prod(S_i), 2 * head_dim], or
            Tensor[len(shapes), depth, heads, seq_len, 2 * head_dim]; ``[]`` for no shapes.

        Raises:
            TypeError / ValueError: a bad grid; ``seq_len`` below a grid's token count.
        """
        if not shapes:
            return []
        check_float_dtype(dtype, optional=True)
        embeds = [
            self._create_embed(tuple(self._check_shape(s, "shapes[i]")), None, dtype, self.freqs)[:, 0] for s in shapes
        ]
        return self._stack(embeds, seq_len)

    def forward(self, x: Tensor, block_index: int = 0, *, mask: Any = None) -> Tensor:
        """Rotates a channels-first map with one block's frequencies, split into heads.

        Args:
            x (Tensor[B, dim, *S], float): channels ``h * head_dim .. (h+1) * head_dim - 1`` are
                head ``h``.
            block_index (int): the block, ``-depth <= block_index < depth`` (negative counts
                from the last, as for a Python sequence).
            mask (Tensor[B, *S] bool, optional): padding (cells left as they are).

        Returns:
            Tensor[B, dim, *S]: like ``x`` (a new tensor).

        Raises:
            TypeError: ``x`` not a floating tensor; ``block_index`` not an int.
            IndexError: ``block_index`` outside ``[-depth, depth)``.
            ValueError: another rank or channel count; a mask of another grid or batch.
        """
        self._check_input(x)
        block_index = check_index(block_index, self.depth, "block_index")
        spatial, boxes = self._resolve(list(x.shape[2:]), mask)
        if boxes is not None and boxes.batch != x.shape[0]:
            raise ValueError(f"mask has {count(boxes.batch, 'item')} but x has {x.shape[0]}")
        embed = self._create_embed(spatial, boxes, None, self.freqs[:, block_index : block_index + 1])[0]
        b, heads = x.shape[0], self.num_heads
        xh = x.reshape(b, heads, self.dim // heads, -1).transpose(-2, -1)  # (B, heads, N, hd)
        out = apply_rot_embed_cat(xh, embed)  # embed: (B or 1, heads, N, 2 hd)
        return out.transpose(-2, -1).reshape(x.shape)

    @classmethod
    def from_timm(cls, module: nn.Module) -> "MixedRotaryEmbedding":
        """The vispos twin of a timm ``RotaryEmbeddingMixed``, sharing nothing but holding a copy
        of its ``freqs`` (same configuration, device, dtype and mode).

        Raises:
            TypeError: ``module`` is not a ``RotaryEmbeddingMixed``.
        """
        if type(module).__name__ != "RotaryEmbeddingMixed":
            raise TypeError(f"module must be a timm RotaryEmbeddingMixed, got {type(module).__name__}")
        twin = cls(
            module.dim, module.depth, module.num_heads, module.temperature, module.feat_shape,
            module.grid_indexing, device=module.freqs.device, dtype=module.freqs.dtype,
            shift_coords=module.shift_coords, jitter_coords=module.jitter_coords,
            rescale_coords=module.rescale_coords,
        )
        with torch.no_grad():
            twin.freqs.copy_(module.freqs)
        twin.freqs.requires_grad_(module.freqs.requires_grad)
        return twin.train(module.training)

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, depth={self.depth}, num_heads={self.num_heads}, temperature={self.temperature}, "
            f"feat_shape={self.feat_shape}, grid_indexing={self.grid_indexing!r}{self._augs_repr()}, "
            f"num_axes={self.num_axes}"
        )

