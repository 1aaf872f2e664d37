"""Learned absolute position embeddings: DETR's per-axis tables (N-D, resizable) and ViT resampling.

References:
    Carion et al., End-to-End Object Detection with Transformers, ECCV 2020
    (``models/position_encoding.py``, ``PositionEmbeddingLearned``);
    Dosovitskiy et al., An Image is Worth 16x16 Words, ICLR 2021 (interpolating the position
    embeddings of a pre-trained ViT at another resolution); timm ``layers/pos_embed.py``
    (``resample_abs_pos_embed``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import _deprecation
from .._checks import as_sequence, check_bool, check_choice, check_float_dtype, check_int, check_sizes, describe, is_int
from ..nested_tensor import NestedTensor, NestedTensorLike, float_mask_hint, parse_spatial_input
from ._call import read_masks

__all__ = ["PositionEmbeddingLearned", "resample_abs_pos_embed"]

# Table names of the last three tensor axes (D, H, W); DETR's 2D checkpoints use the last two.
_TABLE_NAMES = ("depth_embed", "row_embed", "col_embed")
# transformers' DetrLearnedPositionEmbedding names, accepted when loading a state dict.
_HF_NAMES = {"row_embeddings": "row_embed", "column_embeddings": "col_embed"}


class PositionEmbeddingLearned(nn.Module):
    """DETR's learned position embedding: one table per spatial axis, for 1, 2 or 3 axes.

    Axis ``i`` (of ``n`` spatial axes) has a table of ``num_embeddings[i]`` rows of
    ``num_pos_feats`` channels, initialised ``U(0, 1)`` as DETR does. The cell at index ``p_i``
    along every axis gets the rows ``table_i[p_i]``, concatenated along channels in **reverse**
    tensor axis order: ``W, H, D`` (x, y, z). In 2D this is DETR's ``col_embed`` (x) block then
    ``row_embed`` (y) block, and the module equals DETR's ``PositionEmbeddingLearned`` and
    transformers' ``DetrLearnedPositionEmbedding``. The tables are ``nn.Embedding`` modules named
    ``col_embed`` (last axis), ``row_embed`` and ``depth_embed`` (first of three), so a DETR
    checkpoint's ``row_embed.weight`` / ``col_embed.weight`` load as they are; transformers'
    ``row_embeddings`` / ``column_embeddings`` keys are renamed on load.

    Like DETR, the padding mask is ignored: positions are cell indices. An axis shorter than its
    table uses the table's first rows. An axis longer than its table raises ``ValueError``, or
    with ``interpolate=True`` the whole table is resized to the axis' length (linear
    interpolation, ``align_corners=False``, in float32 — float64 for a float64 table —,
    differentiable), so a model trained at one resolution runs at a larger one.

    Args:
        num_pos_feats (int): channels per axis (positive). Default 256 (DETR).
        num_embeddings (int or sequence of int): rows per table, one int for every axis or one
            per axis in tensor axis order (``D, H, W``). Default 50 (DETR).
        interpolate (bool): resize tables that are too short instead of raising. Default False.
        num_axes (int, optional): number of spatial axes, 1 to 3. Default: the length of
            ``num_embeddings`` when it is a sequence, else 2.

    Shape:
        - input: a :class:`NestedTensor` ``(B, C, *S)``; a bool mask ``Tensor[B, *S]``; or a
          feature map ``Tensor[B, C, *S]``, with ``len(S) == num_axes``. Only its shape and
          device are read.
        - output: ``Tensor[B, num_axes * num_pos_feats, *S]``, channels-first, in the
          tables' dtype unless ``forward(..., dtype=...)`` says otherwise; a broadcast view over
          the batch (DETR copies it ``B`` times): ``.clone()`` it before writing in place.

    Raises:
        TypeError: a non-int ``num_pos_feats`` / ``num_embeddings`` / ``num_axes``; a non-bool
            ``interpolate``; an input of another type, or a non-bool integer mask.
        ValueError: non-positive sizes; ``num_axes`` outside 1..3 or disagreeing with
            ``num_embeddings``; an input with another number of spatial axes, on another device
            than the tables, or (without ``interpolate``) longer than a table along some axis.

    References:
        Carion et al., End-to-End Object Detection with Transformers, ECCV 2020.
    """

    @_deprecation.renamed_kwargs(spatial_dims="num_axes")
    def __init__(
        self,
        num_pos_feats: int = 256,
        num_embeddings: int | Sequence[int] = 50,
        interpolate: bool = False,
        num_axes: int | None = None,
    ) -> None:
        super().__init__()
        num_pos_feats = check_int(num_pos_feats, "num_pos_feats", minimum=1)
        interpolate = check_bool(interpolate, "interpolate")
        if num_axes is not None:
            num_axes = check_choice(num_axes, (1, 2, 3), "num_axes")
        if is_int(num_embeddings):  # one size for every axis
            num_embeddings = check_int(num_embeddings, "num_embeddings", minimum=1)
            n = 2 if num_axes is None else num_axes
            sizes = (num_embeddings,) * n
        elif as_sequence(num_embeddings) is not None:
            sizes = tuple(
                check_int(v, f"num_embeddings[{i}]", minimum=1) for i, v in enumerate(as_sequence(num_embeddings))
            )
            if not 1 <= len(sizes) <= 3:
                raise ValueError(
                    "num_embeddings must hold one int per spatial axis (1 to 3), "
                    f"got {tuple(sizes)}"
                )
            if num_axes is not None and num_axes != len(sizes):
                raise ValueError(
                    f"num_embeddings has {len(sizes)} entries {sizes} but "
                    f"num_axes={num_axes}"
                )
        else:
            raise TypeError(
                "num_embeddings must be a positive int or a sequence of one positive int per axis, "
                f"got {describe(num_embeddings)}"
            )
        self.num_pos_feats = num_pos_feats
        self.num_embeddings = sizes
        self.interpolate = interpolate
        self.num_axes = len(sizes)
        self._names = _TABLE_NAMES[3 - self.num_axes:]
        for name, rows in zip(self._names, sizes):
            self.add_module(name, nn.Embedding(rows, num_pos_feats))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Re-draws every table from ``U(0, 1)`` (DETR's ``nn.init.uniform_``)."""
        for table in self._tables():
            nn.init.uniform_(table.weight)

    # ------------------------------------------------------------------------------------ api
    @_deprecation.renamed_kwargs(n_axes="num_axes")
    def out_channels(self, num_axes: int | None = None) -> int:
        """``num_axes * num_pos_feats``: one block per axis (the module's own axis count)."""
        return self.num_axes * self.num_pos_feats

    n_spatial = _deprecation.renamed_attribute("n_spatial", "num_axes")
    spatial_dims = _deprecation.renamed_attribute("spatial_dims", "num_axes")

    def forward(
        self,
        x: NestedTensor | NestedTensorLike | Tensor,
        mask: Tensor | None = None,
        *,
        pixel_mask: Tensor | None = None,
        dtype: torch.dtype | None = None,
    ) -> Tensor:
        """Embeds the cell indices of ``x``; see the class docstring for shapes.

        Args:
            x (NestedTensor | NestedTensorLike | Tensor[B, *S] bool | Tensor[B, C, *S]): what to
                embed (DETR's own ``NestedTensor`` is accepted as it is).
            mask (Tensor[B, *S] bool, optional): DETR's mask of a feature map ``x`` (True =
                padding), as in ``pos(features, mask)``; checked, and (as in DETR) not used.
            pixel_mask (Tensor[B, *S], optional, keyword-only): transformers' mask (1 = valid,
                0 = padding; on the CPU another value is refused) instead; not together with ``mask``.
            dtype (torch.dtype, optional, keyword-only): output dtype (floating); the tables'
                dtype when not given (as the second positional argument: deprecated, warns).

        Raises:
            TypeError: ``x`` of another type; a ``mask`` that is not a bool tensor; both masks,
                or either with an ``x`` that carries its own; a non-floating or
                non-``torch.dtype`` ``dtype``.
            ValueError: another number of spatial axes; a mask not of shape ``(B, *S)``; a CPU
                ``pixel_mask`` holding a value other than 0 and 1; ``x``
                on another device than the tables; an axis longer than its table without
                ``interpolate``.
        """
        x, dtype = read_masks(type(self).__name__, x, mask, pixel_mask, dtype)
        check_float_dtype(dtype, optional=True)
        padding = parse_spatial_input(x, self.num_axes).padding
        spatial, batch, device = padding.spatial, padding.batch, padding.device
        n = self.num_axes
        if len(spatial) != n:
            raise ValueError(
                f"{type(self).__name__}(num_axes={n}) got an input with {len(spatial)} spatial "
                f"axes {spatial}; build it with num_axes={len(spatial)} (or num_embeddings "
                f"with one entry per axis){float_mask_hint(x, n)}"
            )
        tables = self._tables()
        if tables[0].weight.device != device:
            raise ValueError(
                f"the input is on {device} but the embedding tables are on "
                f"{tables[0].weight.device}; move the module with .to({str(device)!r})"
            )
        blocks = []
        for axis in reversed(range(n)):  # x (last axis) first, as DETR
            rows = self._rows(axis, spatial[axis])  # (S_i, F)
            view = [self.num_pos_feats] + [1] * n
            view[1 + axis] = spatial[axis]
            blocks.append(rows.t().reshape(view).expand(self.num_pos_feats, *spatial))
        pos = torch.cat(blocks, dim=0)
        if dtype is not None:
            pos = pos.to(dtype)
        return pos.unsqueeze(0).expand(batch, *pos.shape)

    def extra_repr(self) -> str:
        return (
            f"num_pos_feats={self.num_pos_feats}, num_embeddings={self.num_embeddings}, "
            f"interpolate={self.interpolate}, num_axes={self.num_axes}"
        )

    # -------------------------------------------------------------------------------- helpers
    def _tables(self) -> list[nn.Embedding]:
        return [getattr(self, name) for name in self._names]

    def _rows(self, axis: int, size: int) -> Tensor:
        """The first ``size`` rows of axis ``axis``'s table, or the table resized to ``size``."""
        weight = self._tables()[axis].weight
        rows = weight.shape[0]
        if size <= rows:
            return weight[:size]
        if not self.interpolate:
            raise ValueError(
                f"the feature map has {size} cells along spatial axis {axis} but the "
                f"{self._names[axis]} table has num_embeddings={rows} rows; use a larger "
                "num_embeddings, a smaller input, or interpolate=True to resize the table"
            )
        compute = torch.float64 if weight.dtype == torch.float64 else torch.float32
        resized = F.interpolate(
            weight.t().unsqueeze(0).to(compute), size=size, mode="linear", align_corners=False
        )
        return resized[0].t().to(weight.dtype)

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ) -> None:
        # transformers' DetrLearnedPositionEmbedding calls the tables row_/column_embeddings
        for hf_name, name in _HF_NAMES.items():
            old, new = prefix + hf_name + ".weight", prefix + name + ".weight"
            if name in self._names and old in state_dict and new not in state_dict:
                state_dict[new] = state_dict.pop(old)
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )


