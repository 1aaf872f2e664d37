"""Feature levels flattened into one sequence (Deformable-DETR's encoder input) and back.

:func:`flatten_levels` turns per-level features and position embeddings (2D or 3D, each level
with its own :class:`~vispos.Padding`) into one :class:`FlatLevels` sequence with its
``spatial_shapes``, ``level_start_index`` and ``valid_ratios``; :func:`unflatten_levels` splits
a sequence back into levels. The producer (:class:`vispos.backbones.Joiner`) and the consumer
(:class:`vispos.transformer.DetrEncoder`) both import this room, which sits below both.

References:
    Zhu et al., Deformable DETR, ICLR 2021 (``deformable_transformer.py``: flattening,
    ``spatial_shapes``, ``level_start_index``, ``get_valid_ratio``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from einops import rearrange
from torch import Tensor

from . import _tracing
from ._tracing import host_facts
from .nested_tensor import NestedTensor
from .padding import Padding

__all__ = ["FlatLevels", "flatten_levels", "unflatten_levels"]


class FlatLevels(NamedTuple):
    """Feature levels flattened into one sequence, as Deformable-DETR's encoder takes them.

    ``N = sum_l prod(S_l)``; cells of level ``l`` occupy ``[level_start_index[l],
    level_start_index[l] + prod(S_l))`` in row-major order of ``S_l``.

    Attributes:
        src (Tensor[B, N, C]): features, batch-first.
        pos (Tensor[B, N, C]): position embedding plus the level embedding (when there is one).
        key_padding_mask (Tensor[B, N], bool): True = padding.
        spatial_shapes (Tensor[L, num_axes], int64): each level's ``S_l`` in tensor axis order
            (``H, W`` / ``D, H, W``).
        level_start_index (Tensor[L], int64): offset of each level in ``N``.
        valid_ratios (Tensor[B, L, num_axes]): each item's valid extent per level as a fraction of
            the padded size, in Deformable-DETR's order: **last axis first** (``(w, h)`` in 2D,
            ``(w, h, d)`` in 3D: the ``x, y, z`` order of ``grid_sample``). ``src``'s dtype.
        spatial_shapes_list (list[tuple[int, ...]]): ``spatial_shapes`` as Python ints (no host
            synchronisation needed to split the sequence).
    """

    src: Tensor
    pos: Tensor
    key_padding_mask: Tensor
    spatial_shapes: Tensor
    level_start_index: Tensor
    valid_ratios: Tensor
    spatial_shapes_list: list[tuple[int, ...]]


def flatten_levels(
    features: Sequence[NestedTensor | Tensor],
    pos: Sequence[Tensor],
    level_embed: Tensor | None = None,
) -> FlatLevels:
    """Flattens feature levels and their position embeddings into one sequence.

    Exactly Deformable-DETR's preparation of the encoder input (``src_flatten``,
    ``lvl_pos_embed_flatten``, ``mask_flatten``, ``spatial_shapes``, ``level_start_index``,
    ``valid_ratios``), for 2D or 3D levels. Inputs are not modified.

    Args:
        features (sequence of NestedTensor[B, C, *S_l] or Tensor[B, C, *S_l]): the levels; a
            plain tensor or a NestedTensor without mask means no padding.
        pos (sequence of Tensor[B, C, *S_l]): each level's position embedding.
        level_embed (Tensor[L, C], optional): added to level ``l``'s ``pos`` (Deformable-DETR).

    Returns:
        FlatLevels: see its attributes.

    Raises:
        TypeError: a level is neither a NestedTensor nor a Tensor.
        ValueError: no levels; ``features`` and ``pos`` differ in length; levels differ in batch
            size, channels (project them to one ``hidden_dim`` first) or rank; ``pos`` does not
            match its level's shape; ``level_embed`` is not ``(L, C)``.

    References:
        Zhu et al., Deformable DETR, ICLR 2021 (``DeformableTransformer.forward``).
    """
    if len(features) == 0:
        raise ValueError("features must hold at least one level, got none")
    if len(features) != len(pos):
        raise ValueError(f"features ({len(features)} levels) and pos ({len(pos)}) must have the same length")
    tensors, paddings = [], []
    for i, f in enumerate(features):
        if isinstance(f, NestedTensor):
            t, padding = f.tensors, f.padding
        elif isinstance(f, Tensor):
            t, padding = f, None
        else:
            raise TypeError(f"features[{i}] must be a NestedTensor or a Tensor, got {type(f).__name__}")
        if padding is None or padding.kind == "none":  # sizes from the tensor (symbolic if traced)
            padding = Padding.none(t.shape[0], t.shape[2:], t.device)
        tensors.append(t)
        paddings.append(padding)
    first = tensors[0]
    for i, (t, p) in enumerate(zip(tensors, pos)):
        if t.dim() != first.dim() or t.shape[:2] != first.shape[:2]:
            raise ValueError(
                f"features[{i}] has shape {tuple(t.shape)} but features[0] has {tuple(first.shape)}: "
                "levels need the same batch size, channels and rank (give Joiner a hidden_dim to "
                "project them)"
            )
        if not isinstance(p, Tensor) or tuple(p.shape) != tuple(t.shape):
            got = tuple(p.shape) if isinstance(p, Tensor) else type(p).__name__
            raise ValueError(f"pos[{i}] must have its level's shape {tuple(t.shape)}, got {got}")
    n_levels, channels = len(tensors), first.shape[1]
    if level_embed is not None and tuple(level_embed.shape) != (n_levels, channels):
        raise ValueError(
            f"level_embed must have shape (L, C) = {(n_levels, channels)}, got {tuple(level_embed.shape)}"
        )
    shapes = [tuple(int(s) for s in t.shape[2:]) for t in tensors]
    src = torch.cat([rearrange(t, "b c ... -> b (...) c") for t in tensors], 1)
    pos_flat = []
    for lvl, p in enumerate(pos):
        p = rearrange(p, "b c ... -> b (...) c")
        if level_embed is not None:
            p = p + level_embed[lvl].to(p.dtype).view(1, 1, -1)
        pos_flat.append(p)
    key_padding_mask = torch.cat([p.mask.flatten(1) for p in paddings], 1)
    if host_facts(src.device):  # pinned and non-blocking on CUDA: no synchronisation
        spatial_shapes = _tracing.host_tensor([list(s) for s in shapes], torch.long, src.device)
    else:
        spatial_shapes = torch.as_tensor(shapes, dtype=torch.long, device=src.device)
    level_start_index = torch.cat((spatial_shapes.new_zeros((1,)), spatial_shapes.prod(1).cumsum(0)[:-1]))
    ratio_dtype = src.dtype if src.is_floating_point() else torch.float32
    ratios = torch.stack([p.valid_ratios(ratio_dtype) for p in paddings], 1)
    return FlatLevels(
        src, torch.cat(pos_flat, 1), key_padding_mask, spatial_shapes, level_start_index, ratios, shapes
    )


def unflatten_levels(seq: Tensor, spatial_shapes_list: Sequence[Sequence[int]]) -> list[Tensor]:
    """Splits a flattened sequence back into channels-first levels (inverse of the flattening).

    Args:
        seq (Tensor[B, N, C]): e.g. the encoder's output.
        spatial_shapes_list (sequence of tuples): each level's ``S_l``
            (:attr:`FlatLevels.spatial_shapes_list`).

    Returns:
        list of Tensor[B, C, *S_l] (views where possible).

    Raises:
        ValueError: ``N`` differs from the sum of the levels' sizes.
    """
    sizes = [int(torch.Size(s).numel()) for s in spatial_shapes_list]
    if seq.dim() != 3 or seq.shape[1] != sum(sizes):
        raise ValueError(
            f"seq must have shape (B, N, C) with N = {sum(sizes)} for levels {list(spatial_shapes_list)}, "
            f"got {tuple(seq.shape)}"
        )
    out = []
    for part, shape in zip(seq.split(sizes, dim=1), spatial_shapes_list):
        out.append(part.transpose(1, 2).reshape(seq.shape[0], seq.shape[2], *shape))
    return out
