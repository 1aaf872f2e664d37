"""Presets: each peer's grid sine embedding, number for number, for porting checkpoints.

Every preset is a call into the N-D core :func:`vispos._sincos.sincos_embed`; what differs from
peer to peer is only the axis order, the sin/cos layout, the token order, the frequency rounding
(``reciprocal=True``: multiply by an inverse-frequency table) and the compute dtype.

* :func:`timm_sincos_2d`: timm ``build_sincos2d_pos_embed`` (``[sin y, sin x, cos y, cos x]``);
* :func:`mae_sincos_2d`: MAE ``get_2d_sincos_pos_embed`` (``[sin x, cos x, sin y, cos y]``, float64,
  optional zero class-token row);
* :func:`monai_sincos`: MONAI ``build_sincos_position_embedding``, 2D and 3D (``w, h[, d]`` blocks,
  split layout);
* :func:`monai_fourier`: MONAI ``build_fourier_position_embedding`` (random Fourier features,
  per-axis ``scales``; the projection of :mod:`vispos.encodings.random_fourier`);
* :func:`dino_sine`: DINO's backbone ``PositionEmbeddingSineHW`` (DETR layout, temperature 20);
* :class:`PositionEmbeddingSineDepthAdded`: Mask2Former video ``PositionEmbeddingSine3D`` and mmdet
  ``SinePositionalEncoding3D`` (``cat(y, x) + z``).

References:
    He et al., Masked Autoencoders Are Scalable Vision Learners, CVPR 2022 (MAE);
    Chen et al., An Empirical Study of Training Self-Supervised Vision Transformers (MoCo v3,
    the 2D sin-cos of timm); MONAI ``networks/blocks/pos_embed_utils.py``; Zhang et al., DINO,
    ICLR 2023; Cheng et al., Mask2Former for Video Instance Segmentation, 2021.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .. import _deprecation
from .._checks import as_int, as_real, check_bool, check_choice, check_float_dtype, check_multiple, check_sizes
from .._sincos import check_temperature, sincos_embed
from ._fourier import check_finite_matrix, check_scale, fourier_features
from .sine import PositionEmbeddingSine, SineEmbeddingBase

__all__ = [
    "timm_sincos_2d",
    "mae_sincos_2d",
    "monai_sincos",
    "monai_fourier",
    "dino_sine",
    "PositionEmbeddingSineDepthAdded",
]


# ------------------------------------------------------------------------------------ helpers
def _grid_sincos(
    sizes: tuple[int, ...],
    order: Sequence[int],
    feats: int,
    temperature: float,
    *,
    compute_dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> Tensor:
    """``Tensor[prod(sizes), n * feats]``: split-layout blocks of the grid axes in ``order``.

    Tokens are in row-major order over ``sizes``; positions are ``0 .. S_i - 1``; angles are
    ``p * (1 / d_k)`` (``reciprocal``) as timm, MAE and MONAI compute them.
    """
    n = len(sizes)
    grid = []
    for i, size in enumerate(sizes):
        view = [1] * n
        view[i] = size
        grid.append(torch.arange(size, device=device, dtype=compute_dtype).view(view))
    table = sincos_embed(
        [grid[a] for a in order], feats, shape=sizes, temperature=temperature, layout="split",
        reciprocal=True, channel_dim=-1, dtype=compute_dtype, compute_dtype=compute_dtype,
    )
    return table.reshape(-1, n * feats)


# ------------------------------------------------------------------------------------ presets
def timm_sincos_2d(
    feat_shape: Sequence[int],
    dim: int = 64,
    temperature: float = 10000.0,
    reverse_coord: bool = False,
    interleave_sin_cos: bool = False,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """timm's 2D sin-cos embedding of an ``H x W`` token grid, flattened.

    Each axis gets ``dim / 4`` frequencies ``w_k = temperature^(-k / (dim/4))``; positions are
    ``0 .. S - 1``. Channels are ``[sin y, sin x, cos y, cos x]`` (each ``dim / 4``), or
    ``[sin y, cos y, sin x, cos x]`` with ``interleave_sin_cos``; ``reverse_coord`` stacks the
    grid as ``(W, H)`` (``x`` first, and tokens in ``W``-major order), as timm does.

    Args:
        feat_shape (sequence of 2 ints): ``(H, W)``.
        dim (int): channels, a positive multiple of 4. Default 64.
        temperature (float): ``T``. Default 10000.
        reverse_coord (bool): timm's flag, see above.
        interleave_sin_cos (bool): timm's flag, see above.
        device: where to build it. dtype (torch.dtype): output dtype (float32 math).

    Returns:
        Tensor[H * W, dim]: equal to ``timm.layers.build_sincos2d_pos_embed(feat_shape, dim,
        temperature, reverse_coord, interleave_sin_cos)``.

    Raises:
        TypeError: non-int sizes / ``dim``; non-bool flags; a ``dtype`` that is not a floating
            ``torch.dtype`` (an integer or bool dtype, a string).
        ValueError: ``feat_shape`` not two positive ints; ``dim`` not a positive multiple of 4;
            non-positive ``temperature``.

    References:
        timm ``layers/pos_embed_sincos.py``; Chen et al., MoCo v3, ICCV 2021.
    """
    sizes = check_sizes(feat_shape, "feat_shape", n=2)
    dim = check_multiple(dim, 4, "dim", "a sin and a cos per frequency, on 2 axes")
    temperature = check_temperature(temperature)
    reverse_coord = check_bool(reverse_coord, "reverse_coord")
    interleave_sin_cos = check_bool(interleave_sin_cos, "interleave_sin_cos")
    check_float_dtype(dtype)
    if reverse_coord:
        sizes = sizes[::-1]
    table = _grid_sincos(sizes, (0, 1), dim // 2, temperature, device=device)
    if not interleave_sin_cos:
        # per-axis [sin, cos] blocks -> [sin y, sin x, cos y, cos x]: a channel permutation only
        table = table.unflatten(-1, (2, 2, dim // 4)).transpose(1, 2).flatten(1)
    return table.to(dtype)


def mae_sincos_2d(
    embed_dim: int,
    grid_size: int | Sequence[int],
    cls_token: bool = False,
    *,
    temperature: float = 10000.0,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """MAE's 2D sin-cos embedding (``get_2d_sincos_pos_embed``), computed in float64 as MAE does.

    Channels are ``[sin x, cos x]`` then ``[sin y, cos y]`` (each half ``embed_dim / 2``; MAE's
    ``emb_h`` is in fact the ``x`` coordinate), frequencies ``w_k = temperature^(-k / (D/4))``,
    positions ``0 .. S - 1``, tokens row-major over ``(H, W)``. With ``cls_token`` a zero row is
    prepended, as MAE's ``pos_embed`` holds for the class token.

    Args:
        embed_dim (int): ``D``, a positive multiple of 4.
        grid_size (int or (H, W)): the patch grid; an int means square.
        cls_token (bool): prepend a zero row. Default False.
        temperature (float): ``T``. Default 10000 (MAE's constant).
        device: where to build it. dtype (torch.dtype): output dtype. Default float32 (MAE copies
            its float64 numpy table into a float32 parameter).

    Returns:
        Tensor[(1 +) H * W, embed_dim].

    Raises:
        TypeError: non-int sizes; non-bool ``cls_token``; a ``dtype`` that is not a floating
            ``torch.dtype`` (an integer or bool dtype, a string).
        ValueError: bad ``grid_size``; ``embed_dim`` not a positive multiple of 4; non-positive
            ``temperature``.

    References:
        He et al., Masked Autoencoders Are Scalable Vision Learners, CVPR 2022
        (``util/pos_embed.py``).
    """
    embed_dim = check_multiple(embed_dim, 4, "embed_dim", "a sin and a cos per frequency, on 2 axes")
    sizes = check_sizes(grid_size, "grid_size", n=2)
    temperature = check_temperature(temperature)
    cls_token = check_bool(cls_token, "cls_token")
    check_float_dtype(dtype)
    table = _grid_sincos(sizes, (1, 0), embed_dim // 2, temperature, compute_dtype=torch.float64, device=device)
    if cls_token:
        table = torch.cat((table.new_zeros(1, embed_dim), table), dim=0)
    return table.to(dtype)


def monai_sincos(
    grid_size: int | Sequence[int],
    embed_dim: int,
    spatial_dims: int = 3,
    temperature: float = 10000.0,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """MONAI's sin-cos embedding of a 2D or 3D patch grid (``build_sincos_position_embedding``).

    Each axis gets ``embed_dim / spatial_dims`` channels in the split layout (sines first) with
    frequencies ``w_k = temperature^(-k / F)``, ``F = embed_dim / (2 * spatial_dims)``; positions
    are ``0 .. S - 1`` and tokens row-major over ``grid_size``. The axis blocks are in MONAI's
    order: the second axis first, then the first, then the third (``w, h[, d]`` for a grid given
    as ``(h, w[, d])``).

    Args:
        grid_size (int or sequence of ints): ``spatial_dims`` sizes; an int means isotropic.
        embed_dim (int): a positive multiple of ``2 * spatial_dims``.
        spatial_dims (int): 2 or 3. Default 3.
        temperature (float): ``T``. Default 10000.
        device: where to build it. dtype (torch.dtype): output dtype (float32 math).

    Returns:
        Tensor[1, prod(grid_size), embed_dim]: a plain tensor (MONAI wraps it in a frozen
        ``nn.Parameter``; register it as a buffer instead to keep it out of checkpoints).

    Raises:
        TypeError: non-int sizes or ``spatial_dims``; a ``dtype`` that is not a floating
            ``torch.dtype`` (an integer or bool dtype, a string).
        ValueError: ``spatial_dims`` not 2 or 3; bad ``grid_size``; ``embed_dim`` not a positive
            multiple of ``2 * spatial_dims``; non-positive ``temperature``.

    References:
        MONAI ``networks/blocks/pos_embed_utils.py``; SelfMedMAE ``lib/models/mae3d.py``.
    """
    spatial_dims = check_choice(spatial_dims, (2, 3), "spatial_dims")
    sizes = check_sizes(grid_size, "grid_size", n=spatial_dims)
    embed_dim = check_multiple(embed_dim, 2 * spatial_dims, "embed_dim", f"a sin and a cos per frequency, on {spatial_dims} axes")
    temperature = check_temperature(temperature)
    check_float_dtype(dtype)
    order = (1, 0, 2)[:spatial_dims]
    table = _grid_sincos(sizes, order, embed_dim // spatial_dims, temperature, device=device)
    return table.unsqueeze(0).to(dtype)


def monai_fourier(
    grid_size: int | Sequence[int],
    embed_dim: int,
    spatial_dims: int = 3,
    scales: float | Sequence[float] = 1.0,
    *,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """MONAI's random Fourier embedding of a 2D or 3D patch grid (``build_fourier_position_embedding``).

    Draws ``gaussians = randn(embed_dim // 2, spatial_dims) * scales`` from the global generator
    (or ``generator``) as MONAI does, so under the same seed the table is MONAI's, bit for bit.
    Positions are corner-aligned, ``linspace(0, 1, S)`` per axis (no centring, no map to
    ``[-1, 1]``), in tensor axis order; tokens are row-major over ``grid_size``; channels are
    ``[sin(2 pi p @ gaussians.T), cos(...)]``.

    The same embedding as the module: ``scales`` multiplies the rows of the module's
    ``positional_encoding_gaussian_matrix`` (``G = gaussians.T``, shape ``(spatial_dims,
    embed_dim // 2)``: the module's ``scale`` given per axis), so MONAI's table is, up to
    float32 rounding (MONAI scales the positions by ``2 pi`` before the projection, SAM after),
    ``m(grid_size).flatten(1).T[None]`` for ``m = PositionEmbeddingRandom(embed_dim // 2,
    num_axes=spatial_dims, coord_order="ij", align_corners=True, coord_range=(0.0, 1.0))`` with
    ``m.positional_encoding_gaussian_matrix`` set to ``G`` (the module draws its own matrix as
    SAM does, ``scale * randn(num_axes, K)``: another draw under the same seed).

    Args:
        grid_size (int or sequence of ints): ``spatial_dims`` sizes; an int means isotropic.
        embed_dim (int): a positive even int.
        spatial_dims (int): 2 or 3. Default 3.
        scales (float or sequence of spatial_dims floats): the standard deviation of the
            frequencies along each axis (> 0). Default 1.0.
        generator (torch.Generator, optional, keyword-only): for the draw.
        device: where to build it. dtype (torch.dtype): output dtype, floating (float32 math,
            also under ``torch.autocast``).

    Returns:
        Tensor[1, prod(grid_size), embed_dim]: a plain tensor (MONAI wraps it in a frozen
        ``nn.Parameter``).

    Raises:
        TypeError: non-int sizes, ``embed_dim`` or ``spatial_dims``; ``scales`` not numbers; a
            ``dtype`` that is not a floating ``torch.dtype`` (an integer or bool dtype, a string).
        ValueError: ``spatial_dims`` not 2 or 3; bad ``grid_size``; odd or non-positive
            ``embed_dim``; ``scales`` of another length, not > 0 or overflowing float32 (in the
            matrix or its angles), or a NumPy ``longdouble`` a Python float cannot hold.

    References:
        MONAI ``networks/blocks/pos_embed_utils.py``; Tancik et al., Fourier Features Let
        Networks Learn High Frequency Functions in Low Dimensional Domains, NeurIPS 2020.
    """
    as_integer = as_int(spatial_dims)
    spatial_dims = check_choice(spatial_dims if as_integer is None else as_integer, (2, 3), "spatial_dims")
    sizes = check_sizes(grid_size, "grid_size", n=spatial_dims)
    embed_dim = check_multiple(embed_dim, 2, "embed_dim", "a sin and a cos per frequency")
    check_float_dtype(dtype)
    if not isinstance(scales, (str, bytes, Sequence)) and as_real(scales, "scales") is not None:
        scales = as_real(scales, "scales")  # NumPy / 0-d torch scalars as Python numbers
    if isinstance(scales, (str, bytes)) or not isinstance(scales, (int, float, Sequence)):
        raise TypeError(f"scales must be a number or a sequence of {spatial_dims} numbers, got {scales!r}")
    if isinstance(scales, Sequence) and len(scales) != spatial_dims:
        raise ValueError(f"scales must hold {spatial_dims} numbers (one per axis), got {list(scales)}")
    values = [scales] * spatial_dims if isinstance(scales, (int, float)) else scales
    values = check_scale(values, spatial_dims, "scales")
    gaussians = torch.randn(embed_dim // 2, spatial_dims, dtype=torch.float32, generator=generator)
    gaussians = gaussians * torch.tensor(values, dtype=torch.float32)
    gaussians = check_finite_matrix(gaussians.T, scales, "scales").T.to(device)
    n = spatial_dims
    lines = [torch.linspace(0, 1, s, dtype=torch.float32, device=gaussians.device) for s in sizes]
    views = [line.view(*(s if i == a else 1 for i, s in enumerate(sizes))).expand(sizes) for a, line in enumerate(lines)]
    coords = torch.stack(views, dim=-1).view(-1, n)
    table = fourier_features(coords, gaussians.T, scale_first=True)
    return table.unsqueeze(0).to(dtype)


def dino_sine(num_pos_feats: int = 128, temperature: float = 20) -> PositionEmbeddingSine:
    """DINO's backbone position embedding: DETR's normalised sine at temperature 20.

    DINO builds ``PositionEmbeddingSineHW(hidden_dim // 2, temperatureH=20, temperatureW=20,
    normalize=True)``: cumulative positions normalised by ``(p) / (p_last + 1e-6) * 2 pi`` (no
    ``-0.5`` offset), interleaved sin / cos, ``y`` block then ``x`` block.

    Args:
        num_pos_feats (int): channels per axis, ``hidden_dim // 2``. Default 128.
        temperature (float): both of DINO's temperatures. Default 20.

    Returns:
        PositionEmbeddingSine: ``(B, 2 * num_pos_feats, H, W)`` from a mask or NestedTensor.

    Raises:
        TypeError, ValueError: as :class:`PositionEmbeddingSine`.

    References:
        Zhang et al., DINO: DETR with Improved DeNoising Anchor Boxes, ICLR 2023
        (``models/dino/position_encoding.py``, ``pe_temperatureH = pe_temperatureW = 20``).
    """
    return PositionEmbeddingSine(num_pos_feats, temperature, normalize=True)


class PositionEmbeddingSineDepthAdded(SineEmbeddingBase):
    """3D sine embedding where the depth / time term is *added* to the 2D one, not concatenated.

    ``pos = cat(PE_y, PE_x) + PE_z``: ``PE_y`` and ``PE_x`` are DETR's interleaved sine with
    ``num_pos_feats`` channels each, ``PE_z`` the same with ``2 * num_pos_feats`` channels (so
    its frequencies are ``temperature^(-2k / (2 * num_pos_feats))``). Positions are counted over
    valid cells as in :func:`~vispos.encodings.sine.cumulative_positions` (optionally normalised
    with ``offset``). This is Mask2Former's video ``PositionEmbeddingSine3D`` and mmdet's
    ``SinePositionalEncoding3D``; both return ``(B, T, C, H, W)``: take ``.transpose(1, 2)`` of
    this module's output to get their layout.

    Args:
        num_pos_feats (int): channels of each of the ``y`` and ``x`` blocks (positive, even).
            Default 64.
        temperature (float): ``T``. Default 10000.
        normalize (bool): map positions to ``[0, scale]``. Default False.
        scale (float, optional): the normalised range, ``2 * pi`` when not given; only with
            ``normalize``.
        offset (float): added before normalising (mmdet's ``offset``). Default 0.
        eps (float): added to the denominator when normalising. Default 1e-6.
        extent (float, optional, keyword-only): with ``normalize``, one length for every axis,
            as for :class:`~vispos.PositionEmbeddingSine`; so is ``forward(..., spacing=...)``
            (positions in millimetres, per item).
        cache_size, cache_bytes, zero_copy: the cache, as for
            :class:`~vispos.PositionEmbeddingSine` (results are the caller's own unless
            ``zero_copy=True``).

    A sibling of :class:`~vispos.PositionEmbeddingSine` over the same base
    (:class:`~vispos.encodings.sine.SineEmbeddingBase`): the same validation, output-dtype
    check, cache, empty-input rule and rectangular fast path; only the last step (concatenate
    vs add) differs. It reports :meth:`out_channels` ``= 2 * num_pos_feats``, so the Joiner
    checks ``hidden_dim`` against that.

    Shape:
        - input: a :class:`NestedTensor` ``(B, C, D, H, W)`` (or DETR's own ``NestedTensor``); a bool mask ``Tensor[B, D, H, W]``
          (True = padding); or a feature map ``Tensor[B, C, D, H, W]`` meaning "no padding".
        - output: ``Tensor[B, 2 * num_pos_feats, D, H, W]``, channels-first, float32 unless
          ``dtype`` is given. A new tensor owned by the caller (unless ``zero_copy=True``).

    Raises:
        TypeError: non-int ``num_pos_feats``; non-number options; a non-bool mask (with a hint);
            an input of another type; a non-floating output ``dtype``.
        ValueError: odd or non-positive ``num_pos_feats``; ``scale`` without ``normalize``;
            non-positive ``temperature`` / ``scale``; negative ``eps``; an input that is not 3D.

    References:
        Cheng et al., Mask2Former for Video Instance Segmentation, 2021
        (``video/modeling/transformer_decoder/position_encoding.py``); mmdet
        ``SinePositionalEncoding3D``; Carion et al., DETR, ECCV 2020.
    """

    num_axes = 3

    @_deprecation.renamed_kwargs(n_axes="num_axes")
    def out_channels(self, num_axes: int = 3) -> int:
        """``2 * num_pos_feats``: the ``y, x`` blocks, with the depth term added to them."""
        return 2 * self.num_pos_feats

    def _embed(self, positions: list[Tensor], shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
        pos_z, pos_y, pos_x = positions
        plane = sincos_embed([pos_y, pos_x], self.num_pos_feats, shape=shape, temperature=self.temperature)
        depth = sincos_embed([pos_z], 2 * self.num_pos_feats, shape=shape, temperature=self.temperature)
        return (plane + depth).to(dtype)
