"""Windowed attention on a padded batch: timm's SAM / ViTDet vision transformer
(``VisionTransformerSAM``) run so that every item gets, on its own tokens, what it gets alone.

Each item sits at the canvas origin, so the windows of the canvas are aligned at every item's
origin, as they are alone. What the stock model would read from the canvas is made the item's:

* the absolute position table is resampled to the item's own token grid (timm's
  ``resample_abs_pos_embed_nhwc``, the call timm makes alone), zeros on the padding;
* in a windowed block, keys outside the item are masked in windows that straddle its edge;
  the decomposed relative position terms of a window do not depend on the canvas;
* in a global block, keys outside the item are masked, and the relative position tables are
  resampled to the item's own grid (``get_rel_pos(h, h, rel_pos_h)``, as alone) before the
  decomposed terms are formed;
* a convolution of the neck (3x3) sees zeros outside the item.

The reference is this model on the item alone: its keys are masked in the windows that pass the
item's edge too. The stock model alone pads those windows with zero tokens and attends to them
(``window_partition`` pads after ``norm1``: each zero token's key is the ``qkv`` bias), so the
two differ on the tokens of edge windows of an item whose grid is not a multiple of the window
(docs/padding-invariance.md measures it); for an item whose token grid is a whole number of
windows they are the same model.

References:
    Li et al., Exploring Plain Vision Transformer Backbones for Object Detection (ViTDet), ECCV
    2022; Kirillov et al., Segment Anything, ICCV 2023; Li et al., MViTv2 (decomposed relative
    positions), CVPR 2022; timm ``models/vision_transformer_sam.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...nested_tensor import NestedTensor
from ...padding import Padding
from ._tokens import TokenModelRule, item_grids, on_canvas

__all__ = ["window_key_valid", "masked_window_attention", "item_rel_pos_bias", "sam_forward_intermediates",
           "sam_levels", "check_sam"]


def _sam():
    import timm.models.vision_transformer_sam as sam

    return sam


def window_key_valid(valid: Tensor, window: int) -> Tensor:
    """Which token of each window lies inside its item, windows in timm's ``window_partition``
    order (the canvas padded to whole windows at the bottom / right, those tokens outside).

    Args:
        valid (Tensor[B, H, W], bool): True inside each item (a box at the canvas origin).
        window (int): the window's side, in tokens.

    Returns:
        Tensor[B * nW, window * window], bool: True = a key inside its item.
    """
    windows, _ = _sam().window_partition(valid[..., None].to(torch.uint8), window)
    return windows.reshape(windows.shape[0], -1).bool()


def _key_bias(valid: Tensor, heads: int, dtype: torch.dtype) -> Tensor:
    """``-inf`` on keys outside the item, ``[B * heads, 1, N]``; a window with no valid key (pure
    padding, its output is never read) keeps every key, so that its softmax stays finite."""
    keep = valid | ~valid.any(-1, keepdim=True)
    bias = torch.zeros(keep.shape, dtype=dtype, device=valid.device).masked_fill(~keep, float("-inf"))
    return bias.repeat_interleave(heads, dim=0)[:, None, :]


def item_rel_pos_bias(q: Tensor, rel_pos_h: Tensor, rel_pos_w: Tensor, sizes: Sequence[Sequence[int]],
                      canvas: Sequence[int], heads: int) -> Tensor:
    """Decomposed relative position terms of a global block, each item's tables resampled to its
    own grid as timm does alone (``get_rel_pos(h, h, rel_pos_h)``), zeros outside the item.

    Args:
        q (Tensor[B * heads, H * W, d]): the queries, item-major.
        rel_pos_h (Tensor[Lh, d]), rel_pos_w (Tensor[Lw, d]): the block's tables.
        sizes (sequence of (h, w)): each item's token grid. canvas ((H, W)): the canvas'.
        heads (int): attention heads.

    Returns:
        Tensor[B * heads, H * W, H * W]: the bias, in ``q``'s dtype.

    References:
        Li et al., MViTv2, CVPR 2022 (decomposed relative positions); timm
        ``get_decomposed_rel_pos_bias``.
    """
    get_rel_pos = _sam().get_rel_pos
    height, width = canvas
    done_h: dict[int, Tensor] = {}
    done_w: dict[int, Tensor] = {}
    for h, w in sizes:  # once per distinct size, zeros outside the item's own rows / columns
        if h not in done_h:
            done_h[h] = F.pad(get_rel_pos(h, h, rel_pos_h), (0, 0, 0, height - h, 0, height - h))
        if w not in done_w:
            done_w[w] = F.pad(get_rel_pos(w, w, rel_pos_w), (0, 0, 0, width - w, 0, width - w))
    tables_h = [done_h[h] for h, _ in sizes]
    tables_w = [done_w[w] for _, w in sizes]
    rh = torch.stack(tables_h).repeat_interleave(heads, dim=0).to(q.dtype)
    rw = torch.stack(tables_w).repeat_interleave(heads, dim=0).to(q.dtype)
    r_q = q.reshape(q.shape[0], height, width, q.shape[-1])
    rel_h = torch.einsum("bhwc,bhkc->bhwk", r_q, rh)
    rel_w = torch.einsum("bhwc,bwkc->bhwk", r_q, rw)
    return (rel_h[:, :, :, :, None] + rel_w[:, :, :, None, :]).reshape(q.shape[0], height * width, height * width)


def masked_window_attention(attn: nn.Module, x: Tensor, key_valid: Tensor, rel_bias=None) -> Tensor:
    """timm SAM ``Attention`` with keys outside the item masked.

    Args:
        attn (nn.Module): a timm ``vision_transformer_sam.Attention`` (qkv, q/k norms, dropout,
            proj; no RoPE).
        x (Tensor[N_w, h, w, C]): windows (or whole maps), channels last.
        key_valid (Tensor[N_w, h * w], bool): True = a key inside its item.
        rel_bias (callable, optional): ``rel_bias(q) -> Tensor[N_w * heads, h * w, h * w]``; default
            timm's decomposed terms of a ``(h, w)`` window when the block uses relative positions.

    Returns:
        Tensor[N_w, h, w, C].

    References:
        Vaswani et al., Attention Is All You Need, NeurIPS 2017; timm
        ``models/vision_transformer_sam.py`` (``Attention``).
    """
    sam = _sam()
    n_w, height, width, _ = x.shape
    n = height * width
    heads = attn.num_heads
    x = x.reshape(n_w, n, -1)
    qkv = attn.qkv(x).view(n_w, n, 3, heads, -1).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.reshape(3, n_w * heads, n, -1).unbind(0)
    q, k = attn.q_norm(q), attn.k_norm(k)
    bias = _key_bias(key_valid, heads, q.dtype)
    if attn.use_rel_pos:
        terms = rel_bias(q) if rel_bias is not None else sam.get_decomposed_rel_pos_bias(
            q, attn.rel_pos_h, attn.rel_pos_w, (height, width), (height, width))
        bias = bias + terms
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias,
                                         dropout_p=attn.attn_drop.p if attn.training else 0.0)
    out = out.view(n_w, heads, n, -1).transpose(1, 2).reshape(n_w, n, -1)
    out = attn.proj_drop(attn.proj(out))
    return out.view(n_w, height, width, -1)


def _block(blk: nn.Module, x: Tensor, valid: Tensor, sizes: Sequence[Sequence[int]]) -> Tensor:
    """One timm SAM ``Block`` (windowed or global) on a padded batch ``[B, H, W, C]``; ``valid``
    ``[B, H, W]`` marks each item's tokens, ``sizes`` its grid."""
    sam = _sam()
    batch, height, width, _ = x.shape
    shortcut = x
    x = blk.norm1(x)
    attn = blk.attn
    if blk.window_size > 0:
        ws = blk.window_size
        windows, pad_hw = sam.window_partition(x, ws)
        keys = window_key_valid(valid, ws)
        x = blk.drop_path1(blk.ls1(masked_window_attention(attn, windows, keys)))
        x = sam.window_unpartition(x, ws, (height, width), pad_hw)
    else:

        def rel_bias(q):
            return item_rel_pos_bias(q, attn.rel_pos_h, attn.rel_pos_w, sizes, (height, width), attn.num_heads)

        x = blk.drop_path1(blk.ls1(masked_window_attention(attn, x, valid.reshape(batch, -1), rel_bias)))
    x = shortcut + x
    x = x.reshape(batch, height * width, -1)
    x = x + blk.drop_path2(blk.ls2(blk.mlp(blk.norm2(x))))
    return x.reshape(batch, height, width, -1)


