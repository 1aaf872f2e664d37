"""Per-block attention and token-norm statistics of the detector's ViT on padded batches, read
without changing timm's code.

Every block's ``F.scaled_dot_product_attention`` call is intercepted by a
:class:`torch.overrides.TorchFunctionMode` that recomputes the attention weights from the query,
key and mask the block passes (after RoPE, with the invariant run's key mask), then lets the call
run as it would (:class:`AttentionProbe`); a forward hook on each block reads its output tokens.
Each key is one of four kinds (:data:`KEY_KINDS`): the item's own patch token, a padding token
(a token of the canvas outside the item's grid), the class token, a register token.

The statistics (:func:`attention_sums`, :func:`norm_outlier_counts`), for each block, over the
queries that are valid patch tokens (class, register and padding queries are left out), every
head and every item of the batches:

* ``padding_mass``: the attention weight on padding keys, summed over them, averaged over queries
  and heads. The stock ViT's padded batches give it a value; the invariant ViT masks those keys,
  so its value is measured 0, not assumed;
* ``class_mass`` / ``register_mass``: the same on the class token and on the register tokens;
* ``entropy``: ``-sum_k p_k log p_k`` over the keys (nats), averaged over queries and heads;
* ``outlier_fraction``: the share of valid patch tokens of a block's output whose L2 norm is more
  than ``outlier_ratio`` (default 2) times the median norm of the same item's valid patch tokens at
  that block: the high-norm "artifact" tokens of Darcet et al. (about 10x the others' norm in
  DINOv2 / ViT-L, which registers remove); ``max_norm_ratio`` is the largest such ratio.

``padding_share`` (once per run): the share of the keys a valid query sees that are padding,
averaged over the same queries: what uniform attention would put on padding.

References:
    Darcet et al., Vision Transformers Need Registers, ICLR 2024 (high-norm tokens, registers);
    PyTorch ``torch.overrides.TorchFunctionMode``; timm ``models/eva.py`` (``EvaAttention``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from ...nested_tensor import NestedTensor
from ...padding import Padding

__all__ = ["KEY_KINDS", "PATCH", "PADDING", "CLASS", "REGISTER", "BlockSums", "attention_weights", "attention_sums",
           "norm_outlier_counts", "token_kinds", "AttentionProbe", "vit_block_diagnostics"]

#: the kinds of tokens (keys and queries), in this order: an item's patch token, padding, class, register
KEY_KINDS = ("patch", "padding", "class", "register")
PATCH, PADDING, CLASS, REGISTER = range(4)


def attention_weights(q: Tensor, k: Tensor, attn_mask: Tensor | None = None, scale: float | None = None) -> Tensor:
    """The weights ``softmax(q k^T * scale + mask)`` that ``F.scaled_dot_product_attention`` applies
    to the values, computed explicitly in float64.

    Args:
        q (Tensor[B, H, Nq, D]): queries. k (Tensor[B, H, Nk, D]): keys.
        attn_mask (Tensor, optional): broadcastable to ``(B, H, Nq, Nk)``; bool: True = attend
            (SDPA's convention), float: added to the logits.
        scale (float, optional): default ``1 / sqrt(D)``.

    Returns:
        Tensor[B, H, Nq, Nk] float64: each query's weights, summing to 1 (a query with every key
        masked gets NaN, as SDPA's math path).

    Raises:
        ValueError: ``q`` and ``k`` not 4-D with the same batch, heads and width.
    """
    if q.dim() != 4 or k.dim() != 4 or q.shape[:2] != k.shape[:2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must be (B, H, N, D) with the same B, H and D, got {tuple(q.shape)} and "
                         f"{tuple(k.shape)}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    logits = (q.double() @ k.double().transpose(-2, -1)) * scale
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            logits = logits.masked_fill(~attn_mask, float("-inf"))
        else:
            logits = logits + attn_mask.double()
    return logits.softmax(-1)


@dataclass
class BlockSums:
    """One block's running sums over (item, head, valid query) triples; :meth:`means` divides.

    Attributes:
        queries (float): triples counted. padding, class_, register (float): attention mass
            summed over triples. entropy (float): entropy (nats) summed. padding_share (float):
            the share of padding keys, summed. patch_tokens, outliers (int): valid patch tokens of
            the block's output, and those above the norm cutoff. max_norm_ratio (float): the
            largest norm / item median.
    """

    queries: float = 0.0
    padding: float = 0.0
    class_: float = 0.0
    register: float = 0.0
    entropy: float = 0.0
    padding_share: float = 0.0
    patch_tokens: int = 0
    outliers: int = 0
    max_norm_ratio: float = 0.0

    def add(self, other: BlockSums) -> None:
        for name in ("queries", "padding", "class_", "register", "entropy", "padding_share", "patch_tokens",
                     "outliers"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.max_norm_ratio = max(self.max_norm_ratio, other.max_norm_ratio)

    def means(self) -> dict[str, float]:
        """``padding_mass``, ``class_mass``, ``register_mass``, ``entropy``, ``padding_share``
        (means over the triples), ``outlier_fraction``, ``max_norm_ratio``; NaN where nothing
        was counted."""
        q, n = self.queries or math.nan, self.patch_tokens or math.nan
        return {"padding_mass": self.padding / q, "class_mass": self.class_ / q, "register_mass": self.register / q,
                "entropy": self.entropy / q, "padding_share": self.padding_share / q,
                "outlier_fraction": self.outliers / n, "max_norm_ratio": self.max_norm_ratio}


def attention_sums(weights: Tensor, kinds: Tensor) -> BlockSums:
    """Attention mass per key kind, entropy and padding share, summed over the heads and the
    queries that are valid patch tokens (see the module docstring).

    Args:
        weights (Tensor[B, H, N, N]): self-attention weights, rows summing to 1 (queries and keys
            are the same tokens).
        kinds (Tensor[B, N] int): each token's kind (:data:`KEY_KINDS`: ``PATCH``, ``PADDING``,
            ``CLASS``, ``REGISTER``).

    Returns:
        BlockSums: with ``queries`` = heads x valid patch queries; the norm fields 0.

    Raises:
        ValueError: shapes that do not match.
    """
    b, h, n, m = weights.shape
    if n != m or kinds.shape != (b, n):
        raise ValueError(f"weights must be (B, H, N, N) and kinds (B, N), got {tuple(weights.shape)} and "
                         f"{tuple(kinds.shape)}")
    w = weights.double()
    query = (kinds == PATCH)[:, None, :].expand(b, h, n)  # (B, H, Nq)
    def mass(kind: int) -> float:
        return float((w * (kinds == kind)[:, None, None, :]).sum(-1)[query].sum())

    entropy = -torch.special.xlogy(w, w).sum(-1)[query].sum()
    share = (kinds == PADDING).double().mean(-1)[:, None, None].expand(b, h, n)[query].sum()
    return BlockSums(queries=float(query.sum()), padding=mass(PADDING), class_=mass(CLASS), register=mass(REGISTER),
                     entropy=float(entropy), padding_share=float(share))


def norm_outlier_counts(tokens: Tensor, kinds: Tensor, ratio: float = 2.0) -> BlockSums:
    """High-norm tokens among each item's valid patch tokens: those whose L2 norm exceeds
    ``ratio`` times the median norm of the item's valid patch tokens.

    Args:
        tokens (Tensor[B, N, C]): a block's output. kinds (Tensor[B, N] int): as :func:`attention_sums`.
        ratio (float): the cutoff, a multiple of the item's median norm (> 0).

    Returns:
        BlockSums: ``patch_tokens``, ``outliers`` and ``max_norm_ratio`` set, the attention fields 0.

    Raises:
        ValueError: ``ratio`` not > 0; shapes that do not match.
    """
    if not ratio > 0:
        raise ValueError(f"ratio must be > 0, got {ratio!r}")
    if tokens.dim() != 3 or kinds.shape != tokens.shape[:2]:
        raise ValueError(f"tokens must be (B, N, C) and kinds (B, N), got {tuple(tokens.shape)} and {tuple(kinds.shape)}")
    valid = kinds == PATCH
    norms = tokens.double().norm(dim=-1).masked_fill(~valid, math.nan)
    median = norms.nanquantile(0.5, dim=1, keepdim=True)  # the mean of the middle two for an even count
    rel = norms / median
    outliers = valid & (rel > ratio)
    top = rel.masked_fill(~valid, 0).amax() if valid.any() else torch.zeros(())
    return BlockSums(patch_tokens=int(valid.sum()), outliers=int(outliers.sum()), max_norm_ratio=float(top))


def token_kinds(model: nn.Module, x: Tensor, padding: Padding) -> Tensor:
    """Each token's kind (``Tensor[B, P + gh * gw]`` int64) in the sequence timm's ViT / Eva (and
    the padded invariant run) builds for the padded batch ``x``: the class token, the register
    tokens, then the canvas's patch grid row by row, a cell outside the item's own grid
    (``PatchEmbed.dynamic_feat_size`` of its size) being padding."""
    from ...invariance import item_grids

    embed = model.patch_embed
    canvas = tuple(int(g) for g in embed.dynamic_feat_size(tuple(x.shape[2:])))
    grids = item_grids(embed, padding)
    mask = Padding.from_sizes(grids, canvas, device=x.device).mask.flatten(1)  # True = padding
    cls = 1 if getattr(model, "cls_token", None) is not None else 0
    prefix = [CLASS] * cls + [REGISTER] * (model.num_prefix_tokens - cls)
    patch = torch.where(mask, PADDING, PATCH)
    return torch.cat([torch.tensor(prefix, dtype=torch.long, device=x.device).expand(x.shape[0], -1), patch], 1)


class AttentionProbe(TorchFunctionMode):
    """Records, while active, the statistics of every ``F.scaled_dot_product_attention`` call made
    inside one of ``blocks`` and of each block's output, into ``sums[i]`` (:class:`BlockSums`).

    Set :attr:`kinds` (:func:`token_kinds`) before each batch. The blocks' attention modules are
    switched to their fused (SDPA) path while the probe is entered (timm's ``fused_attn``) and
    restored on exit; the calls themselves run unchanged.

    Args:
        blocks (iterable of nn.Module): the ViT's blocks, in order.
        outlier_ratio (float): as :func:`norm_outlier_counts`.

    Raises:
        ValueError: (on a call) a sequence whose length is not the one :attr:`kinds` describes (a
            packed run: diagnose its padded invariant twin).
    """

    def __init__(self, blocks: Iterable[nn.Module], outlier_ratio: float = 2.0) -> None:
        super().__init__()
        self.blocks = list(blocks)
        self.outlier_ratio = outlier_ratio
        self.sums = [BlockSums() for _ in self.blocks]
        self.kinds: Tensor | None = None
        self._block: int | None = None
        self._handles: list = []
        self._fused: list = []

    def _check(self, n: int) -> Tensor:
        if self.kinds is None or self.kinds.shape[1] != n:
            want = None if self.kinds is None else self.kinds.shape[1]
            raise ValueError(f"kinds describe {want} tokens, the block attends over {n}")
        return self.kinds

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention and self._block is not None:
            q, k = args[0], args[1]
            mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
            dropout = kwargs.get("dropout_p", args[4] if len(args) > 4 else 0.0)
            causal = kwargs.get("is_causal", args[5] if len(args) > 5 else False)
            if causal or kwargs.get("enable_gqa", False) or dropout:  # weights recomputed as plain softmax only
                raise ValueError(f"attention diagnostics take plain SDPA calls (no causal mask, GQA or dropout): "
                                 f"block {self._block} passed is_causal={causal}, dropout_p={dropout}, "
                                 f"enable_gqa={kwargs.get('enable_gqa', False)}")
            w = attention_weights(q, k, mask, kwargs.get("scale"))
            self.sums[self._block].add(attention_sums(w, self._check(q.shape[2])))
        return func(*args, **kwargs)

    def __enter__(self):
        for i, blk in enumerate(self.blocks):
            self._handles.append(blk.register_forward_pre_hook(lambda m, a, i=i: setattr(self, "_block", i)))
            self._handles.append(blk.register_forward_hook(lambda m, a, out, i=i: self._after(i, out)))
            attn = getattr(blk, "attn", None)
            if attn is not None and hasattr(attn, "fused_attn"):
                self._fused.append((attn, attn.fused_attn))
                attn.fused_attn = True
        return super().__enter__()

    def _after(self, i: int, out: Tensor) -> None:
        self._block = None
        self.sums[i].add(norm_outlier_counts(out, self._check(out.shape[1]), self.outlier_ratio))

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()
        for attn, fused in self._fused:
            attn.fused_attn = fused
        self._handles, self._fused, self._block = [], [], None
        return super().__exit__(*exc)


@dataclass
class VitDiagnostics:
    """What :func:`vit_block_diagnostics` measured.

    Attributes:
        blocks (list of dict): one per block run (up to the backbone's level), in order: ``block``
            and :meth:`BlockSums.means`'s keys.
        items (int): items of the batches. outlier_ratio (float): the norm cutoff used.
        padding_share (float): see the module docstring.
    """

    blocks: list[dict[str, float]] = field(default_factory=list)
    items: int = 0
    outlier_ratio: float = 2.0
    padding_share: float = math.nan


@torch.no_grad()
def vit_block_diagnostics(backbone: nn.Module, batches: Iterable[NestedTensor], outlier_ratio: float = 2.0
                          ) -> VitDiagnostics:
    """Runs ``backbone`` (a :class:`~vispos.backbones.TimmBackbone` over timm's ViT / Eva, stock or
    padding-invariant, in eval mode) on each padded batch and measures every block it runs (see
    the module docstring).

    Args:
        backbone (nn.Module): has ``body.model`` (timm's ViT / Eva, with ``blocks`` and
            ``patch_embed``); a packed backbone is refused (its padded invariant twin gives the
            same tokens).
        batches (iterable of NestedTensor): ``(B, 3, H, W)`` padded batches, items at the origin,
            on the backbone's device.
        outlier_ratio (float): the norm cutoff (:func:`norm_outlier_counts`).

    Returns:
        VitDiagnostics.

    Raises:
        ValueError: a backbone without a ViT inside, or a packed one; ``outlier_ratio`` not > 0.
    """
    model = getattr(getattr(backbone, "body", None), "model", None)
    if model is None or not hasattr(model, "blocks") or not hasattr(model, "patch_embed"):
        raise ValueError(f"backbone must wrap a timm ViT / Eva (body.model.blocks), got {type(backbone).__name__}")
    if getattr(backbone, "_packed", None) is not None:
        raise ValueError("backbone is packed (no padding token): diagnose the padded invariant backbone with its weights")
    if not outlier_ratio > 0:
        raise ValueError(f"outlier_ratio must be > 0, got {outlier_ratio!r}")
    was_training = backbone.training
    backbone.eval()
    probe = AttentionProbe(model.blocks, outlier_ratio)
    items = 0
    try:
        with probe:
            for nested in batches:
                probe.kinds = token_kinds(model, nested.tensors, nested.padding)
                backbone(nested)
                items += nested.tensors.shape[0]
    finally:
        backbone.train(was_training)
    ran = [i for i, s in enumerate(probe.sums) if s.queries]
    blocks = [{"block": i, **probe.sums[i].means()} for i in ran]
    padding_share = probe.sums[ran[0]].means()["padding_share"] if ran else math.nan
    return VitDiagnostics(blocks, items, outlier_ratio, padding_share)
