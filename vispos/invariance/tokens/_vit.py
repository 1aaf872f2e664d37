"""The global-attention vision transformers of timm on padded batches: ``VisionTransformer``
(learned absolute table, class and register tokens) and ``Eva`` (EVA-02, DINOv3, timm's RoPE
ViTs: a learned table, RoPE, or both).

Each function mirrors the model's own ``forward_intermediates`` (patch embedding, ``_pos_embed``,
``norm_pre``, the blocks) with three changes: the input's padding is filled with zeros (what
``dynamic_img_pad`` pads an item with alone), every item gets its own positions
(:func:`~vispos.invariance.tokens._tokens.item_pos_embeds`,
:func:`~vispos.invariance.tokens._tokens.item_rope_embeds`) and every block gets a boolean attention
mask that keeps each query off the padding keys. A token of an item then reads only the item's
tokens and the prefix tokens, with the item's own positions: what the model gives it alone.

References:
    timm ``models/vision_transformer.py`` and ``models/eva.py`` (``_pos_embed``,
    ``forward_intermediates``); Dosovitskiy et al., ICLR 2021; Fang et al., EVA-02, 2023; Simeoni
    et al., DINOv3, 2025.
"""

from __future__ import annotations

import inspect

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ...nested_tensor import NestedTensor
from ...padding import Padding
from ._packed import packed_levels
from ._stem import _refuse, check_stem, is_patch_projection
from ._token_batch import TokenFacts, add_item_positions, as_levels, batch_facts, canvas_tokens
from ._tokens import TokenModelRule, block_order

__all__ = ["vit_levels", "eva_levels", "check_vit", "check_eva"]


def _check_common(model: nn.Module, base: str) -> None:
    """The checks of :func:`check_vit` / :func:`check_eva`; ``base`` is the registered class's
    dotted name."""
    from timm.layers import PatchEmbed

    cls = next((c for c in type(model).__mro__ if f"{c.__module__}.{c.__qualname__}" == base), None)
    for name in ("_pos_embed", "forward_intermediates"):
        if cls is not None and getattr(type(model), name) is not getattr(cls, name):
            raise _refuse(model, f"it overrides {cls.__name__}.{name} (code the rule of {cls.__name__} does not "
                                 "mirror; register a rule for it)")
    embed = model.patch_embed
    if type(embed).forward is not PatchEmbed.forward or not isinstance(getattr(embed, "proj", None), nn.Module):
        raise _refuse(model, f"patch_embed is {type(embed).__name__}, not timm's PatchEmbed (a hybrid embedding "
                             "reads a backbone of its own; only PatchEmbed's projection is known here)")
    if not is_patch_projection(embed):
        check_stem(model)
    if not getattr(model, "dynamic_img_size", False):
        raise _refuse(model, "dynamic_img_size=False (alone, the model takes only its img_size, so no padded "
                             "batch can equal it; build it with dynamic_img_size=True, as TimmBackbone does)")
    drop = getattr(model, "patch_drop", None)
    if drop is not None and not isinstance(drop, nn.Identity):
        raise _refuse(model, "patch_drop_rate > 0 (patch dropout keeps a random number of tokens of the "
                             "whole canvas, not of the item)")
    for i, blk in enumerate(model.blocks):
        if "attn_mask" not in inspect.signature(blk.forward).parameters:
            raise _refuse(model, f"blocks.{i} ({type(blk).__name__}) takes no attention mask")


def check_vit(model: nn.Module) -> None:
    """Raises ``ValueError`` for a ``VisionTransformer`` configuration :func:`vit_levels` cannot
    make exact: a subclass with its own ``_pos_embed`` / ``forward_intermediates`` (DeiT's
    distilled ViT), a patch embedding other than timm's ``PatchEmbed`` (hybrid ViTs), a
    convolutional stem in ``PatchEmbed.proj`` that :func:`check_stem` refuses,
    ``dynamic_img_size=False``, patch dropout, a block that takes no attention mask.

    Args:
        model (nn.Module): a timm ``VisionTransformer``.

    Raises:
        ValueError: naming what cannot be made exact.
    """
    _check_common(model, "timm.models.vision_transformer.VisionTransformer")


def check_eva(model: nn.Module) -> None:
    """Raises ``ValueError`` for an ``Eva`` configuration :func:`eva_levels` cannot make exact (as
    :func:`check_vit`).

    Args:
        model (nn.Module): a timm ``Eva``.

    Raises:
        ValueError: naming what cannot be made exact.
    """
    _check_common(model, "timm.models.eva.Eva")


def _run_block(model: nn.Module, blk: nn.Module, x: Tensor, **kwargs) -> Tensor:
    if model.grad_checkpointing and torch.is_grad_enabled() and not torch.jit.is_scripting():
        return checkpoint(blk, x, use_reentrant=False, **kwargs)
    return blk(x, **kwargs)


