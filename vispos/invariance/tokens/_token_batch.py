"""A padded batch of a token model (timm's ViT / Eva) as its items: each item's grid, its position
and rotary tables placed on the canvas, the masks, and the canvas's patch tokens; shared by the
padded invariant run (:mod:`~vispos.invariance.tokens._vit`) and the packed run
(:mod:`~vispos.invariance.tokens._packed`).

Under ``torch.compile`` the facts are built outside the graph (:func:`batch_facts`), which then
reads only tensors: a new mix of item grids on the same canvas is new data for one graph.

References:
    timm ``models/vision_transformer.py`` and ``models/eva.py`` (``_pos_embed``,
    ``dynamic_img_size``); Dosovitskiy et al., ICLR 2021 (resampled position tables).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from ... import _tracing
from ...nested_tensor import NestedTensor
from ...padding import Padding
from ._stem import is_patch_projection, stem_tokens
from ._tokens import item_grids, item_pos_embeds, item_rope_embeds, key_padding_keep, on_canvas

__all__ = ["TokenFacts", "token_facts", "batch_facts", "canvas_tokens", "prefix_tokens", "add_item_positions", "as_levels"]


class TokenFacts(NamedTuple):
    """What a padded batch's items are, for the token graph: each item's grid, the token padding of
    the levels, and the tensors the graph reads (the pixel and token masks, the key mask, each
    item's position table and rotary table placed on the canvas). Built on the host side of the
    graph (:func:`token_facts`)."""

    grids: list[tuple[int, int]]
    token_padding: Padding
    pixel_mask: Tensor | None  # Tensor[B, H, W] bool, True = padding (None: no padding)
    token_mask: Tensor | None  # Tensor[B, gh, gw] bool
    keep: Tensor | None  # Tensor[B, 1, 1, P + gh * gw] bool, True = attend
    pos: Tensor | None  # Tensor[B, N, C]: the table to add (N with or without the prefix tokens)
    rope: Tensor | None  # Tensor[B, 1, gh * gw, D], or [depth, B, heads, gh * gw, D] (mixed)


def token_facts(model: nn.Module, x: Tensor, padding: Padding, rope: bool) -> TokenFacts:
    """The per-item facts of a batch (:class:`TokenFacts`): grids from the boxes on the host, each
    item's position table resampled to its grid and placed on the canvas (differentiable: the
    model's ``pos_embed`` gets its gradient through it), its rotary table with ``rope``."""
    grids = item_grids(model.patch_embed, padding)
    canvas = tuple(int(g) for g in model.patch_embed.dynamic_feat_size(tuple(x.shape[2:])))
    batch, npt = x.shape[0], model.num_prefix_tokens
    if padding.kind == "none":
        token_padding = Padding.none(batch, canvas, x.device)
        pixel_mask = token_mask = keep = None
    else:
        token_padding = Padding.from_sizes(grids, canvas, device=x.device)
        pixel_mask, token_mask = padding.mask, token_padding.mask
        keep = key_padding_keep(token_padding, npt)
    pos = None
    if model.pos_embed is not None:
        skip = 0 if model.no_embed_class else npt
        tables = item_pos_embeds(model, grids)  # one object per distinct grid
        views = {id(t): t[0, skip:] for t in tables}
        pos = on_canvas([views[id(t)] for t in tables], grids, canvas)
        if skip:
            pos = torch.cat([tables[0][:, :skip].expand(batch, -1, -1), pos], dim=1)
    rotary = None
    if rope and model.rope is not None:
        rotary = on_canvas(item_rope_embeds(model.rope, grids), grids, canvas)
        # (B, N, D) -> (B, 1, N, D) broadcast over heads; mixed (B, depth, heads, N, D) -> (depth, B, heads, N, D)
        rotary = rotary.transpose(0, 1) if getattr(model, "rope_mixed", False) else rotary[:, None]
    return TokenFacts(grids, token_padding, pixel_mask, token_mask, keep, pos, rotary)


_facts_outside_graph = _tracing.outside_graph(token_facts)


def batch_facts(model: nn.Module, x: Tensor, padding: Padding, rope: bool) -> TokenFacts:
    """:func:`token_facts`; under ``torch.compile`` run outside the graph, which then reads only tensors:
    a new mix of item grids on the same canvas is new data for one graph, not a recompile."""
    if _tracing.compiling() and is_patch_projection(model.patch_embed):
        return _facts_outside_graph(model, x, padding, rope)
    return token_facts(model, x, padding, rope)


def canvas_tokens(model: nn.Module, x: Tensor, padding: Padding, facts: TokenFacts) -> Tensor:
    """Patch tokens ``(B, gh, gw, C)`` of the zero-filled canvas (what ``dynamic_img_pad`` pads an
    item with alone)."""
    if facts.pixel_mask is not None:
        x = x.masked_fill(facts.pixel_mask[:, None], 0)
    if is_patch_projection(model.patch_embed):
        return model.patch_embed(x)
    return stem_tokens(model.patch_embed, x, padding, facts.grids)


def prefix_tokens(model: nn.Module, batch: int) -> list[Tensor]:
    to_cat = []
    if model.cls_token is not None:
        to_cat.append(model.cls_token.expand(batch, -1, -1))
    if model.reg_token is not None:
        to_cat.append(model.reg_token.expand(batch, -1, -1))
    return to_cat


def add_item_positions(model: nn.Module, tokens: Tensor, pos: Tensor | None) -> Tensor:
    """``_pos_embed`` of timm's ViT / Eva with each item's table ``pos`` (:func:`token_facts`):
    ``Tensor[B, P + gh * gw, C]`` (before ``pos_drop``)."""
    batch, dim = tokens.shape[0], tokens.shape[-1]
    x = tokens.reshape(batch, -1, dim)
    to_cat = prefix_tokens(model, batch)
    if pos is None:
        return torch.cat(to_cat + [x], dim=1)
    if model.no_embed_class:
        x = x + pos
        return torch.cat(to_cat + [x], dim=1) if to_cat else x
    if to_cat:
        x = torch.cat(to_cat + [x], dim=1)
    return x + pos


@_tracing.outside_graph
def as_levels(maps: list[Tensor], token_padding: Padding) -> list[NestedTensor]:
    """The levels' maps ``Tensor[B, C, gh, gw]`` with their padding (outside a compiled graph: a
    padding is a host value)."""
    return [NestedTensor(grid, token_padding) for grid in maps]
