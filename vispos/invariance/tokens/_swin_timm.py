"""timm's Swin Transformer (``SwinTransformer``) on a padded batch, each item exactly what timm's
model gives it alone, through per-item shifted windows.

Alone (``strict_img_size=False``, as ``TimmBackbone`` builds it), a block rolls the item's token
map cyclically by the shift within the item's own grid, pads it with zero tokens to whole windows,
attends within windows with the shift mask of that padded grid (``get_attn_mask``, ``-100`` between
regions) and rolls back. On the canvas every item gets exactly that: its tokens are gathered into
a canvas laid out as its own shifted, zero-padded grid (windows aligned at the canvas origin, so at
the item's), its shift mask is built from its own padded grid, all windows of the batch attend as
one image of ``B * nW`` windows, and the result is gathered back. Patch merging sees zeros outside
each item (timm pads an odd map with zeros alone); the layer norms and MLPs are cell-wise.

References:
    Liu et al., Swin Transformer: Hierarchical Vision Transformer using Shifted Windows, ICCV 2021;
    timm ``models/swin_transformer.py`` (``SwinTransformerBlock._attn``, ``get_attn_mask``,
    ``PatchMerging``, ``forward_intermediates``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ...nested_tensor import NestedTensor
from ...padding import Padding
from ._tokens import TokenModelRule, item_grids

__all__ = ["swin_levels", "check_swin", "shifted_window_index", "item_shift_mask"]


def _ceil_to(n: int, m: int) -> int:
    return -(-n // m) * m


def shifted_window_index(grids: Sequence[tuple[int, int]], canvas: tuple[int, int], window: tuple[int, int],
                         shift: tuple[int, int]) -> tuple[Tensor, Tensor]:
    """Gather indices of each item's shifted, zero-padded token grid on the canvas, and back.

    Args:
        grids (sequence of (h, w)): each item's token grid, at the canvas origin.
        canvas ((H, W)): the canvas' token grid.
        window ((wh, ww)), shift ((sh, sw)): the block's window and shift sizes.

    Returns:
        (Tensor[B, Hp * Wp], Tensor[B, H * W]) int64 on the host: ``forward[b, p]`` is the flat
        canvas token (``H * W`` = a zero token) at position ``p`` of the windowed canvas
        ``(Hp, Wp)`` (the canvas padded to whole windows): item ``b``'s token rolled by ``-shift``
        within its own grid, zeros on the rest; ``back[b, q]`` the windowed position whose output
        is item ``b``'s token ``q`` rolled back (``q`` itself outside the item).
    """
    height, width = canvas
    hp, wp = _ceil_to(height, window[0]), _ceil_to(width, window[1])
    forward = torch.full((len(grids), hp, wp), height * width, dtype=torch.long)
    back = torch.arange(height * width, dtype=torch.long).view(height, width).repeat(len(grids), 1, 1)
    back = torch.minimum(back // width * wp + back % width, torch.tensor(hp * wp - 1))
    for b, (h, w) in enumerate(grids):
        rows = (torch.arange(h) + shift[0]) % h
        cols = (torch.arange(w) + shift[1]) % w
        forward[b, :h, :w] = rows[:, None] * width + cols[None, :]
        rows_back = (torch.arange(h) - shift[0]) % h
        cols_back = (torch.arange(w) - shift[1]) % w
        back[b, :h, :w] = rows_back[:, None] * wp + cols_back[None, :]
    return forward.view(len(grids), -1), back.view(len(grids), -1)


def item_shift_mask(grids: Sequence[tuple[int, int]], canvas: tuple[int, int], window: tuple[int, int],
                    shift: tuple[int, int], dtype: torch.dtype) -> Tensor:
    """timm's shift mask (``get_attn_mask``) of each item's own padded grid, on the windowed canvas.

    Args:
        grids (sequence of (h, w)): each item's token grid. canvas ((H, W)): the canvas'.
        window ((wh, ww)), shift ((sh, sw)): the block's window and (non-zero) shift sizes.
        dtype (torch.dtype): of the mask.

    Returns:
        Tensor[B * nW, wh * ww, wh * ww] on the host: ``-100`` between tokens of different regions of
        the item's own padded grid, 0 elsewhere (windows outside it: 0).

    References:
        Liu et al., Swin Transformer, ICCV 2021 (sec. 3.2, the masked shifted windows); timm
        ``SwinTransformerBlock.get_attn_mask``.
    """
    height, width = canvas
    hp, wp = _ceil_to(height, window[0]), _ceil_to(width, window[1])
    labels = torch.full((len(grids), hp, wp), -1.0)
    for b, (h, w) in enumerate(grids):
        own = torch.zeros(_ceil_to(h, window[0]), _ceil_to(w, window[1]))
        cnt = 0
        for hs in ((0, -window[0]), (-window[0], -shift[0]), (-shift[0], None)):
            for ws in ((0, -window[1]), (-window[1], -shift[1]), (-shift[1], None)):
                own[hs[0]:hs[1], ws[0]:ws[1]] = cnt
                cnt += 1
        labels[b, :own.shape[0], :own.shape[1]] = own
    windows = labels.view(len(grids), hp // window[0], window[0], wp // window[1], window[1])
    windows = windows.permute(0, 1, 3, 2, 4).reshape(-1, window[0] * window[1])
    diff = windows[:, None, :] - windows[:, :, None]
    return torch.zeros(diff.shape, dtype=dtype).masked_fill(diff != 0, -100.0)


def _layout(x: Tensor, grids: Sequence[tuple[int, int]], window: tuple[int, int], shift: tuple[int, int],
            cache: dict) -> tuple[Tensor, Tensor, Tensor | None]:
    """The gather indices and shift mask of one window / shift configuration on ``x``'s device,
    built once per stage (``cache``)."""
    key = (tuple(x.shape[1:3]), window, shift)
    if key not in cache:
        canvas = tuple(x.shape[1:3])
        forward, back = shifted_window_index(grids, canvas, window, shift)
        mask = item_shift_mask(grids, canvas, window, shift, x.dtype).to(x.device) if any(shift) else None
        cache[key] = (forward.to(x.device), back.to(x.device), mask)
    return cache[key]


def _attn(blk: nn.Module, x: Tensor, grids: Sequence[tuple[int, int]], cache: dict) -> Tensor:
    """``SwinTransformerBlock._attn`` of every item at once on ``x`` ``[B, H, W, C]``: what lies
    outside an item is never read."""
    from timm.models.swin_transformer import window_partition, window_reverse

    batch, height, width, channels = x.shape
    window, shift = tuple(blk.window_size), tuple(blk.shift_size)
    forward, back, mask = _layout(x, grids, window, shift, cache)
    hp, wp = _ceil_to(height, window[0]), _ceil_to(width, window[1])
    flat = torch.cat([x.reshape(batch, height * width, channels), x.new_zeros(batch, 1, channels)], dim=1)
    shifted = flat.gather(1, forward[..., None].expand(-1, -1, channels)).view(batch, hp, wp, channels)
    windows = window_partition(shifted, window).view(-1, window[0] * window[1], channels)
    out = blk.attn(windows, mask=mask).view(-1, window[0], window[1], channels)
    out = window_reverse(out, window, hp, wp).reshape(batch, hp * wp, channels)
    return out.gather(1, back[..., None].expand(-1, -1, channels)).view(batch, height, width, channels)


def _block(blk: nn.Module, x: Tensor, grids: Sequence[tuple[int, int]], cache: dict) -> Tensor:
    """One ``SwinTransformerBlock``; the gather of :func:`_attn` reads only each item's own tokens
    (zeros where alone the window is padded)."""
    batch, height, width, channels = x.shape
    x = x + blk.drop_path1(_attn(blk, blk.norm1(x), grids, cache))
    x = x.reshape(batch, -1, channels)
    x = x + blk.drop_path2(blk.mlp(blk.norm2(x)))
    return x.reshape(batch, height, width, channels)


def _token_padding(padding: Padding, grids: Sequence[tuple[int, int]], x: Tensor) -> Padding:
    """The padding of the token map ``x`` ``[B, H, W, C]``: each item's grid at the origin."""
    canvas = tuple(x.shape[1:3])
    if padding.kind == "none":
        return Padding.none(x.shape[0], canvas, x.device)
    return Padding.from_sizes(grids, canvas, device=x.device)