def check_sam(model: nn.Module) -> None:
    """Raises vispos' ``ValueError`` naming the part of a ``VisionTransformerSAM`` that has no exact
    per-item form (RoPE tables built for the model's grid, token dropout, a block or attention
    with its own ``forward``, a neck layer other than a convolution or a channel norm)."""
    sam = _sam()
    from timm.layers import LayerNorm2d, PatchEmbed

    def refuse(part: str, why: str) -> ValueError:
        return ValueError(f"padding_invariant=True cannot run {type(model).__name__}.{part} exactly on a padded "
                          f"batch: {why}")

    if type(model).forward_intermediates is not sam.VisionTransformerSAM.forward_intermediates:
        raise refuse("forward_intermediates", f"{type(model).__name__} has its own, which vispos cannot run per item")
    if model.rope_global is not None or model.rope_window is not None:
        raise refuse("rope_global / rope_window", "use_rope=True builds RotaryEmbeddingCat tables for the "
                                                  "model's fixed grid, not for each item's")
    if not isinstance(model.patch_drop, nn.Identity):
        raise refuse("patch_drop", "patch_drop_rate > 0 (patch dropout keeps a random number of tokens of the "
                                   "whole canvas, not of the item)")
    if type(model.patch_embed).forward is not PatchEmbed.forward or model.patch_embed.output_fmt.value != "NHWC":
        raise refuse("patch_embed", f"{type(model.patch_embed).__name__} is not timm's channels-last PatchEmbed")
    for i, blk in enumerate(model.blocks):
        if type(blk).forward is not sam.Block.forward or type(blk.attn).forward is not sam.Attention.forward:
            raise refuse(f"blocks.{i}", f"{type(blk).__name__} has a forward of its own, which vispos cannot run "
                                        "per item")
    for i, layer in enumerate(model.neck if isinstance(model.neck, nn.Sequential) else [model.neck]):
        conv = type(layer) is nn.Conv2d and layer.padding_mode == "zeros" and layer.stride == (1, 1) and \
            layer.dilation == (1, 1) and all(2 * p == k - 1 for p, k in zip(layer.padding, layer.kernel_size))
        if not (conv or type(layer) in (LayerNorm2d, nn.Identity)):
            raise refuse(f"neck.{i}", f"{type(layer).__name__} is neither a 'same' convolution nor a layer norm "
                                      "over channels")


