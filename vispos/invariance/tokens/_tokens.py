"""Whole token models (vision transformers) on padded batches: the rule type, its runner, and the
per-item position helpers every token family shares.

A CNN is made exact layer by layer (:mod:`vispos.invariance.rewrite._rewrite`); a vision transformer is
made exact as a whole, by one function that runs the model's own modules the way its
``forward_intermediates`` does, with each item's own positions and an attention mask. That
function is a :class:`TokenModelRule`, registered for the model's class with
:func:`~vispos.register_invariance_rule`; ``TimmBackbone(name, padding_invariant=True)`` looks it
up for the timm model inside its ``features_only`` wrapper and runs it instead of the FX rewrite.

The per-item helpers, for any runner of token models (padded or packed):

* :func:`item_grids`: each item's token grid, as the patch embedding gives it alone;
* :func:`item_pos_embeds`: the learned absolute table resampled to each item's grid, exactly as
  timm's ``_pos_embed`` does for the item alone (``resample_abs_pos_embed``, once per distinct
  grid);
* :func:`item_rope_embeds`: each item's rotary table (timm's ``rope.get_embed``), coordinates
  normalised by the item's own grid; in training the coordinate augmentation (DINOv3's shift,
  jitter and rescale) is drawn once per item, in batch order;
* :func:`on_canvas`: per-item token tables placed on the canvas's token grid (zeros elsewhere);
* :func:`key_padding_keep`: the boolean attention mask (SDPA convention, True = attend) that keeps
  every query off the padding keys.

References:
    Dosovitskiy et al., An Image is Worth 16x16 Words, ICLR 2021 (sec. 3.2, resampled position
    tables); timm ``models/vision_transformer.py`` / ``models/eva.py`` (``forward_intermediates``)
    and ``models/naflexvit.py`` (per-image tables and attention masks); Simeoni et al., DINOv3,
    2025 (RoPE coordinate augmentation).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ... import _tracing
from ...nested_tensor import NestedTensor
from ...padding import Padding
from .. import rules as _rules
from ..rules import InvarianceRule

__all__ = [
    "TokenModelRule", "TokenRunner", "block_order", "has_hooks", "item_grids", "item_pos_embeds", "item_rope_embeds",
    "on_canvas", "key_padding_keep", "no_rule_message", "refuse_inline_hooks", "token_model_classes",
]

#: ``levels(model, x, padding, indices) -> list[NestedTensor]``
TokenLevels = Callable[[nn.Module, Tensor, Padding, tuple[int, ...]], list[NestedTensor]]


@dataclass(frozen=True)
class TokenModelRule(InvarianceRule):
    """A whole token model (a vision transformer) run exactly on a padded batch by one function.

    ``TimmBackbone(name, padding_invariant=True)`` finds the rule of the timm model (inside its
    ``features_only`` wrapper), calls ``check(model)`` once when it is built and
    ``levels(model, x, padding, indices)`` at every forward instead of tracing the model.

    Args:
        levels (callable): ``levels(model, x, padding, indices) -> list[NestedTensor]``.
            ``model`` is the timm model (``nn.Module``), ``x`` the padded batch
            ``Tensor[B, C, H, W]`` with items at the origin, ``padding`` its
            :class:`~vispos.Padding` (``"none"`` or ``"rectangular"``), ``indices`` timm's block
            indices to return (non-negative, as ``forward_intermediates(indices=...)`` takes them).
            Returns one NestedTensor ``(B, C_l, h_l, w_l)`` per distinct index, in block order
            (as ``forward_intermediates`` returns them, whatever order ``indices`` lists them in),
            whose padding (True = padding) marks the cells outside each item's own token map, and
            whose tensors equal on each item's cells what ``model.forward_intermediates`` gives the
            item alone.
        check (callable, optional): ``check(model) -> None``, raises ``ValueError`` naming what the
            rule cannot make exact in this model's configuration (called when the backbone is
            built). Default None: nothing to check.
        packed (callable, optional): the same contract as ``levels`` for a packed run, or None.
        inline (callable, optional): ``inline(model) -> iterable of (name, nn.Module)``: the
            modules the model's own ``forward_intermediates`` calls as modules but ``levels`` does
            not (it runs their code itself, e.g. a block with a key mask threaded through). A
            forward or backward hook on one would not run, so the call raises ``ValueError``
            naming it instead. Default None: ``levels`` calls every such module.

    Raises:
        TypeError: ``levels`` is not callable; ``check`` or ``packed`` is neither None nor callable.

    References:
        timm ``forward_intermediates`` (the levels a ``features_only`` model returns); timm
        ``models/naflexvit.py`` (per-image position tables and attention masks).
    """

    levels: TokenLevels
    check: Callable[[nn.Module], None] | None = None
    packed: TokenLevels | None = None
    inline: Callable[[nn.Module], Any] | None = None
    kind = "token_model"

    def __post_init__(self) -> None:
        if not callable(self.levels):
            raise TypeError(f"TokenModelRule: levels must be callable, got {type(self.levels).__name__}")
        for name in ("check", "packed", "inline"):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise TypeError(f"TokenModelRule: {name} must be callable or None, got {type(value).__name__}")

    def apply(self, step: Any, node: Any, args: dict[str, Any]) -> None:
        step.refuse(node, "a whole token model inside a traced backbone (its rule runs the model as a whole; "
                          "use it as the backbone itself, e.g. TimmBackbone(name, padding_invariant=True))")


class TokenRunner:
    """Runs a :class:`TokenModelRule` on a :class:`~vispos.NestedTensor` (the backbones'
    ``padding_invariant=True`` for a token model).

    Args:
        rule (TokenModelRule): the model's rule.
        indices (sequence of int): the block indices to return, non-negative; the levels come back
            in block order, each index once (as timm's ``forward_intermediates`` returns them).
        unwrap (callable): ``unwrap(body) -> nn.Module``, the timm model inside the backbone's body.

    Raises:
        ValueError: at a call, an arbitrary mask (no boxes) or an item off the canvas's origin; as
            the rule's ``levels`` (an item the model cannot take alone).
    """

    def __init__(self, rule: TokenModelRule, indices: Sequence[int], unwrap: Callable[[nn.Module], nn.Module]) -> None:
        self.rule, self.indices, self.unwrap = rule, block_order(indices), unwrap

    @classmethod
    def for_model(cls, model: nn.Module | None, indices: Sequence[int],
                  unwrap: Callable[[nn.Module], nn.Module]) -> "TokenRunner | None":
        """The runner of ``model``'s token-model rule (the timm model inside a backbone), its
        ``check`` run; None when no :class:`TokenModelRule` covers ``model``'s class (or ``model``
        is None): the backbone is then traced layer by layer, and :meth:`refusal` names the class
        if that fails.

        Raises:
            ValueError: the rule's ``check`` refuses the model's configuration (named).
        """
        rule = None if model is None else _rules.rule_for(model)
        if not isinstance(rule, TokenModelRule):
            return None
        if rule.check is not None:
            rule.check(model)
        return cls(rule, indices, unwrap)

    @staticmethod
    def refusal(model: nn.Module, model_name: str, why: BaseException) -> ValueError:
        """The ``ValueError`` for a token model that no :class:`TokenModelRule` covers and that
        cannot be traced layer by layer either (``why``): it names the class, the classes that
        have a rule, and how to register one."""
        return ValueError(no_rule_message(model, model_name, why))

    def __call__(self, body: nn.Module, x: NestedTensor) -> list[NestedTensor]:
        padding = x.padding
        if padding.kind == "arbitrary":
            raise ValueError(
                "padding_invariant=True needs each item's box (a rectangular padding), got an arbitrary "
                "mask; build the batch with vispos.nested_tensor_from_tensor_list / PaddedCollate, or "
                "Padding.from_sizes, or Padding.from_mask(mask, classify=True) for a box mask"
            )
        if not padding.at_origin:
            raise ValueError(
                "padding_invariant=True for a token model needs every item at the origin of the canvas "
                f"(DETR's layout), got item starts {padding.starts}"
            )
        model = self.unwrap(body)
        if self.rule.inline is not None:
            refuse_inline_hooks(self.rule.inline(model), "padding_invariant=True")
        return self.rule.levels(model, x.tensors, padding, self.indices)


def block_order(indices: Sequence[int]) -> tuple[int, ...]:
    """Non-negative block indices in block order, each once: the levels timm's
    ``forward_intermediates`` returns for them (it takes its indices as a set)."""
    return tuple(sorted({int(i) for i in indices}))


def token_model_classes() -> list[str]:
    """The class names that have a :class:`TokenModelRule` (a whole-model padding-invariance
    rule), sorted."""
    names = {key if isinstance(key, str) else f"{key.__module__}.{key.__qualname__}"
             for key, rule in _rules.default_rules().items() if isinstance(rule, TokenModelRule)}
    return sorted(name.rsplit(".", 1)[-1] for name in names)


def no_rule_message(model: nn.Module, model_name: str, why: BaseException) -> str:
    """The refusal of a timm model that runs through its own ``forward_intermediates`` (a token
    model, as timm's ``features_only`` getter wrapper calls it) but has no token-model rule: it
    names the class, what is covered, and why tracing it layer by layer failed too."""
    cls = type(model)
    return (
        f"padding_invariant=True: no padding-invariance rule covers {cls.__name__} ({model_name!r}, "
        f"{cls.__module__}). A token model (vision transformer) is made exact as a whole by a rule for its "
        f"class, with each item's positions and an attention mask: vispos has rules for "
        f"{', '.join(token_model_classes())} (and their subclasses that keep their forward); register one "
        f"with vispos.register_invariance_rule({cls.__name__}, TokenModelRule(levels, check)), or use "
        f"padding_invariant=False (DETR's behaviour). Traced layer by layer as a CNN instead, it stops at: {why}"
    )


def has_hooks(module: nn.Module) -> bool:
    """Whether ``module`` carries a forward, forward-pre, backward or backward-pre hook of its own
    (not the global ones of ``torch.nn.modules.module``)."""
    return bool(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                or getattr(module, "_backward_pre_hooks", None))


def refuse_inline_hooks(modules: Any, owner: str) -> None:
    """Raises ``ValueError`` naming the first of ``modules`` (``(name, nn.Module)`` pairs, names
    as under the timm model) that carries a hook: ``owner``'s run does not call it as a module, so
    the hook would not run (while the model's own forward would run it)."""
    for name, module in modules:
        if has_hooks(module):
            raise ValueError(
                f"{owner} runs the code of {name} ({type(module).__name__}) itself, with each item's "
                "positions and key mask threaded through, and does not call the module, so the forward / "
                "backward hooks registered on it would not run; remove them, or hook a layer inside it "
                "(its attention's qkv or proj, its mlp, a norm) or the backbone's output levels"
            )


# ----------------------------------------------------------------------------- per-item helpers
def item_grids(patch_embed: nn.Module, padding: Padding) -> list[tuple[int, int]]:
    """Each item's token grid ``(h, w)``, as timm's patch embedding gives it for the item alone
    (``PatchEmbed.dynamic_feat_size``: the ceiling of the size over the patch with
    ``dynamic_img_pad``, which pads the item's edge with zeros; without it timm takes only sizes
    that are multiples of the patch). Host ints from the padding's boxes: no device read.

    Args:
        patch_embed (nn.Module): timm's ``PatchEmbed`` (``dynamic_feat_size``).
        padding (Padding): the pixel padding, ``"none"`` or ``"rectangular"`` (items at the origin).

    Returns:
        list of (int, int): one grid per item.

    Raises:
        ValueError: an item smaller than one patch (it has no token alone); without
            ``dynamic_img_pad``, an item whose size is not a multiple of the patch (timm refuses it
            alone).
    """
    if padding.kind == "none":
        sizes = [tuple(padding.spatial)] * padding.batch
    else:
        sizes = [tuple(s) for s in padding.sizes]
    grids = [tuple(int(g) for g in patch_embed.dynamic_feat_size(size)) for size in sizes]
    patch = tuple(patch_embed.patch_size)
    for b, (size, grid) in enumerate(zip(sizes, grids)):
        if not patch_embed.dynamic_img_pad and any(s % p for s, p in zip(size, patch)):
            raise ValueError(
                f"item {b} of size {size} is not a multiple of the patch {patch}: the model, built without "
                "dynamic_img_pad=True, fails on it alone (TimmBackbone builds vision transformers with it)"
            )
        if min(grid) < 1:
            raise ValueError(
                f"item {b} of size {size} is smaller than one patch {tuple(patch_embed.patch_size)}: it has no "
                "token alone (the model fails on it alone)"
            )
    return grids


def on_canvas(tables: Sequence[Tensor], grids: Sequence[tuple[int, int]], canvas: tuple[int, int]) -> Tensor:
    """Per-item token tables placed on the canvas's token grid, row-major, zeros elsewhere: the
    distinct tables (the same tensor object given for several items counts once) and a zero row
    concatenated, then one gather for the whole batch, whose indices are built on the host and sent
    in one transfer (no work per item on the device).

    Args:
        tables (sequence of Tensor[..., h_b * w_b, D]): item ``b``'s table over its own grid,
            row-major; every table has the same leading shape, dtype and device.
        grids (sequence of (int, int)): ``(h_b, w_b)``.
        canvas (int, int): the canvas's token grid ``(gh, gw)``, ``>=`` every grid.

    Returns:
        Tensor[B, ..., gh * gw, D]: in the tables' dtype and device.
    """
    gh, gw = canvas
    first: dict[int, int] = {}  # id(table) -> its first row in the concatenation
    distinct, rows = [], 0
    for table, (h, w) in zip(tables, grids):
        if table.shape[-2] != h * w:  # a host check: a table of another grid would be read cell by cell
            raise ValueError(f"on_canvas: a table of {table.shape[-2]} rows for a {h} x {w} grid")
        if id(table) not in first:
            first[id(table)] = rows
            distinct.append(table)
            rows += table.shape[-2]
    lead, dim = tables[0].shape[:-2], tables[0].shape[-1]
    source = torch.cat(distinct + [tables[0].new_zeros(*lead, 1, dim)], dim=-2)
    cells = np.arange(gh * gw)
    row, col = cells // gw, cells % gw
    offset = np.array([first[id(table)] for table in tables], dtype=np.int64)[:, None]
    h, w = (np.array([g[axis] for g in grids], dtype=np.int64)[:, None] for axis in (0, 1))
    index = np.where((row < h) & (col < w), offset + row * w + col, rows)  # (B, gh * gw)
    (index_t,) = _tracing.host_arrays([index.reshape(-1)], source.device)
    out = source.index_select(source.dim() - 2, index_t)  # (..., B * gh * gw, D)
    return out.view(*lead, len(tables), gh * gw, dim).movedim(len(lead), 0)


def item_pos_embeds(model: nn.Module, grids: Sequence[tuple[int, int]]) -> list[Tensor]:
    """The learned absolute table of a timm ViT / Eva resampled to each item's grid, as the model's
    ``_pos_embed`` resamples it for the item alone (``dynamic_img_size=True``).

    Args:
        model (nn.Module): timm ``VisionTransformer`` or ``Eva`` with a ``pos_embed`` parameter
            ``(1, N, C)``.
        grids (sequence of (int, int)): each item's token grid.

    Returns:
        list of Tensor[1, P + h_b * w_b, C]: ``P`` is the model's prefix-token count when the table
        holds entries for them (``no_embed_class=False``), else 0. Items with the same grid share one
        tensor (computed once). Bitwise timm's own ``resample_abs_pos_embed`` call.
    """
    from timm.layers import resample_abs_pos_embed

    prefix = 0 if model.no_embed_class else model.num_prefix_tokens
    old = model.patch_embed.grid_size
    done: dict[tuple[int, int], Tensor] = {}
    for grid in grids:
        if grid not in done:
            done[grid] = resample_abs_pos_embed(model.pos_embed, new_size=grid, old_size=old,
                                                num_prefix_tokens=prefix)
    return [done[grid] for grid in grids]


def item_rope_embeds(rope: nn.Module, grids: Sequence[tuple[int, int]]) -> list[Tensor]:
    """Each item's rotary table, from timm's RoPE module as the model builds it for the item alone
    (``rope.get_embed(shape=(h, w))``): coordinates normalised by the item's own grid (DINOv3's
    centred grid, EVA's ``ref_feat_shape`` rescale).

    In training with coordinate augmentation (``shift_coords`` / ``jitter_coords`` /
    ``rescale_coords``), one draw per item, in batch order, from torch's generator: item ``b`` gets
    the draw it gets alone after ``b`` items ran alone before it (each item alone draws once).
    Otherwise items with the same grid share one table.

    Args:
        rope (nn.Module): timm ``RotaryEmbeddingCat``, ``RotaryEmbeddingDinoV3`` or
            ``RotaryEmbeddingMixed`` (any module with ``get_embed(shape=...)``).
        grids (sequence of (int, int)): each item's token grid.

    Returns:
        list of Tensor: ``[h_b * w_b, 2 * head_dim]`` (cat, DINOv3) or
        ``[depth, heads, h_b * w_b, 2 * head_dim]`` (mixed).
    """
    if rope.training and getattr(rope, "aug_active", False):
        return [rope.get_embed(shape=grid) for grid in grids]
    done: dict[tuple[int, int], Tensor] = {}
    for grid in grids:
        if grid not in done:
            done[grid] = rope.get_embed(shape=grid)
    return [done[grid] for grid in grids]


def key_padding_keep(token_padding: Padding, num_prefix_tokens: int) -> Tensor:
    """``Tensor[B, 1, 1, P + gh * gw]`` bool, True where a key is attended to (SDPA's convention):
    the ``P`` prefix tokens and each item's own tokens."""
    keep = ~token_padding.mask.flatten(1)
    if num_prefix_tokens:
        keep = torch.cat([keep.new_ones(keep.shape[0], num_prefix_tokens), keep], dim=1)
    return keep[:, None, None, :]
