"""Swin layers on padded batches where vispos does not make them exact: refused by name, each with
what differs from the item alone. (timm's whole ``SwinTransformer`` is exact, as a token model:
:mod:`vispos.invariance.tokens._swin_timm`; its block is refused here when a graph backbone traces it.)

Swin's shifted windows are laid out on the canvas, not on the item. Alone, an item's feature map
is padded to whole windows with zeros, rolled cyclically within its own padded grid (its first
rows and columns wrap around to its own bottom and right edge), and its shift mask is built from
that grid. In a padded batch the whole canvas is padded and rolled, so the windows at an item's
bottom and right edge hold the canvas' padding tokens instead of the item's own wrapped tokens and
zeros, and the shift mask is the canvas'. The three implementations add their own differences:

* timm ``SwinTransformerBlock`` (traced inside a graph backbone): the window and shift sizes are
  fixed from the construction resolution, the shift mask is a buffer for that resolution (built
  from the canvas with ``strict_img_size=False``), and the map is rolled before it is padded;
* torchvision ``ShiftedWindowAttention`` (``swin_t``): the shift is dropped on an axis where one
  window covers the padded canvas, so an item that one window covers alone is shifted in a larger
  batch;
* MONAI ``SwinTransformer`` (``SwinUNETR``'s encoder, 3D): ``get_window_size`` cuts the window to
  the canvas on axes no longer than it and drops the shift there, and ``compute_mask`` builds the
  mask from the canvas' padded size.

References:
    Liu et al., Swin Transformer, ICCV 2021; timm ``models/swin_transformer.py``; torchvision
    ``models/swin_transformer.py``; Hatamizadeh et al., Swin UNETR, 2022 (MONAI
    ``networks/nets/swin_unetr.py``).
"""

from __future__ import annotations

__all__ = ["SWIN_REFUSALS", "refuse_swin"]

_CANVAS = ("its windows are laid out on the canvas, not on the item: the windows at an item's bottom / right edge "
           "hold the canvas' padding tokens, unmasked, where alone they hold zeros (the item padded to whole "
           "windows) and, in shifted blocks, the item's own first rows and columns rolled cyclically within its "
           "own grid; the shift mask is the canvas'")

#: the Swin layers refused, by dotted class name, each with what differs from the item alone
SWIN_REFUSALS = {
    "timm.models.swin_transformer.SwinTransformerBlock": (
        f"{_CANVAS}; the window and shift sizes are cut to the construction resolution, the shift mask is a "
        "buffer for that resolution (built from the canvas with dynamic_img_size / strict_img_size=False), and "
        "the map is rolled before it is padded"),
    "torchvision.models.swin_transformer.ShiftedWindowAttention": (
        f"{_CANVAS}; the shift is dropped on an axis where one window covers the padded canvas, so an item that "
        "one window covers alone is shifted in a larger batch"),
    "monai.networks.nets.swin_unetr.SwinTransformer": (
        f"{_CANVAS}; get_window_size cuts the window to the canvas' size on axes no longer than it (and drops "
        "the shift there), and compute_mask builds the mask from the canvas' padded size"),
}

def refuse_swin(model) -> None:
    """Raises vispos' ``ValueError`` for the first Swin layer of ``model`` (named by its path), before
    any tracing: MONAI's encoder cannot be traced by torch.fx, so the rewrite would never reach it.

    Args:
        model (nn.Module): a backbone about to be made padding invariant.

    Raises:
        ValueError: ``model`` holds a layer of :data:`SWIN_REFUSALS` (named, with what differs).
    """
    for path, module in model.named_modules():
        for cls in type(module).__mro__:
            why = SWIN_REFUSALS.get(f"{cls.__module__}.{cls.__qualname__}")
            if why is not None:
                where = f"{path} ({type(module).__name__})" if path else type(module).__name__
                from ..rewrite._rewrite_base import voice  # who refuses, and the advice its caller can take

                who, advice = voice()
                raise ValueError(f"{who} cannot run {where} exactly on a padded batch: {why}. {advice}")