def check_swin(model: nn.Module) -> None:
    """Raises vispos' ``ValueError`` naming what :func:`swin_levels` cannot make exact in a timm
    ``SwinTransformer``: a fixed input size (the shift mask a buffer for it), a block, attention or
    downsampling layer with a ``forward`` of its own."""
    from timm.layers import PatchEmbed
    from timm.models import swin_transformer as swin

    def refuse(part: str, why: str) -> ValueError:
        return ValueError(f"padding_invariant=True cannot run {type(model).__name__}.{part} exactly on a padded "
                          f"batch: {why}")

    if type(model).forward_intermediates is not swin.SwinTransformer.forward_intermediates:
        raise refuse("forward_intermediates", f"{type(model).__name__} has its own, which vispos cannot run per item")
    if type(model.patch_embed).forward is not PatchEmbed.forward or model.patch_embed.output_fmt.value != "NHWC":
        raise refuse("patch_embed", f"{type(model.patch_embed).__name__} is not timm's channels-last PatchEmbed")
    for i, stage in enumerate(model.layers):
        if type(stage).forward is not swin.SwinTransformerStage.forward:
            raise refuse(f"layers.{i}", f"{type(stage).__name__} has a forward of its own")
        if not isinstance(stage.downsample, nn.Identity) and type(stage.downsample).forward is not \
                swin.PatchMerging.forward:
            raise refuse(f"layers.{i}.downsample", f"{type(stage.downsample).__name__} has a forward of its own")
        for j, blk in enumerate(stage.blocks):
            where = f"layers.{i}.blocks.{j}"
            if type(blk).forward is not swin.SwinTransformerBlock.forward or \
                    type(blk)._attn is not swin.SwinTransformerBlock._attn or \
                    type(blk.attn).forward is not swin.WindowAttention.forward:
                raise refuse(where, f"{type(blk).__name__} has a forward of its own")
            if not blk.dynamic_mask:
                raise refuse(where, "strict_img_size=True: the shift mask is a buffer for the construction size "
                                    "(the model takes no other size alone); build it with dynamic_img_size=True, "
                                    "as TimmBackbone does")


