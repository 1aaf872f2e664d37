"""A convolutional patch stem in a vision transformer (``patch_embed.proj`` that is not one
patch-sized convolution per token: overlapping convolutions, norms, activations) on a padded
batch, each item as alone: the stem traced and rewritten by the CNN rule book on each item's box
padded to whole patches, then ``PatchEmbed``'s layout and norm. The stem is traced and rewritten
as the Joiner's projections are (:class:`~vispos.invariance.geometry._projection.InvariantProjection`).

References:
    Xiao et al., Early Convolutions Help Transformers See Better, NeurIPS 2021; timm
    ``layers/patch_embed.py`` (``PatchEmbed``, ``dynamic_img_pad``).
"""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from ...nested_tensor import NestedTensor
from ...padding import Padding

__all__ = ["check_stem", "invariant_stem", "is_patch_projection", "stem_tokens"]

#: where a convolutional patch stem's rewritten graph is kept (a plain attribute of ``patch_embed``)
_STEM = "_vispos_invariant_stem"


def _refuse(model: nn.Module, why: str) -> ValueError:
    return ValueError(f"padding_invariant=True cannot run {type(model).__name__} exactly on a padded batch: {why}")


def is_patch_projection(embed: nn.Module) -> bool:
    """Whether timm's ``PatchEmbed`` projects with one non-overlapping patch per token (one
    ``Conv2d`` whose kernel and stride are the patch, no padding): each token then reads only its
    own pixels, and the zero-filled canvas is all the item needs (Dosovitskiy et al., ICLR 2021).

    Args:
        embed (nn.Module): timm's ``PatchEmbed`` (``proj``, ``patch_size``).

    Returns:
        bool: False for any other ``proj`` (a convolutional stem, :func:`stem_tokens`).
    """
    proj, patch = embed.proj, tuple(embed.patch_size)
    return (isinstance(proj, nn.Conv2d) and tuple(proj.kernel_size) == patch and tuple(proj.stride) == patch
            and tuple(proj.padding) == (0, 0) and tuple(proj.dilation) == (1, 1))


def invariant_stem(embed: nn.Module) -> Any:
    """The rule book's graph of a convolutional patch stem (``patch_embed.proj`` that is not one
    patch per token: overlapping convolutions, norms and activations, Xiao et al. 2021), traced
    once and kept in ``patch_embed.__dict__`` (out of the submodules and ``state_dict``, as the
    Joiner keeps its projections'); traced again when ``proj``'s layers, parameters or buffers
    were replaced. Two threads tracing the same stem at once each build one; the last is kept.

    Args:
        embed (nn.Module): timm's ``PatchEmbed`` whose ``proj`` is the stem.

    Raises:
        ValueError: a layer of the stem that cannot be made exact (named, ``patch_embed.proj.k``).

    Returns:
        InvariantProjection: the stem's graph and runner
        (:class:`~vispos.invariance.geometry._projection.InvariantProjection`).
    """
    from ..geometry._projection import InvariantProjection  # the FX tracer (torchvision), on first use only

    cached = embed.__dict__.get(_STEM)
    if cached is not None and cached.fits(embed.proj):
        return cached
    stem = InvariantProjection(embed, "proj", 2, label="patch_embed")
    embed.__dict__[_STEM] = stem
    return stem


#: item sides (in patches) :func:`check_stem` runs through the stem's convolution arithmetic
_STEM_SIDES = (1, 2, 3, 4, 5, 6, 7, 8, 16, 33)


def _check_hooks(embed: nn.Module, stem: Any) -> None:
    """Raises ``ValueError`` for a forward or backward hook on ``patch_embed`` or on a module of its
    stem that the rewritten graph runs inline (a container, a layer traced through): its hook
    would not run. Hooks on the layers the graph calls as modules run as usual."""
    modules = [("patch_embed", embed)] + [(f"patch_embed.proj.{n}" if n else "patch_embed.proj", m)
                                          for n, m in embed.proj.named_modules()]
    unhooked = stem.unhooked(modules)
    if unhooked:
        name, module = unhooked[0]
        raise ValueError(
            f"padding_invariant=True runs the convolutional patch stem as a rewritten graph, which calls no "
            f"{name} ({type(module).__name__}) module, so its hooks would not run; remove them, or hook "
            "patch_embed.norm or the stem's convolutions"
        )


