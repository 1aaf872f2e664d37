"""Packed (padding-free) runs of timm's ViT and EVA token models: every item's tokens in one sequence.

A padded batch spends its compute on the canvas; a packed run spends it on the items' own tokens
only. Each item is embedded alone, by the model's own modules: its patch embedding, and its
``_pos_embed`` (the learned table resampled to the item's grid, the RoPE table of the item's grid,
the class and register tokens per item); a caller's vispos position embedding (sine, random
Fourier, ...) is computed on the item's token grid too. The tokens of all items are concatenated
into one sequence ``(1, N_1 + ... + N_B, C)`` and every block runs on it: the token-wise layers
(norms, MLP, layer scale) on all tokens at once, attention block-diagonally, as one call of the
block's own attention module per item (timm's code: QK norm, RoPE, gates, fused SDPA), stochastic
depth drawn per item. The requested blocks come back as the padded mode's levels (see
:class:`~vispos.invariance.TokenModelRule`): ``NestedTensor`` ``(B, C, gh, gw)``, each item's grid
at the origin, zeros and mask True elsewhere.

The block-diagonal attention was chosen by measurement (``benchmarks/bench_packed.py
--attention``, ``benchmarks/results_packed.md``): on CPU the per-item call is exact and the fastest
of SDPA with a block-diagonal boolean mask, FlexAttention with a document mask (eager and compiled;
it has no backward on CPU) and nested jagged tensors.

References:
    Dehghani et al., Patch n' Pack: NaViT, a Vision Transformer for any Aspect Ratio and
    Resolution, NeurIPS 2023 (sequence packing, per-image attention); Wightman, timm
    ``models/vision_transformer.py`` and ``models/eva.py`` (``_pos_embed``,
    ``forward_intermediates``), ``models/naflexvit.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ..batching import nested_tensor_from_tensor_list
from ..nested_tensor import NestedTensor
from ..padding import Padding
from ._stem import is_patch_projection, stem_tokens
from ._tokens import TokenModelRule, block_order, item_grids, refuse_inline_hooks
from .rules import rule_for

__all__ = ["PackedRunner", "check_packed", "packed_levels"]


def _block_family(block: nn.Module) -> str | None:
    from timm.models.eva import EvaBlock
    from timm.models.vision_transformer import Block

    return {Block: "vit", EvaBlock: "eva"}.get(type(block))


def check_packed(model: nn.Module) -> None:
    """Raises ``ValueError`` for a timm ``VisionTransformer`` / ``Eva`` that :func:`packed_levels`
    cannot run: a block other than the standard pre-norm ``Block`` / ``EvaBlock`` (named), a
    stochastic depth other than timm's ``DropPath``, patch dropout, ``dynamic_img_size=False``.

    Args:
        model (nn.Module): the timm model.

    Raises:
        ValueError: as above.
    """
    name = type(model).__name__
    if not getattr(model, "dynamic_img_size", False):
        raise ValueError(f"packed=True: this {name} was built with dynamic_img_size=False, so it cannot embed "
                         "each item at its own grid (TimmBackbone builds vision transformers with it)")
    drop = getattr(model, "patch_drop", None)
    if drop is not None and not isinstance(drop, nn.Identity):
        raise ValueError(f"packed=True: this {name} drops patches ({type(drop).__name__}); feature maps need "
                         "every token, build it with patch_drop_rate=0")
    for index, block in enumerate(model.blocks):
        if _block_family(block) is None:
            raise ValueError(
                f"packed=True: blocks.{index} of this {name} is a {type(block).__name__}; a packed run knows "
                "timm's pre-norm Block and EvaBlock (attention per item, every other layer per token)"
            )
        for path in ("drop_path1", "drop_path2"):
            module = getattr(block, path)
            if not isinstance(module, nn.Identity) and type(module).__name__ != "DropPath":
                raise ValueError(f"packed=True: blocks.{index}.{path} of this {name} is a {type(module).__name__}")


def packed_inline(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The modules :func:`packed_levels` runs the code of without calling them: each block (its
    attention runs per item) and its stochastic depth (drawn per item)."""
    found = []
    for i, blk in enumerate(model.blocks):
        found += [(f"blocks.{i}", blk), (f"blocks.{i}.drop_path1", blk.drop_path1),
                  (f"blocks.{i}.drop_path2", blk.drop_path2)]
    return found


