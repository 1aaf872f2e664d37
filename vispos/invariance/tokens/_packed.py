"""Packed (padding-free) runs of timm's ViT and EVA token models: every item's tokens in one sequence.

A padded batch spends its compute on the canvas; a packed run spends it on the items' own tokens
only. The batch is embedded on its canvas exactly as the padded invariant mode embeds it (zeros
outside each item, each item's own learned table and class / register tokens; a caller's vispos
position embedding computed on each distinct item grid), then every item's tokens are gathered
into one sequence ``(1, N_1 + ... + N_B, C)`` by one gather (indices built on the host for the
whole batch, one transfer), and every block runs on it: the token-wise layers (norms, MLP, layer
scale) on all tokens at once, attention block-diagonally, stochastic depth drawn per item. timm's
plain ``Attention`` runs once on all tokens with its one SDPA call made block-diagonal: on CUDA in
float16 / bfloat16 one FlashAttention variable-length call (``cu_seqlens``) per block for every
item; in float32 and on the CPU one SDPA call per item. EVA's rotary attention runs once per item.
The requested blocks come back, by one more gather, as the padded mode's levels (see
:class:`~vispos.invariance.TokenModelRule`): ``NestedTensor`` ``(B, C, gh, gw)``, each item's grid
at the origin, zeros and mask True elsewhere.

On the CPU, one SDPA call per item was measured the fastest exact block-diagonal attention
(``benchmarks/bench_packed.py --attention``, ``benchmarks/results_packed.md``: against SDPA with a
block-diagonal boolean mask, FlexAttention with a document mask and nested jagged tensors).

References:
    Dehghani et al., Patch n' Pack: NaViT, a Vision Transformer for any Aspect Ratio and
    Resolution, NeurIPS 2023 (sequence packing, per-image attention); Dao, FlashAttention-2, 2023
    (variable-length attention, ``torch.nn.attention.varlen``); Wightman, timm
    ``models/vision_transformer.py`` and ``models/eva.py`` (``_pos_embed``,
    ``forward_intermediates``), ``models/naflexvit.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode
from torch.utils.checkpoint import checkpoint

from ... import _tracing
from ...batching import nested_tensor_from_tensor_list
from ...nested_tensor import NestedTensor
from ...padding import Padding
from ._token_batch import add_item_positions, as_levels, batch_facts, canvas_tokens
from ._tokens import TokenModelRule, block_order, item_rope_embeds, on_canvas, refuse_inline_hooks
from ..rules import rule_for

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


def _attention(block: nn.Module, y: Tensor, lengths: list[int], ropes: list[Any] | None,
               cu_seqlens: Tensor) -> Tensor:
    """Block-diagonal attention over a packed sequence ``(1, N, C)``. timm's ``Attention`` (no
    rotary table, fused SDPA) runs once on every token, its one SDPA call made block-diagonal
    (:class:`_BlockDiagonalSDPA`); any other attention (EVA's, with each item's rotary table), and
    any attention while Dynamo traces (it does not trace the mode's redirect), runs once per item."""
    attn = block.attn
    if ropes is None and _plain_attention(attn) and not _tracing.compiling():
        with _BlockDiagonalSDPA(lengths, cu_seqlens) as sdpa:
            out = attn(y)
        if sdpa.calls != 1:  # pragma: no cover - timm's Attention calls SDPA exactly once
            raise RuntimeError(f"packed=True: {type(attn).__name__} made {sdpa.calls} SDPA calls, expected 1")
        return out
    parts = torch.split(y, lengths, dim=1)
    if ropes is None:
        return torch.cat([attn(part) for part in parts], dim=1)
    return torch.cat([attn(part, rope=rope) for part, rope in zip(parts, ropes)], dim=1)


def _plain_attention(attn: nn.Module) -> bool:
    """timm's ``Attention`` with its own forward and fused SDPA: every layer but SDPA is per token."""
    from timm.layers import Attention

    return type(attn).forward is Attention.forward and bool(getattr(attn, "fused_attn", False))


class _BlockDiagonalSDPA(TorchFunctionMode):
    """Inside it (this thread only), ``F.scaled_dot_product_attention`` on a packed sequence
    ``q, k, v`` ``(1, H, N, D)`` attends within each item's span: FlashAttention's variable-length
    kernel (``torch.nn.attention.varlen.varlen_attn``, cumulative lengths ``cu_seqlens``) on CUDA in
    float16 / bfloat16 without dropout, one SDPA call per item otherwise (float32, the CPU)."""

    def __init__(self, lengths: list[int], cu_seqlens: Tensor) -> None:
        super().__init__()
        self.lengths, self.cu_seqlens, self.calls, self._inside = lengths, cu_seqlens, 0, False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention or self._inside:  # (Dynamo re-enters the mode)
            return func(*args, **kwargs)
        self.calls += 1
        self._inside = True
        try:
            return self._attend(*args, **kwargs)
        finally:
            self._inside = False

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None, dropout_p: float = 0.0,
                is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False) -> Tensor:
        if attn_mask is not None or is_causal or enable_gqa:  # pragma: no cover - not what timm's Attention passes
            raise RuntimeError("packed=True: block-diagonal attention takes no mask, causality or GQA")
        if _varlen_ok(q, dropout_p):
            from torch.nn.attention.varlen import varlen_attn

            longest = max(self.lengths)
            out = varlen_attn(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), self.cu_seqlens,
                              self.cu_seqlens, longest, longest, scale=scale)  # (N, H, D)
            return out.transpose(0, 1)[None]
        parts = zip(*(t.split(self.lengths, dim=2) for t in (q, k, v)))
        return torch.cat([F.scaled_dot_product_attention(qi, ki, vi, dropout_p=dropout_p, scale=scale)
                          for qi, ki, vi in parts], dim=2)


