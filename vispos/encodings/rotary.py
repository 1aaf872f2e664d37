"""Rotary position embeddings (RoPE): 1D sequences and axial 2D / 3D token grids.

Channels are rotated in interleaved pairs ``(x_{2i}, x_{2i+1})`` by the angle ``p * w_i`` with
``w_i = theta^(-2i / R)`` over the ``R`` rotated channels: the convention of RoFormer, GPT-J
and ``rotary-embedding-torch``. The sin / cos tables come from the N-D core
(:func:`vispos._sincos.sincos_embed`, ``layout="split"``, ``reciprocal=True`` as the peers
multiply by an inverse-frequency table); the rotation is computed in float32 and cast back to the
input dtype. Positions are built in float32, never in the input's dtype (a bf16 ``arange`` cannot
represent positions above 256 exactly, a known peer pitfall).

References:
    Su et al., RoFormer: Enhanced Transformer with Rotary Position Embedding, 2021;
    Heo et al., Rotary Position Embedding for Vision Transformer, ECCV 2024 (axial 2D RoPE);
    ``rotary-embedding-torch`` (``RotaryEmbedding``, ``get_axial_freqs``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .. import _deprecation
from .._sincos import check_temperature, sincos_embed
from .._checks import check_bool, check_choice, check_int, check_multiple, check_sizes

__all__ = ["RotaryEmbedding", "AxialRotaryEmbedding", "apply_rotary_sincos", "apply_rot_embed_cat"]

__getattr__ = _deprecation.alias_getattr(__name__, {"apply_rotary": "vispos.encodings.rotary:apply_rotary_sincos"})


def _rotate(x: Tensor, sin: Tensor, cos: Tensor) -> Tensor:
    """Rotates the first ``2 * sin.shape[-1]`` channels of ``x`` pairwise; float32 math, cast back."""
    rot = 2 * sin.shape[-1]
    head = x[..., :rot].float().unflatten(-1, (rot // 2, 2))
    x0, x1 = head.unbind(-1)
    out = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2).to(x.dtype)
    if rot == x.shape[-1]:
        return out
    return torch.cat((out, x[..., rot:]), dim=-1)


def _check_floating(**tensors: object) -> None:
    """TypeError unless every named argument is a floating tensor."""
    for name, t in tensors.items():
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a floating Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating tensor, got {t.dtype}")


def apply_rotary_sincos(q: Tensor, k: Tensor | None, sin: Tensor, cos: Tensor) -> tuple[Tensor, Tensor | None]:
    """Rotates the leading channels of queries and keys by separate ``sin`` and ``cos`` tables of
    one value per channel *pair* (vispos' rotary layout).

    Channel pairs ``(2i, 2i+1)`` for ``i < R / 2`` (``R = 2 * sin.shape[-1]``) become
    ``(x0 cos_i - x1 sin_i, x0 sin_i + x1 cos_i)``; channels ``R ..`` pass through unchanged
    (partial rotation). The arithmetic is float32 whatever the inputs' dtype; each output has its
    input's dtype. Inputs are not modified. The tables are what :meth:`RotaryEmbedding.sincos`
    returns.

    Not to be confused with :func:`apply_rot_embed_cat`, timm's function, which takes one
    ``[sin, cos]`` table of the *full* width ``2 * C`` (each value repeated per channel), rotates
    one tensor and every channel, interleaved or rotate-half. Formerly ``apply_rotary`` (a
    deprecated alias for one release).

    Args:
        q (Tensor[..., C], float): queries, ``C >= R``.
        k (Tensor[..., C'], float, optional): keys (may be ``None``), ``C' >= R``.
        sin (Tensor[..., R/2], float32): ``sin(p * w_i)``, broadcastable against ``q[..., :R/2]``
            and ``k[..., :R/2]`` (e.g. from :meth:`RotaryEmbedding.sincos`).
        cos (Tensor[..., R/2], float32): ``cos(p * w_i)``, same shape as ``sin``.

    Returns:
        tuple[Tensor, Tensor | None]: rotated ``q`` and ``k`` (``None`` when ``k`` is ``None``).

    Raises:
        TypeError: ``q`` / ``k`` / ``sin`` / ``cos`` not floating tensors.
        ValueError: ``sin`` and ``cos`` of different shapes; more rotated channels than ``q`` or
            ``k`` has; shapes that do not broadcast.

    References:
        Su et al., RoFormer, 2021 (eq. 34, pairwise rotation).
    """
    given = (("q", q), ("k", k), ("sin", sin), ("cos", cos))
    _check_floating(**{name: t for name, t in given if t is not None or name != "k"})
    if sin.shape != cos.shape:
        raise ValueError(f"sin and cos must have the same shape, got {tuple(sin.shape)} and {tuple(cos.shape)}")
    rot = 2 * sin.shape[-1]
    out = []
    for name, t in (("q", q), ("k", k)):
        if t is None:
            out.append(None)
            continue
        if t.shape[-1] < rot:
            raise ValueError(
                f"{name} has {t.shape[-1]} channels but sin / cos rotate {rot} (2 * {sin.shape[-1]})"
            )
        try:
            torch.broadcast_shapes(t.shape[:-1] + (rot // 2,), sin.shape)
        except RuntimeError:
            raise ValueError(
                f"sin / cos of shape {tuple(sin.shape)} do not broadcast against {name} of shape "
                f"{tuple(t.shape)} (expected (..., {rot // 2}) matching {name}'s leading dims)"
            ) from None
        out.append(_rotate(t, sin.float(), cos.float()))
    return out[0], out[1]


def apply_rot_embed_cat(x: Tensor, emb: Tensor, half: bool = False) -> Tensor:
    """Rotates ``x`` by a ``[sin, cos]`` table, timm's ``apply_rot_embed_cat`` (a drop-in).

    One table ``emb = [sin, cos]`` of width ``2 * C`` for one tensor of width ``C``, every channel
    rotated: the layout of timm's and transformers' vision RoPE (:class:`DinoV3RotaryEmbedding`,
    :class:`MixedRotaryEmbedding`). For vispos' per-pair ``sin`` / ``cos`` tables applied to
    queries and keys at once, with partial rotation, see :func:`apply_rotary_sincos`.

    With ``sin, cos = emb.chunk(2, -1)``: ``x * cos + rot(x) * sin``, where ``rot`` maps channel
    pairs ``(x_{2i}, x_{2i+1})`` to ``(-x_{2i+1}, x_{2i})`` (interleaved, ``half=False``) or the
    halves ``(x_1, x_2)`` to ``(-x_2, x_1)`` (``half=True``, "rotate half", DINOv3 / transformers).
    The arithmetic uses ordinary dtype promotion (float32 tables keep a bf16 ``x``'s rotation in
    float32) and the result is cast to ``x``'s dtype, as timm does. Three passes over ``x``
    (timm's takes six) and no temporary besides the result; equal to timm's to float32 rounding
    (a fused multiply-add rounds once where timm rounds twice).

    Args:
        x (Tensor[..., C], float): queries or keys, e.g. ``(B, heads, N, C)``.
        emb (Tensor[..., 2 * C], float): ``[sin, cos]``, broadcastable against ``x`` (e.g.
            :meth:`DinoV3RotaryEmbedding.get_embed`'s ``(N, 2C)``, or ``(B, 1, N, 2C)`` for a
            padded batch).
        half (bool): the rotate-half layout. Default False (interleaved pairs).

    Returns:
        Tensor: like ``x`` (a new tensor; ``x`` and ``emb`` are not modified).

    Raises:
        TypeError: ``x`` / ``emb`` not floating tensors; ``half`` not a bool.
        ValueError: ``emb``'s last dim is not ``2 * C`` (``C`` even); shapes that do not broadcast.

    References:
        Su et al., RoFormer, 2021; timm ``layers/pos_embed_sincos.py`` (``apply_rot_embed_cat``).
    """
    _check_floating(x=x, emb=emb)
    half = check_bool(half, "half")
    c = x.shape[-1] if x.dim() else 0
    if x.dim() == 0 or c % 2 or emb.dim() == 0 or emb.shape[-1] != 2 * c:
        raise ValueError(
            f"emb must have 2 * C channels for x with an even number C of channels, got x "
            f"{tuple(x.shape)} and emb {tuple(emb.shape)}"
        )
    try:
        torch.broadcast_shapes(x.shape, emb.shape[:-1] + (c,))
    except RuntimeError:
        raise ValueError(
            f"emb of shape {tuple(emb.shape)} does not broadcast against x of shape {tuple(x.shape)}"
        ) from None
    sin, cos = emb.narrow(-1, 0, c), emb.narrow(-1, c, c)
    out = torch.mul(x, cos)  # the broadcast shape: every later write is in place
    if half:
        h = c // 2
        pairs = ((0, h, -1), (h, 0, 1))  # out_1 -= x_2 sin_1 ; out_2 += x_1 sin_2
        for dst, src, sign in pairs:
            out.narrow(-1, dst, h).addcmul_(x.narrow(-1, src, h), sin.narrow(-1, dst, h), value=sign)
    else:
        xp, sp, op = x.unflatten(-1, (c // 2, 2)), sin.unflatten(-1, (c // 2, 2)), out.unflatten(-1, (c // 2, 2))
        op[..., 0].addcmul_(xp[..., 1], sp[..., 0], value=-1)
        op[..., 1].addcmul_(xp[..., 0], sp[..., 1])
    return out.to(x.dtype)


def _check_x(x: object, min_dim: int, what: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a floating Tensor {what}, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating tensor, got {x.dtype}")
    if x.dim() < min_dim:
        raise ValueError(f"x must have shape {what}, got {tuple(x.shape)}")
    return x


def _check_positions(positions: object, target: tuple[int, ...], device: torch.device, what: str) -> Tensor:
    if not isinstance(positions, Tensor):
        raise TypeError(f"positions must be a Tensor {what}, got {type(positions).__name__}")
    if positions.dtype == torch.bool or positions.is_complex():
        raise TypeError(f"positions must be a real-valued tensor, got {positions.dtype}")
    if positions.device != device:
        raise ValueError(f"positions is on {positions.device} but x is on {device}")
    try:
        ok = torch.broadcast_shapes(positions.shape, target) == torch.Size(target)
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(f"positions of shape {tuple(positions.shape)} must broadcast to {target} {what}")
    return positions


class RotaryEmbedding(nn.Module):
    """1D rotary position embedding, rotating interleaved channel pairs.

    Rotates channels ``0 .. dim-1`` of the last axis of ``x`` (the rest pass through) by
    ``p * w_i``, ``w_i = theta^(-2i / dim)``, where ``p`` is the position along ``seq_dim``
    (``0 .. L-1`` unless ``positions`` is given: offsets for incremental decoding, packed
    sequences, left padding). Apply it to queries and keys separately; ``q_m . k_n`` then depends
    on ``m - n`` only. Equal to ``rotary_embedding_torch.RotaryEmbedding(dim, theta=theta)``'s
    ``rotate_queries_or_keys`` in float32.

    Args:
        dim (int): rotated channels ``R`` (positive, even), at most the head dim.
        theta (float): base of the frequency ladder. Default 10000.
        seq_dim (int): the sequence axis of ``x``, negative: ``-2`` for ``(B, H, L, C)``
            (default), ``-3`` for ``(B, L, H, C)``.

    Shape:
        - x: ``Tensor[..., L, C]`` (``seq_dim=-2``) with ``C >= dim``, any float dtype.
        - positions (optional): broadcastable to ``x.shape[:-1]``, e.g. ``Tensor[L]`` or
          ``Tensor[B, 1, L]``; any real dtype, on x's device.
        - output: like ``x`` (math in float32, cast back).

    Raises:
        TypeError: a non-int ``dim`` / ``seq_dim``; a non-number ``theta``; at ``forward``,
            a non-float ``x`` or non-real ``positions``.
        ValueError: odd or non-positive ``dim``; non-positive ``theta``; ``seq_dim > -2``; at
            ``forward``, ``x`` with fewer than ``dim`` channels or too few axes, positions that do
            not broadcast.

    References:
        Su et al., RoFormer: Enhanced Transformer with Rotary Position Embedding, 2021.
    """

    def __init__(self, dim: int, theta: float = 10000.0, seq_dim: int = -2) -> None:
        super().__init__()
        dim = check_multiple(dim, 2, "dim", "channels are rotated in pairs")
        theta = check_temperature(theta, "theta")
        seq_dim = check_int(seq_dim, "seq_dim")
        if seq_dim > -2:
            raise ValueError(f"seq_dim must be <= -2 (the last axis holds the channels), got {seq_dim}")
        self.dim = dim
        self.theta = theta
        self.seq_dim = seq_dim

    def sincos(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """``sin`` and ``cos`` of ``positions * w_i``.

        Args:
            positions (Tensor[*P]): any real dtype; converted to float32.

        Returns:
            tuple[Tensor[*P, dim/2], Tensor[*P, dim/2]]: float32, on ``positions``' device.
        """
        table = sincos_embed(
            [positions], self.dim, temperature=self.theta, layout="split", reciprocal=True, channel_dim=-1
        )
        half = self.dim // 2
        return table[..., :half], table[..., half:]

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        """Rotates ``x``; see the class docstring for shapes.

        Args:
            x (Tensor[..., L, C]): queries or keys.
            positions (Tensor, optional): broadcastable to ``x.shape[:-1]``.

        Returns:
            Tensor: like ``x``.
        """
        _check_x(x, -self.seq_dim, f"(..., L, C) with L at seq_dim={self.seq_dim}")
        if x.shape[-1] < self.dim:
            raise ValueError(f"x has {x.shape[-1]} channels but dim={self.dim} are rotated, got {tuple(x.shape)}")
        lead = tuple(x.shape[:-1])
        if positions is None:
            length = x.shape[self.seq_dim]
            positions = torch.arange(length, device=x.device, dtype=torch.float32)
            positions = positions.view(length, *([1] * (-self.seq_dim - 2)))
        else:
            _check_positions(positions, lead, x.device, "(broadcastable to x.shape[:-1])")
        sin, cos = self.sincos(positions)
        return _rotate(x, sin, cos)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, theta={self.theta}, seq_dim={self.seq_dim}"


class AxialRotaryEmbedding(nn.Module):
    """Axial rotary position embedding for 2D / 3D token grids.

    The ``dim`` rotated channels are split into ``num_axes`` equal blocks, in tensor axis order
    (``D, H, W``); block ``a`` rotates its interleaved pairs by ``p_a * w_i`` with
    ``w_i = theta^(-2i / (dim / num_axes))``, ``p_a`` the token's integer coordinate along axis
    ``a``. Channels ``dim ..`` pass through. ``q . k`` then depends only on the offset between
    the two tokens along each axis. Equal to ``rotary_embedding_torch``'s
    ``RotaryEmbedding(dim // num_axes).get_axial_freqs(*S)`` applied with ``apply_rotary_emb``
    (``freqs_for="lang"``), in float32.

    The grid is read from ``x`` (``(..., *S, C)``), or from ``spatial`` for flattened tokens
    ``(..., N, C)`` with ``N = prod(spatial)`` in row-major order, or given per token by
    ``positions`` (``(..., num_axes)``, any real coordinates: kept tokens of a masked
    autoencoder, resized grids, fractional positions).

    Args:
        dim (int): rotated channels, a positive multiple of ``2 * num_axes``.
        num_axes (int): 2 (images) or 3 (volumes, videos). Default 2.
        theta (float): base of the frequency ladder. Default 10000.

    Shape:
        - x: ``Tensor[..., *S, C]`` (``len(S) = num_axes``), or ``Tensor[..., N, C]`` with
          ``spatial`` or ``positions``; ``C >= dim``; any float dtype.
        - spatial (optional): ``S``, a sequence of ``num_axes`` ints with product ``N``.
        - positions (optional): ``Tensor[..., num_axes]``, its leading dims broadcastable to
          ``x.shape[:-1]``.
        - output: like ``x`` (math in float32, cast back).

    Raises:
        TypeError: non-int ``dim`` / ``num_axes``; a non-number ``theta``; at ``forward``, a
            non-float ``x``, non-real ``positions``, a ``spatial`` that is not a sequence of ints.
        ValueError: ``num_axes`` not 2 or 3; ``dim`` not a positive multiple of ``2 * num_axes``;
            non-positive ``theta``; at ``forward``, both ``spatial`` and ``positions``; a grid
            whose product is not ``N``; too few channels or axes; positions that do not broadcast.

    References:
        Heo et al., Rotary Position Embedding for Vision Transformer, ECCV 2024 (RoPE-Axial);
        Su et al., RoFormer, 2021; ``rotary-embedding-torch`` ``get_axial_freqs``.
    """

    n_spatial = _deprecation.renamed_attribute("n_spatial", "num_axes")

    def __init__(self, dim: int, num_axes: int = 2, theta: float = 10000.0) -> None:
        super().__init__()
        num_axes = check_choice(num_axes, (2, 3), "num_axes")
        dim = check_multiple(dim, 2 * num_axes, "dim", f"each of the {num_axes} axes rotates an equal number of pairs")
        theta = check_temperature(theta, "theta")
        self.dim = dim
        self.num_axes = num_axes
        self.theta = theta

    @property
    def axis_dim(self) -> int:
        """Rotated channels per axis, ``dim // num_axes``."""
        return self.dim // self.num_axes

    def sincos(self, positions: list[Tensor], shape: tuple[int, ...] | None = None) -> tuple[Tensor, Tensor]:
        """``sin`` and ``cos`` of every axis' angles, axis blocks concatenated.

        Args:
            positions (list of Tensor): ``num_axes`` tensors (one per axis, tensor axis order),
                broadcastable to one another (or to ``shape``); any real dtype.
            shape (tuple of int, optional): the broadcast shape ``P``; inferred when not given.

        Returns:
            tuple[Tensor[*P, dim/2], Tensor[*P, dim/2]]: float32.
        """
        table = sincos_embed(
            positions, self.axis_dim, shape=shape, temperature=self.theta, layout="split",
            reciprocal=True, channel_dim=-1,
        )
        # (..., num_axes * [sin block, cos block]) -> per-axis sin blocks, then cos blocks.
        table = table.unflatten(-1, (self.num_axes, 2, self.axis_dim // 2))
        return table[..., 0, :].flatten(-2), table[..., 1, :].flatten(-2)

    @_deprecation.renamed_kwargs(grid_shape="spatial")
    def forward(
        self,
        x: Tensor,
        spatial: tuple[int, ...] | list[int] | None = None,
        positions: Tensor | None = None,
    ) -> Tensor:
        """Rotates ``x``; see the class docstring for shapes.

        Args:
            x (Tensor[..., *S, C] or Tensor[..., N, C]): queries or keys.
            spatial (sequence of int, optional): ``S`` for flattened tokens.
            positions (Tensor[..., num_axes], optional): per-token coordinates.

        Returns:
            Tensor: like ``x``.
        """
        n = self.num_axes
        if spatial is not None and positions is not None:
            raise ValueError("pass spatial or positions, not both")
        if positions is not None or spatial is not None:
            _check_x(x, 2, "(..., N, C)")
        else:
            _check_x(x, n + 1, f"(..., *S, C) with {n} grid axes")
        if x.shape[-1] < self.dim:
            raise ValueError(f"x has {x.shape[-1]} channels but dim={self.dim} are rotated, got {tuple(x.shape)}")
        if positions is not None:
            lead = tuple(x.shape[:-1])
            if positions.dim() < 1 or positions.shape[-1] != n:
                raise ValueError(
                    f"positions must have shape (..., num_axes={n}), got {tuple(positions.shape)}"
                )
            _check_positions(positions[..., 0], lead, x.device, "(positions[..., i] against x.shape[:-1])")
            sin, cos = self.sincos([positions[..., i] for i in range(n)])
            return _rotate(x, sin, cos)
        flat = spatial is not None
        spatial = self._check_grid(spatial, x) if flat else tuple(x.shape[-1 - n:-1])
        grid = []
        for i, size in enumerate(spatial):
            view = [1] * n
            view[i] = size
            grid.append(torch.arange(size, device=x.device, dtype=torch.float32).view(view))
        sin, cos = self.sincos(grid, spatial)
        if flat:
            sin, cos = sin.flatten(0, n - 1), cos.flatten(0, n - 1)
        return _rotate(x, sin, cos)

    def _check_grid(self, spatial: object, x: Tensor) -> tuple[int, ...]:
        spatial = check_sizes(spatial, "spatial", ranks=(self.num_axes,))
        if math.prod(spatial) != x.shape[-2]:
            raise ValueError(
                f"spatial {spatial} has {math.prod(spatial)} cells but x has N={x.shape[-2]} tokens "
                f"(shape {tuple(x.shape)})"
            )
        return spatial

    def extra_repr(self) -> str:
        return f"dim={self.dim}, num_axes={self.num_axes}, theta={self.theta}"