def _blocks_to_levels(model: nn.Module, x: Tensor, facts: TokenFacts, indices: tuple[int, ...],
                      block_kwargs) -> list[NestedTensor]:
    """Runs ``model.blocks`` up to the last wanted index with the key mask of the facts
    (``block_kwargs(i)`` adds block ``i``'s own arguments) and returns the wanted levels in block
    order, each once (as timm's ``forward_intermediates``): prefix tokens dropped, the grid
    ``(B, C, gh, gw)``, zeros on the padding cells (no gradient reaches a parameter through them)."""
    npt = model.num_prefix_tokens
    wanted, maps = block_order(indices), []
    gh, gw = facts.token_padding.spatial
    for i, blk in enumerate(model.blocks[: wanted[-1] + 1]):
        x = _run_block(model, blk, x, attn_mask=facts.keep, **block_kwargs(i))
        if i in wanted:
            grid = x[:, npt:].reshape(x.shape[0], gh, gw, x.shape[-1]).permute(0, 3, 1, 2)
            if facts.token_mask is not None:
                grid = grid.masked_fill(facts.token_mask[:, None], 0)
            maps.append(grid.contiguous())
    return as_levels(maps, facts.token_padding)


def vit_levels(model: nn.Module, x: Tensor, padding: Padding, indices: tuple[int, ...]) -> list[NestedTensor]:
    """timm ``VisionTransformer.forward_intermediates(x, indices, output_fmt="NCHW",
    intermediates_only=True)`` on a padded batch, each item as alone (see the module docstring).
    Under ``torch.compile`` the per-item facts (grids, tables, masks) are built outside the graph,
    so one graph serves every mix of item grids on a canvas (a convolutional stem excepted).

    Args:
        model (nn.Module): a timm ``VisionTransformer`` built with ``dynamic_img_size=True``.
        x (Tensor[B, C, H, W]): the padded batch, items at the origin.
        padding (Padding): ``x``'s padding (``"none"`` or ``"rectangular"``).
        indices (tuple of int): block indices to return, non-negative.

    Returns:
        list of NestedTensor ``(B, embed_dim, gh, gw)``, one per distinct index in block order (as
        timm's ``forward_intermediates``): each item's tokens on its own grid
        (``PatchEmbed.dynamic_feat_size`` of its size), zeros on the padding.

    Raises:
        ValueError: an item smaller than one patch.
    """
    facts = batch_facts(model, x, padding, rope=False)
    x = add_item_positions(model, canvas_tokens(model, x, padding, facts), facts.pos)
    if model.pos_embed is not None:
        x = model.pos_drop(x)
    return _blocks_to_levels(model, model.norm_pre(model.patch_drop(x)), facts, indices, lambda i: {})


def eva_levels(model: nn.Module, x: Tensor, padding: Padding, indices: tuple[int, ...]) -> list[NestedTensor]:
    """timm ``Eva.forward_intermediates(x, indices, output_fmt="NCHW", intermediates_only=True)``
    on a padded batch, each item as alone: its own learned table and its own RoPE table
    (coordinates normalised by its own grid; in training, the coordinate augmentation drawn once
    per item in batch order, see :func:`~vispos.invariance.tokens._tokens.item_rope_embeds`). Under
    ``torch.compile`` one graph serves every mix of item grids on a canvas, as :func:`vit_levels`.

    Args:
        model (nn.Module): a timm ``Eva`` built with ``dynamic_img_size=True``.
        x (Tensor[B, C, H, W]): the padded batch, items at the origin.
        padding (Padding): ``x``'s padding (``"none"`` or ``"rectangular"``).
        indices (tuple of int): block indices to return, non-negative.

    Returns:
        list of NestedTensor ``(B, embed_dim, gh, gw)``, one per distinct index in block order (as
        timm's ``forward_intermediates``), zeros on the padding.

    Raises:
        ValueError: an item smaller than one patch.
    """
    facts = batch_facts(model, x, padding, rope=True)
    x = model.pos_drop(add_item_positions(model, canvas_tokens(model, x, padding, facts), facts.pos))
    rope, mixed = facts.rope, getattr(model, "rope_mixed", False)
    return _blocks_to_levels(model, model.norm_pre(x), facts, indices,
                             lambda i: {"rope": rope[i] if mixed and rope is not None else rope})


#: the token-model rules of this module, by class (registered by :mod:`vispos.invariance.rules._builtin`)
TOKEN_RULES = (
    ("timm.models.vision_transformer.VisionTransformer", TokenModelRule(vit_levels, check_vit, packed=packed_levels)),
    ("timm.models.eva.Eva", TokenModelRule(eva_levels, check_eva, packed=packed_levels)),
)