def _drop_path(module: nn.Module, y: Tensor, lengths: list[int]) -> Tensor:
    """timm's ``DropPath`` over a packed sequence ``(1, N, C)``, drawn once per item as alone."""
    p = float(getattr(module, "drop_prob", 0.0))
    if isinstance(module, nn.Identity) or not module.training or p == 0.0:
        return y
    keep = y.new_empty((len(lengths), 1)).bernoulli_(1.0 - p)
    if getattr(module, "scale_by_keep", True):
        keep = keep / (1.0 - p)
    counts = torch.tensor(lengths, device=y.device)
    return y * keep.repeat_interleave(counts, dim=0, output_size=sum(lengths))[None]


def _attention(block: nn.Module, y: Tensor, lengths: list[int], ropes: list[Any] | None) -> Tensor:
    """Block-diagonal attention: the block's own attention module on each item's tokens."""
    parts = torch.split(y, lengths, dim=1)
    if ropes is None:
        return torch.cat([block.attn(part) for part in parts], dim=1)
    return torch.cat([block.attn(part, rope=rope) for part, rope in zip(parts, ropes)], dim=1)


def _block(block: nn.Module, x: Tensor, lengths: list[int], ropes: list[Any] | None) -> Tensor:
    """timm ``Block.forward`` / ``EvaBlock.forward`` on a packed sequence ``(1, N, C)``."""
    y = _attention(block, block.norm1(x), lengths, ropes)
    y = block.ls1(y) if hasattr(block, "ls1") else (y if block.gamma_1 is None else block.gamma_1 * y)
    x = x + _drop_path(block.drop_path1, y, lengths)
    y = block.mlp(block.norm2(x))
    y = block.ls2(y) if hasattr(block, "ls2") else (y if block.gamma_2 is None else block.gamma_2 * y)
    return x + _drop_path(block.drop_path2, y, lengths)


def _embed(model: nn.Module, patches: Tensor, position_embedding: nn.Module | None) -> tuple[Tensor, Any]:
    """One item's tokens ``(1, P + h * w, C)`` from its patch tokens ``(1, h, w, C)`` as the model
    embeds it alone (``_pos_embed``, ``patch_drop``, ``norm_pre``), and its rotary table (EVA;
    else None)."""
    tokens = patches
    if position_embedding is not None:
        mask = torch.zeros(tokens.shape[:3], dtype=torch.bool, device=tokens.device)
        tokens = tokens + position_embedding(mask).permute(0, 2, 3, 1).to(tokens.dtype)
    out = model._pos_embed(tokens)
    tokens, rope = out if isinstance(out, tuple) else (model.patch_drop(out), None)
    return model.norm_pre(tokens), rope


def _patch_tokens(model: nn.Module, x: Tensor | Sequence[Tensor], padding: Padding, sizes, grids) -> list[Tensor]:
    """Each item's patch tokens ``(1, h, w, C)``: the item alone through ``patch_embed`` (one
    patch-sized convolution per token), or, for a convolutional stem, the padded batch through
    the rule book's stem, as the padded mode runs it (zeros outside each item, statistics over
    every item's valid cells: a batch norm's are the batch's), cut to each item's grid."""
    if is_patch_projection(model.patch_embed):
        return [model.patch_embed(x[b][:, : s[0], : s[1]][None]) for b, s in enumerate(sizes)]

    if isinstance(x, Tensor):
        canvas = x if padding.kind == "none" else x.masked_fill(padding.mask[:, None], 0)
    else:  # the list on the largest size (what _inputs took as the padding's canvas), zeros around each item
        canvas = nested_tensor_from_tensor_list(x).tensors
    tokens = stem_tokens(model.patch_embed, canvas, padding, grids)  # (B, gh, gw, C)
    return [tokens[b : b + 1, : g[0], : g[1]].contiguous() for b, g in enumerate(grids)]