def sam_forward_intermediates(model: nn.Module, x: Tensor, padding: Padding, indices: Sequence[int],
                              norm: bool = False) -> tuple[list[Tensor], Padding]:
    """timm's ``VisionTransformerSAM.forward_intermediates`` on a padded batch, each item exact.

    Args:
        model (nn.Module): a ``VisionTransformerSAM`` (checked by :func:`check_sam`).
        x (Tensor[B, C, H, W]): the padded images, each item at the origin.
        padding (Padding): ``x``'s, ``"none"`` (every item fills the canvas: the item alone) or
            ``"rectangular"`` at the origin.
        indices (sequence of int): the blocks whose outputs are returned.
        norm (bool): apply the model's neck to each returned map (timm's ``norm=True``).

    Returns:
        (list of Tensor[B, C', gh, gw], Padding): the maps (channels first, what timm returns; values
        outside an item are not the item's) and the token padding ``(B, gh, gw)``.

    Raises:
        ValueError: as :func:`~vispos.invariance.tokens._tokens.item_grids` (an item smaller than one
            patch, or not a multiple of it without ``dynamic_img_pad``).

    References:
        timm ``models/vision_transformer_sam.py``; Li et al., ViTDet, ECCV 2022.
    """
    from timm.layers import resample_abs_pos_embed_nhwc

    embed = model.patch_embed
    grids = item_grids(embed, padding)
    if padding.kind != "none":  # every value of the padding, NaN too, becomes a zero
        x = x.masked_fill(padding.mask[:, None], 0)
    if embed.dynamic_img_pad:  # the item's last partial patch sees zeros, as alone
        ph, pw = embed.patch_size
        x = F.pad(x, (0, (pw - x.shape[3] % pw) % pw, 0, (ph - x.shape[2] % ph) % ph))
    x = embed.norm(embed.proj(x).permute(0, 2, 3, 1))
    canvas = tuple(x.shape[1:3])
    token_padding = Padding.none(x.shape[0], canvas, x.device) if padding.kind == "none" else \
        Padding.from_sizes(grids, canvas, device=x.device)
    if model.pos_embed is not None:
        done: dict[tuple[int, int], Tensor] = {}
        for grid in grids:
            if grid not in done:
                done[grid] = resample_abs_pos_embed_nhwc(model.pos_embed, list(grid)).flatten(1, 2)
        tables = [done[grid] for grid in grids]  # one object per grid: placed by one gather
        x = x + on_canvas(tables, grids, canvas).reshape(x.shape[0], *canvas, -1).to(x.dtype)
    x = model.norm_pre(model.patch_drop(model.pos_drop(x)))
    valid = ~token_padding.mask
    take = set(indices)
    out = []
    for i, blk in enumerate(model.blocks[:max(take) + 1]):
        x = _block(blk, x, valid, grids)
        if i in take:
            level = x.permute(0, 3, 1, 2)
            out.append(_neck(model.neck, level, valid) if norm else level)
    return out, token_padding