def _varlen_ok(q: Tensor, dropout_p: float) -> bool:
    """Whether FlashAttention's variable-length kernel takes this call: CUDA, float16 / bfloat16,
    no dropout, and a torch that has it."""
    if not (q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) and dropout_p == 0.0):
        return False
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:  # pragma: no cover - an older torch
        return False
    return True


def _block(block: nn.Module, x: Tensor, lengths: list[int], ropes: list[Any] | None, cu_seqlens: Tensor) -> Tensor:
    """timm ``Block.forward`` / ``EvaBlock.forward`` on a packed sequence ``(1, N, C)``."""
    y = _attention(block, block.norm1(x), lengths, ropes, cu_seqlens)
    y = block.ls1(y) if hasattr(block, "ls1") else (y if block.gamma_1 is None else block.gamma_1 * y)
    x = x + _drop_path(block.drop_path1, y, lengths)
    y = block.mlp(block.norm2(x))
    y = block.ls2(y) if hasattr(block, "ls2") else (y if block.gamma_2 is None else block.gamma_2 * y)
    return x + _drop_path(block.drop_path2, y, lengths)


@_tracing.outside_graph
def _pack_tables(grids: list[tuple[int, int]], prefix: int, canvas: tuple[int, int],
                 device: torch.device) -> tuple[list[int], Tensor, Tensor, Tensor]:
    """The packing of a batch's tokens, built on the host for the whole batch and sent in one
    transfer (outside a compiled graph): each item's length ``P + h * w``; ``pack``, the row of
    every packed token in the canvas sequence ``(B * (P + gh * gw), C)``; ``unpack``, for every
    cell of the levels ``(B * gh * gw)``, the packed row of its token (the zero row ``N`` on the
    padding); ``cu_seqlens`` ``(B + 1,)`` int32, the items' cumulative lengths."""
    gh, gw = canvas
    row_len = prefix + gh * gw
    h = np.array([g[0] for g in grids], dtype=np.int64)
    w = np.array([g[1] for g in grids], dtype=np.int64)
    lengths = prefix + h * w
    starts = np.concatenate([[0], np.cumsum(lengths)])
    # pack: within item b, position j < P is prefix token j, else patch token (j - P) of its h x w grid
    item = np.repeat(np.arange(len(grids)), lengths)
    j = np.arange(int(starts[-1])) - starts[item]
    patch = np.maximum(j - prefix, 0)
    pack = item * row_len + np.where(j < prefix, j, prefix + (patch // w[item]) * gw + patch % w[item])
    # unpack: canvas cell (b, r, c) reads packed row starts[b] + P + r * w_b + c inside the item's grid
    r, c = np.divmod(np.arange(gh * gw), gw)
    inside = (r[None] < h[:, None]) & (c[None] < w[:, None])
    unpack = np.where(inside, starts[:-1, None] + prefix + r[None] * w[:, None] + c[None], starts[-1])
    moved = _tracing.host_arrays([pack, unpack.reshape(-1), starts.astype(np.int32)], device)
    return [int(n) for n in lengths], moved[0], moved[1], moved[2]


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

    The batch is embedded on its canvas as the padded mode embeds it (zeros outside each item, each
    item's own position table), every item's tokens are gathered into one sequence by one gather,
    the blocks run on it, and each wanted block is scattered back to the canvas by another: no work
    per item but timm's attention of other families than the plain ``Attention`` (EVA's rotary
    attention), which runs per item.

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
            called once per distinct item grid as an all-valid bool mask ``Tensor[1, h, w]``; its
            output ``Tensor[1, C, h, w]`` is added to each such item's patch tokens before the
            model's own position step. Default None.

    Returns:
        list of NestedTensor ``(B, embed_dim, gh, gw)`` in the model's dtype: ``(gh, gw)`` the token
        grid of the canvas, each item's tokens on its own grid at the origin, zeros on the padding
        (``Padding.none`` for a batch without padding).

    Raises:
        ValueError: an item smaller than one patch, or (without ``dynamic_img_pad``) not a multiple
            of it.

    References:
        Dehghani et al., NaViT, NeurIPS 2023; timm ``forward_intermediates``; Dao, FlashAttention-2,
        2023 (variable-length attention over cumulative sequence lengths).
    """
    if not isinstance(x, Tensor):  # the items on the largest size, zeros around each
        x = nested_tensor_from_tensor_list(list(x)).tensors
    facts = batch_facts(model, x, padding, rope=False)
    tokens = canvas_tokens(model, x, padding, facts)  # (B, gh, gw, C)
    batch, gh, gw, dim = tokens.shape
    if position_embedding is not None:  # each distinct grid's embedding, as alone, placed by one gather
        tables = {}
        for grid in facts.grids:
            if grid not in tables:
                alone = torch.zeros((1, *grid), dtype=torch.bool, device=tokens.device)
                out = position_embedding(alone)
                if not isinstance(out, Tensor) or out.dim() != 4 or out.shape[0] != 1 or tuple(out.shape[2:]) != grid:
                    got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
                    raise ValueError(f"position_embedding must return Tensor[1, C, h, w] (channels first) for an "
                                     f"item's {grid[0]} x {grid[1]} token grid, given as a mask (1, h, w); got {got}")
                tables[grid] = out[0].flatten(1).t()  # (h * w, C)
        pos = on_canvas([tables[grid] for grid in facts.grids], facts.grids, (gh, gw))
        tokens = tokens + pos.view(batch, gh, gw, -1).to(tokens.dtype)
    seq = model.pos_drop(add_item_positions(model, tokens, facts.pos))
    if getattr(model, "patch_drop", None) is not None:  # an identity (check_packed refuses dropout)
        seq = model.patch_drop(seq)
    seq = model.norm_pre(seq)  # (B, P + gh * gw, C)
    prefix = model.num_prefix_tokens
    lengths, pack, unpack, cu_seqlens = _pack_tables(facts.grids, prefix, (gh, gw), tokens.device)
    packed = seq.reshape(-1, dim).index_select(0, pack)[None]  # (1, N, C)
    ropes = None
    if getattr(model, "rope", None) is not None:
        ropes = item_rope_embeds(model.rope, facts.grids)
    mixed = getattr(model, "rope_mixed", False)
    wanted, maps = block_order(indices), []
    for depth, block in enumerate(model.blocks[: wanted[-1] + 1]):
        item_ropes = None if ropes is None else ([r[depth] for r in ropes] if mixed else ropes)
        if model.grad_checkpointing and torch.is_grad_enabled():  # as timm and the padded rule do
            packed = checkpoint(_block, block, packed, lengths, item_ropes, cu_seqlens, use_reentrant=False)
        else:
            packed = _block(block, packed, lengths, item_ropes, cu_seqlens)
        if depth in wanted:
            rows = torch.cat([packed[0], packed.new_zeros(1, dim)])  # the zero row for the padding
            grid = rows.index_select(0, unpack).view(batch, gh, gw, dim).permute(0, 3, 1, 2)
            maps.append(grid.contiguous())
    return as_levels(maps, facts.token_padding)


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