def packed_levels(
    model: nn.Module,
    x: Tensor | Sequence[Tensor],
    padding: Padding,
    indices: tuple[int, ...],
    position_embedding: nn.Module | None = None,
) -> list[NestedTensor]:
    """timm ``forward_intermediates(x, indices, output_fmt="NCHW", intermediates_only=True)`` of a
    ``VisionTransformer`` / ``Eva`` on packed tokens: the levels of the padded invariant mode,
    computed without padding tokens (see the module docstring).

    Args:
        model (nn.Module): timm ``VisionTransformer`` or ``Eva``, ``dynamic_img_size=True``.
        x (Tensor[B, C, H, W] | sequence of B Tensor[C, H_b, W_b]): a padded batch with items at
            the origin, or the items themselves.
        padding (Padding): the items' boxes (``"none"`` or ``"rectangular"`` at the origin; for a
            list, ``Padding.from_sizes`` of the items' sizes on the largest canvas).
        indices (tuple of int): block indices to return, non-negative; the levels come back in
            block order, each index once (as timm's ``forward_intermediates``).
        position_embedding (nn.Module, optional): a vispos spatial embedding (e.g.
            :class:`~vispos.PositionEmbeddingSine`, :class:`~vispos.PositionEmbeddingRandom`)
            called on each item's token grid as an all-valid bool mask ``Tensor[1, h, w]``; its
            output ``Tensor[1, C, h, w]`` is added to the item's patch tokens before the model's own
            position step. Default None.

    Returns:
        list of NestedTensor ``(B, embed_dim, gh, gw)`` in the model's dtype: ``(gh, gw)`` the token
        grid of the canvas, each item's tokens on its own grid at the origin, zeros on the padding
        (``Padding.none`` for a batch without padding).

    Raises:
        ValueError: an item smaller than one patch, or (without ``dynamic_img_pad``) not a multiple
            of it.

    References:
        Dehghani et al., NaViT, NeurIPS 2023; timm ``forward_intermediates``.
    """
    grids = item_grids(model.patch_embed, padding)
    sizes = [tuple(padding.spatial)] * padding.batch if padding.kind == "none" else list(padding.sizes)
    patches = _patch_tokens(model, x, padding, sizes, grids)
    embedded = [_embed(model, p, position_embedding) for p in patches]
    lengths = [int(t.shape[1]) for t, _ in embedded]
    tokens = torch.cat([t for t, _ in embedded], dim=1)
    ropes = [rope for _, rope in embedded]
    mixed = getattr(model, "rope_mixed", False)
    wanted, out = block_order(indices), {}
    for depth, block in enumerate(model.blocks[: wanted[-1] + 1]):
        item_ropes = None if ropes[0] is None else ([r[depth] for r in ropes] if mixed else ropes)
        if model.grad_checkpointing and torch.is_grad_enabled():  # as timm and the padded rule do
            tokens = checkpoint(_block, block, tokens, lengths, item_ropes, use_reentrant=False)
        else:
            tokens = _block(block, tokens, lengths, item_ropes)
        if depth in wanted:
            out[depth] = tokens
    canvas = tuple(int(g) for g in model.patch_embed.dynamic_feat_size(tuple(padding.spatial)))
    if padding.kind == "none":
        level_padding = Padding.none(padding.batch, canvas, tokens.device)
    else:
        level_padding = Padding.from_sizes(grids, canvas, device=tokens.device)
    return [_unpack(out[i], lengths, grids, model.num_prefix_tokens, level_padding) for i in wanted]


def _unpack(tokens: Tensor, lengths: list[int], grids: list[tuple[int, int]], prefix: int,
            padding: Padding) -> NestedTensor:
    """A packed block output ``(1, N, C)`` as a level ``(B, C, gh, gw)``: each item's patch tokens
    (prefix tokens dropped) on its grid at the origin, zeros elsewhere."""
    gh, gw = padding.spatial
    maps = []
    for part, (h, w) in zip(torch.split(tokens, lengths, dim=1), grids):
        grid = part[0, prefix:].reshape(h, w, -1).permute(2, 0, 1)
        maps.append(F.pad(grid, (0, gw - w, 0, gh - h)))
    return NestedTensor(torch.stack(maps), padding)