def sam_levels(model: nn.Module, x: Tensor, padding: Padding, indices: tuple[int, ...]) -> list[NestedTensor]:
    """The :class:`~vispos.invariance.tokens._tokens.TokenModelRule` levels of a ``VisionTransformerSAM``
    inside timm's ``features_only`` wrapper (whose neck is kept exactly when the wrapper applies
    it, ``norm=True``).

    Args:
        model (nn.Module): the ``VisionTransformerSAM``.
        x (Tensor[B, C, H, W]): the padded images, each item at the origin.
        padding (Padding): ``x``'s (``"none"`` or ``"rectangular"``).
        indices (tuple of int): the blocks to return.

    Returns:
        list of NestedTensor ``(B, C', gh, gw)``: zeros on each level's padding (True = padding).

    Raises:
        ValueError: as :func:`sam_forward_intermediates`.
    """
    maps, token_padding = sam_forward_intermediates(model, x, padding, indices,
                                                    norm=not isinstance(model.neck, nn.Identity))
    levels = []
    for level in maps:
        if token_padding.kind != "none":
            level = level.masked_fill(token_padding.mask[:, None], 0)
        levels.append(NestedTensor(level.contiguous(), token_padding))
    return levels


def _neck(neck: nn.Module, x: Tensor, valid: Tensor) -> Tensor:
    """SAM's neck (1x1 conv, channel layer norm, 3x3 conv, channel layer norm): a convolution
    wider than one cell sees zeros outside each item."""
    layers = neck if isinstance(neck, nn.Sequential) else [neck]
    for layer in layers:
        if isinstance(layer, nn.Conv2d) and layer.kernel_size != (1, 1):
            x = x.masked_fill(~valid[:, None], 0)
        x = layer(x)
    return x


def sam_inline(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The modules :func:`sam_levels` runs the code of without calling them: the patch embedding
    (zeros on the padding, then its convolution and norm), each block and its attention (the
    key mask and each item's relative positions threaded through)."""
    found = [("patch_embed", model.patch_embed)]
    for i, blk in enumerate(model.blocks):
        found += [(f"blocks.{i}", blk), (f"blocks.{i}.attn", blk.attn)]
    return found


#: the token-model rule of this module, by class (registered by :mod:`vispos.invariance.rules._builtin`)
TOKEN_RULES = (("timm.models.vision_transformer_sam.VisionTransformerSAM",
                TokenModelRule(sam_levels, check_sam, inline=sam_inline)),)