def swin_levels(model: nn.Module, x: Tensor, padding: Padding, indices: tuple[int, ...]) -> list[NestedTensor]:
    """The :class:`~vispos.invariance.tokens._tokens.TokenModelRule` levels of a timm ``SwinTransformer``:
    its ``forward_intermediates`` on a padded batch, each item exact.

    Args:
        model (nn.Module): the ``SwinTransformer`` (its final norm applied to the last stage unless
            timm's wrapper pruned it, as ``forward_intermediates(norm=...)``).
        x (Tensor[B, C, H, W]): the padded images, each item at the origin.
        padding (Padding): ``x``'s (``"none"`` or ``"rectangular"``).
        indices (tuple of int): the stages to return.

    Returns:
        list of NestedTensor ``(B, C_l, h_l, w_l)``: zeros on each level's padding (True = padding).

    Raises:
        ValueError: as :func:`~vispos.invariance.tokens._tokens.item_grids` (an item smaller than one patch
            or not a multiple of it).

    References:
        Liu et al., Swin Transformer, ICCV 2021; timm ``SwinTransformer.forward_intermediates``.
    """
    grids = item_grids(model.patch_embed, padding)
    if padding.kind != "none":
        x = x.masked_fill(padding.mask[:, None], 0)
    x = model.patch_embed(x)
    token_padding = _token_padding(padding, grids, x)
    take, last = set(indices), len(model.layers) - 1
    levels = []
    for i, stage in enumerate(model.layers[:max(take) + 1]):
        if not isinstance(stage.downsample, nn.Identity):  # timm pads an odd map with zeros alone
            if padding.kind != "none":
                x = x.masked_fill(token_padding.mask[..., None], 0)
            grids = [(-(-h // 2), -(-w // 2)) for h, w in grids]
        x = stage.downsample(x)  # an Identity too, as the stage calls it (its hooks run)
        token_padding = _token_padding(padding, grids, x)
        cache: dict = {}
        for blk in stage.blocks:
            x = _block(blk, x, grids, cache)
        if i in take:
            # forward_intermediates calls the norm on the last stage when timm's wrapper kept it
            level = (model.norm(x) if i == last and not isinstance(model.norm, nn.Identity) else x)
            level = level.permute(0, 3, 1, 2)
            if token_padding.kind != "none":
                level = level.masked_fill(token_padding.mask[:, None], 0)
            levels.append(NestedTensor(level.contiguous(), token_padding))
    return levels


def swin_inline(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The modules :func:`swin_levels` runs the code of without calling them: each stage, its
    blocks' container and each block (each item's windows and shift mask threaded through)."""
    found = []
    for i, stage in enumerate(model.layers):
        found += [(f"layers.{i}", stage), (f"layers.{i}.blocks", stage.blocks)]
        found += [(f"layers.{i}.blocks.{j}", blk) for j, blk in enumerate(stage.blocks)]
    return found


#: the token-model rule of this module, by class (registered by :mod:`vispos.invariance.rules._builtin`)
TOKEN_RULES = (("timm.models.swin_transformer.SwinTransformer",
                TokenModelRule(swin_levels, check_swin, inline=swin_inline)),)