class PackedRunner:
    """Runs a token model's packed rule on a :class:`~vispos.NestedTensor` or a list of images
    (the backbones' ``packed=True``).

    Args:
        rule (TokenModelRule): the model's rule; its ``packed`` is called.
        indices (sequence of int): the block indices to return, non-negative (levels in block
            order, each once).
        unwrap (callable): ``unwrap(body) -> nn.Module``, the timm model inside the backbone's body.

    Shape:
        - input: NestedTensor ``(B, C, H, W)``, items at the origin (or no padding), or a list of
          ``B`` tensors ``(C, H_b, W_b)`` (the canvas is then the largest size along each axis).
        - output: list of NestedTensor ``(B, C_l, gh, gw)``, as the padded invariant mode.

    Raises:
        TypeError: the input is neither a NestedTensor nor a list of tensors.
        ValueError: an arbitrary (non-box) mask or a box not at the origin; an empty list; items
            that are not ``(in_chans, H, W)`` of one dtype and device; as the rule.

    References:
        Dehghani et al., NaViT, NeurIPS 2023.
    """

    def __init__(self, rule: TokenModelRule, indices: Sequence[int], unwrap: Callable[[nn.Module], nn.Module]) -> None:
        self.rule, self.indices, self.unwrap = rule, block_order(indices), unwrap

    @classmethod
    def for_model(cls, model: nn.Module | None, name: str, indices: Sequence[int],
                  unwrap: Callable[[nn.Module], nn.Module]) -> "PackedRunner":
        """The runner of ``model`` (the timm model inside a backbone), or a refusal naming it.

        Raises:
            ValueError: ``model`` has no token-model rule with a packed run, or a configuration that
                rule or :func:`check_packed` cannot run exactly.
        """
        rule = None if model is None else rule_for(model)
        if not isinstance(rule, TokenModelRule) or rule.packed is None:
            kind = "a CNN or hooked features" if model is None else type(model).__name__
            raise ValueError(
                f"packed=True runs timm's VisionTransformer and Eva families (ViT, DeiT, DINOv2/v3, EVA-02, "
                f"RoPE ViTs); {name!r} ({kind}) has no packed run: use the stock padded mode, or padding_invariant=True "
                "where vispos has a rule for it"
            )
        if rule.check is not None:
            try:
                rule.check(model)
            except ValueError as exc:  # the padded rule's refusal holds for the packed run too
                raise ValueError(f"packed=True: {name!r} is refused by its rule: {exc}") from exc
        check_packed(model)
        return cls(rule, indices, unwrap)

    def __call__(self, body: nn.Module, x: Any) -> list[NestedTensor]:
        model = self.unwrap(body)
        refuse_inline_hooks(packed_inline(model), "packed=True")
        items, padding = _inputs(x)
        in_chans = next((int(m.in_channels) for m in model.patch_embed.proj.modules() if isinstance(m, nn.Conv2d)),
                        None)
        first = items[0] if isinstance(items, list) else items
        if in_chans is not None and first.shape[-3] != in_chans:
            raise ValueError(f"x must have {in_chans} channels (C, H, W), got shape {tuple(first.shape)}")
        return self.rule.packed(model, items, padding, self.indices)


def _inputs(x: Any) -> tuple[Tensor | list[Tensor], Padding]:
    """A batch's items (a padded tensor or a list) and their padding."""
    if isinstance(x, NestedTensor):
        padding = x.padding
        if padding.kind == "arbitrary":
            raise ValueError(
                "packed=True needs each item's box (a rectangular padding), got an arbitrary mask; build the "
                "batch with vispos.nested_tensor_from_tensor_list / PaddedCollate, or Padding.from_sizes"
            )
        if not padding.at_origin:
            raise ValueError(f"packed=True needs every item at the origin (DETR's layout), got item starts "
                             f"{padding.starts}")
        return x.tensors, padding
    if not isinstance(x, (list, tuple)):
        raise TypeError(f"x must be a NestedTensor (B, C, H, W) or a list of (C, H, W) tensors, got "
                        f"{type(x).__name__}")
    if len(x) == 0:
        raise ValueError("x must hold at least one (C, H, W) tensor, got an empty sequence")
    for i, item in enumerate(x):
        if not isinstance(item, Tensor):
            raise TypeError(f"x[{i}] must be a Tensor (C, H, W), got {type(item).__name__}")
        if item.dim() != 3 or item.shape[0] != x[0].shape[0] or item.device != x[0].device or item.dtype != x[0].dtype:
            raise ValueError(f"x[{i}] must be a Tensor (C, H, W) of x[0]'s channels, dtype and device, got "
                             f"{tuple(item.shape)} {item.dtype} on {item.device} (x[0]: {tuple(x[0].shape)} "
                             f"{x[0].dtype} on {x[0].device})")
    sizes = [tuple(int(s) for s in item.shape[1:]) for item in x]
    canvas = tuple(max(s[a] for s in sizes) for a in range(2))
    return list(x), Padding.from_sizes(sizes, canvas, device=x[0].device)