def check_stem(model: nn.Module) -> None:
    """Raises ``ValueError`` for a convolutional patch stem that the rule book cannot make exact
    (a layer, named), whose convolution arithmetic does not give timm's token grid (``k``
    tokens for ``k`` patches, the grid ``PatchEmbed.dynamic_feat_size`` and every position table
    assume; checked for sides of 1 to 8, 16 and 33 patches, and again for every batch), or that
    carries hooks the rewritten graph would not run.

    Args:
        model (nn.Module): a timm ``VisionTransformer`` / ``Eva`` whose ``patch_embed.proj`` is
            not one patch per token.

    Raises:
        ValueError: naming the layer or the token grids, as above.

    References:
        Xiao et al., NeurIPS 2021; timm ``PatchEmbed.dynamic_feat_size``.
    """
    embed = model.patch_embed
    try:
        stem = invariant_stem(embed)
    except ValueError as exc:
        raise _refuse(model, f"its convolutional patch stem: {exc}") from exc
    patch = tuple(embed.patch_size)
    want = [(k, _STEM_SIDES[-1 - i]) for i, k in enumerate(_STEM_SIDES)]
    sizes = [(a * patch[0], b * patch[1]) for a, b in want]
    top = max(_STEM_SIDES)
    canvas = (top * patch[0], top * patch[1])
    try:
        level = stem.runner.paddings(Padding.from_sizes(sizes, canvas))
    except ValueError as exc:  # convolution arithmetic: an item of one patch has no cell left
        raise _refuse(model, f"patch_embed.proj is not one token per patch {patch} (items of {sizes} px on a "
                             f"{canvas} canvas: {exc})") from exc
    outputs = stem.runner.outputs
    out = level[(outputs.get("any") or outputs["train"])[0]]
    got = [tuple(s) for s in out.sizes]
    if tuple(out.spatial) != (top, top) or got != want:
        raise _refuse(model, f"patch_embed.proj maps items of {sizes} px on a {canvas} canvas to token grids "
                             f"{got} on {tuple(out.spatial)}: not one token per patch {patch} ({want} on "
                             f"{(top, top)})")
    _check_hooks(embed, stem)


def stem_tokens(embed: nn.Module, x: Tensor, padding: Padding, grids: list[tuple[int, int]]) -> Tensor:
    """``PatchEmbed.forward`` with a convolutional stem, each item as alone: the canvas padded to
    whole patches (``dynamic_img_pad``), the stem run by the rule book on each item's own padded
    box (zeros outside it, statistics over its cells), then ``PatchEmbed``'s layout and norm.

    Args:
        embed (nn.Module): timm's ``PatchEmbed`` whose ``proj`` is the stem.
        x (Tensor[B, C, H, W]): the padded batch, zeros outside each item.
        padding (Padding): ``x``'s (``"none"`` or ``"rectangular"`` at the origin).
        grids (list of (int, int)): each item's token grid (:func:`item_grids`).

    Returns:
        Tensor: ``PatchEmbed``'s output, ``(B, gh, gw, C)`` for a ``dynamic_img_size`` model.

    Raises:
        ValueError: a stem layer the rule book refuses (named), token grids that are not one
            token per patch, a hook the rewritten graph would not run.
    """
    from timm.layers.format import nchw_to

    patch = tuple(embed.patch_size)
    height, width = x.shape[2:]
    if embed.dynamic_img_pad:
        x = F.pad(x, (0, (-width) % patch[1], 0, (-height) % patch[0]))
    if padding.kind == "none":
        stem_padding = Padding.none(x.shape[0], tuple(x.shape[2:]), x.device)
    else:  # alone, dynamic_img_pad pads the item to whole patches with zeros: that box is the item's
        boxes = [(g[0] * patch[0], g[1] * patch[1]) for g in grids]
        stem_padding = Padding.from_sizes(boxes, tuple(x.shape[2:]), device=x.device)
    stem = invariant_stem(embed)
    _check_hooks(embed, stem)
    level = stem(NestedTensor(x, stem_padding))
    y = level.tensors
    canvas = tuple(int(g) for g in embed.dynamic_feat_size(tuple(x.shape[2:])))
    got = [tuple(level.padding.spatial)] * len(grids) if padding.kind == "none" else list(level.padding.sizes)
    if tuple(level.padding.spatial) != canvas or (padding.kind != "none" and got != [tuple(g) for g in grids]):
        raise ValueError(f"padding_invariant=True: patch_embed.proj gives token grids {got} on "
                         f"{tuple(level.padding.spatial)}, not one token per patch {patch} ({grids} on {canvas})")
    if embed.flatten:
        y = y.flatten(2).transpose(1, 2)
    elif embed.output_fmt != "NCHW":
        y = nchw_to(y, embed.output_fmt)
    return embed.norm(y)