_MODES = {
    2: ("nearest", "nearest-exact", "bilinear", "bicubic", "area"),
    3: ("nearest", "nearest-exact", "trilinear", "area"),
}


def _infer_grid(num_tokens: int, rank: int) -> tuple[int, ...] | None:
    side = round(num_tokens ** (1.0 / rank))
    for s in (side - 1, side, side + 1):
        if s > 0 and s**rank == num_tokens:
            return (s,) * rank
    return None


@_deprecation.renamed_kwargs(mode="interpolation")
def resample_abs_pos_embed(
    posemb: Tensor,
    new_size: Sequence[int],
    old_size: Sequence[int] | None = None,
    num_prefix_tokens: int = 1,
    interpolation: str = "bicubic",
    antialias: bool = True,
    verbose: bool = False,
    align_corners: bool | None = None,
) -> Tensor:
    """Resizes a ViT-style absolute position embedding to another 2D or 3D grid.

    The embedding holds ``num_prefix_tokens`` tokens (class / register tokens, kept as they are)
    followed by a grid of ``prod(old_size)`` tokens in row-major (``H, W`` or ``D, H, W``) order.
    The grid is reshaped to ``(B, C, *old_size)``, resized with ``F.interpolate`` to ``new_size``
    (in float32; float64 for a float64 input) and flattened back. For 2D grids in float32 it
    equals timm's ``resample_abs_pos_embed`` and takes its arguments in its order and names (a
    drop-in); unlike it, non-square old grids are never guessed.

    Args:
        posemb (Tensor[B, N, C], floating): the embedding, usually ``B = 1``, with
            ``N = num_prefix_tokens + prod(old_size)``. Not modified.
        new_size (sequence of int): the target grid, ``(H', W')`` or ``(D', H', W')``.
        old_size (sequence of int, optional): the current grid, same length as ``new_size``.
            When not given it is inferred only if the grid token count is a perfect square
            (cube), as a square (cube) grid; pass it for any other grid.
        num_prefix_tokens (int): leading tokens that are not on the grid. Default 1.
        interpolation (str): the ``F.interpolate`` mode (timm's name): ``nearest``,
            ``nearest-exact``, ``bilinear``, ``bicubic`` or ``area`` for 2D grids; ``nearest``,
            ``nearest-exact``, ``trilinear`` or ``area`` for 3D grids. Default ``bicubic``
            (timm). Formerly ``mode``: that keyword still works, with a
            ``DeprecationWarning``.
        antialias (bool): anti-aliasing when down-sampling with ``bilinear`` / ``bicubic`` (the
            modes torch supports it for); ignored otherwise. Default True (timm).
        verbose (bool): log the resize (``logging``, level INFO), as timm does. Default False.
        align_corners (bool, optional): ``F.interpolate``'s, for the linear and cubic modes
            (None for the others). Default None (torch's False).

    Returns:
        Tensor[B, num_prefix_tokens + prod(new_size), C]: a new tensor in ``posemb``'s dtype and
        device; ``posemb`` itself when ``old_size == new_size``.

    Raises:
        TypeError: ``posemb`` is not a floating tensor; sizes are not sequences of ints;
            ``num_prefix_tokens`` is not an int; ``antialias`` is not a bool.
        ValueError: ``posemb`` is not 3-D; sizes of the wrong length or non-positive;
            ``num_prefix_tokens`` negative or larger than ``N``; ``old_size`` not given and not
            inferable, or not matching ``N``; ``interpolation`` not available for the grid's rank.

    References:
        Dosovitskiy et al., An Image is Worth 16x16 Words, ICLR 2021 (sec. 3.2, "Fine-tuning and
        higher resolution"); timm ``timm/layers/pos_embed.py``.
    """
    if not isinstance(posemb, Tensor):
        raise TypeError(f"posemb must be a Tensor (B, N, C), got {type(posemb).__name__}")
    if not posemb.dtype.is_floating_point:
        raise TypeError(f"posemb must be a floating tensor, got {posemb.dtype}")
    if posemb.dim() != 3:
        raise ValueError(f"posemb must have shape (B, N, C), got {tuple(posemb.shape)}")
    new = check_sizes(new_size, "new_size", ranks=(2, 3))
    rank = len(new)
    num_prefix_tokens = check_int(num_prefix_tokens, "num_prefix_tokens")
    num_tokens = posemb.shape[1]
    if not 0 <= num_prefix_tokens <= num_tokens:
        raise ValueError(
            f"num_prefix_tokens must be in [0, N={num_tokens}] for posemb of shape "
            f"{tuple(posemb.shape)}, got {num_prefix_tokens}"
        )
    antialias = check_bool(antialias, "antialias")
    verbose = check_bool(verbose, "verbose")
    align_corners = check_bool(align_corners, "align_corners", optional=True)
    mode = interpolation
    if mode not in _MODES[rank]:
        hint = ""
        if rank == 3 and mode in ("bilinear", "bicubic"):
            hint = "; use 'trilinear' for 3D grids"
        raise ValueError(
            f"interpolation for a {rank}D grid must be one of {_MODES[rank]}, got {mode!r}{hint}"
        )
    grid_tokens = num_tokens - num_prefix_tokens
    if old_size is None:
        old = _infer_grid(grid_tokens, rank)
        if old is None:
            kind = "square" if rank == 2 else "cube"
            raise ValueError(
                f"cannot infer old_size: posemb has {grid_tokens} grid tokens ({num_tokens} minus "
                f"{num_prefix_tokens} prefix tokens), which is not a perfect {kind}; pass old_size"
            )
    else:
        old = check_sizes(old_size, "old_size", n=rank)
        if math.prod(old) != grid_tokens:
            raise ValueError(
                f"old_size {old} holds {math.prod(old)} tokens but posemb of shape "
                f"{tuple(posemb.shape)} has {grid_tokens} grid tokens after {num_prefix_tokens} "
                "prefix tokens"
            )
    if old == new:
        return posemb

    batch, _, channels = posemb.shape
    prefix = posemb[:, :num_prefix_tokens]
    compute = torch.float64 if posemb.dtype == torch.float64 else torch.float32
    grid = posemb[:, num_prefix_tokens:].to(compute).reshape(batch, *old, channels).movedim(-1, 1)
    linear = mode in ("bilinear", "bicubic", "trilinear")
    grid = F.interpolate(
        grid, size=new, mode=mode, antialias=antialias and mode in ("bilinear", "bicubic"),
        align_corners=align_corners if linear else None,
    )
    if verbose:
        logging.getLogger(__name__).info("Resized position embedding: %s to %s.", old, new)
    grid = grid.movedim(1, -1).reshape(batch, -1, channels).to(posemb.dtype)
    return torch.cat([prefix, grid], dim=1) if num_prefix_tokens else grid
