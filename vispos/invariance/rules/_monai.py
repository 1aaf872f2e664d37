"""The rule book's entries for MONAI's layers, and what the tracer does while it traces a MONAI
network so that the traced graph is the network's own code.

Rules (registered by dotted name, so importing vispos never imports MONAI):

* ``ChannelPad`` (HighResNet's residual: zeros appended to the channels, or a 1x1 projection)
  and MONAI's ``Swish`` / ``MemoryEfficientSwish`` read one cell at a time (:class:`CellWise`);
* ``nn.ConstantPad1d/2d/3d`` with value 0 (MONAI's EfficientNet "same" padders, fixed when the
  network is built): zeros around each item, a window of one cell with the pad as its border
  (:class:`ZeroPadRule`);
* refusals that name the real reason: MONAI's ``PatchEmbeddingBlock`` (stock ``ViT`` / ``UNETR``:
  a position table of one fixed patch grid, flattened into tokens; ``vispos.monai.AnySizeUNETR``
  is the exact one) and einops' ``Rearrange``; ``SubpixelUpsample`` (pixel shuffle reshapes
  channels into cells).

While tracing (:func:`tracing_patches`), restored on exit: ``torch.as_tensor`` returns a traced
value as it is (it returns a tensor itself; HighResNet wraps outputs in it), ``SegResNetDS``'s
shape check is skipped for a traced value (it iterates over the shape), EfficientNet's
``drop_connect`` reads the number of spatial axes from the tracer rather than ``len(x.shape)``
(its random draw is the same call on the same shape), and ``DynUNet``'s list of
deep-supervision heads, which its forward fills with traced values, gets its own entries back.

References:
    MONAI (``monai.networks.nets``: ``HighResNet``, ``SegResNetDS``, ``DynUNet``, ``EfficientNetBN``,
    ``UNETR``; ``monai.networks.layers.ChannelPad``); torch.fx (``Tracer``).
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from typing import Any, Iterator

import torch
import torch.fx as fx
from torch import nn

from ..geometry._geometry import Window
from ._book import CellWise, InvarianceRule, Refuse, register_invariance_rule

__all__ = ["ZeroPadRule", "tracing_patches"]

#: the reason a stock ViT / UNETR is refused (its patch embedding is the first layer that fails)
FIXED_GRID = (
    "MONAI's ViT / UNETR patch embedding adds a position table of one fixed patch grid (img_size / patch_size) "
    "and flattens the grid into tokens, so every item must be img_size and a padded canvas is another grid; "
    "use vispos.monai.AnySizeUNETR / AnySizeViT (the same weights, positions per item, padded patches masked)"
)


@dataclass(frozen=True)
class ZeroPadRule(InvarianceRule):
    """``nn.ConstantPad1d/2d/3d`` with value 0 and non-negative pads on the spatial axes only:
    zeros around each item (its padding is filled with zeros), a one-cell window whose border is
    the pad, so every later window sees the item's own frame."""

    kind = "window"

    def rewrite(self, step, node, module):
        pad, n = tuple(module.padding), step.num_axes
        if float(module.value) != 0.0 or any(p < 0 for p in pad) or len(pad) > 2 * n:
            step.refuse(node, f"padding={pad} with value={module.value} (only zeros added to spatial axes are what "
                              "an item alone gets)")
        pad = pad + (0,) * (2 * n - len(pad))  # F.pad order: last axis first, (low, high) each
        lo = tuple(pad[2 * (n - 1 - a)] for a in range(n))
        hi = tuple(pad[2 * (n - 1 - a) + 1] for a in range(n))
        step.window(node, Window((1,) * n, (1,) * n, lo, hi, (1,) * n, False), "zero")


def _register() -> None:
    for name in ("monai.networks.layers.simplelayers.ChannelPad", "monai.networks.blocks.activation.Swish",
                 "monai.networks.blocks.activation.MemoryEfficientSwish"):
        register_invariance_rule(name, CellWise())
    for cls in (nn.ConstantPad1d, nn.ConstantPad2d, nn.ConstantPad3d):
        register_invariance_rule(cls, ZeroPadRule())
    register_invariance_rule("monai.networks.blocks.patchembedding.PatchEmbeddingBlock", Refuse(FIXED_GRID))
    register_invariance_rule("einops.layers.torch.Rearrange", Refuse(
        "einops' Rearrange reshapes the map by a pattern whose sizes are the canvas's, without a padding mask"))
    register_invariance_rule("monai.networks.blocks.upsample.SubpixelUpsample", Refuse(
        "pixel shuffle (upsample='pixelshuffle') reshapes channels into cells after a convolution, with a "
        "replicate pad and average pool of the canvas; use upsample='deconv' or 'nontrainable'"))


_register()


def _dotted(obj: Any) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


@contextlib.contextmanager
def _as_tensor_passes_traced_values() -> Iterator[None]:
    real = torch.as_tensor

    def as_tensor(data: Any, dtype: Any = None, device: Any = None) -> Any:
        if isinstance(data, fx.Proxy) and dtype is None and device is None:
            return data  # torch.as_tensor(tensor) is the tensor itself
        return real(data, dtype=dtype, device=device)

    torch.as_tensor = as_tensor
    try:
        yield
    finally:
        torch.as_tensor = real


def _drop_connect(num_axes: int, real: Any):
    """MONAI's ``efficientnet.drop_connect`` (``real``) with ``len(x.shape) - 2`` read as ``num_axes``
    for a traced value: the same ``torch.rand`` call on the same shape, so the same draw; a tensor
    (another thread running the network meanwhile) goes to ``real``."""

    def drop_connect(inputs: Any, p: float, training: bool) -> Any:
        if not isinstance(inputs, fx.Proxy):
            return real(inputs, p, training)
        if p < 0.0 or p > 1.0:
            raise ValueError(f"p must be in range of [0, 1], found {p}")
        if not training:
            return inputs
        keep_prob = 1 - p
        random_tensor = torch.rand([inputs.shape[0], 1] + [1] * num_axes, dtype=inputs.dtype, device=inputs.device)
        random_tensor += keep_prob
        return inputs / keep_prob * torch.floor(random_tensor)

    return drop_connect


@contextlib.contextmanager
def tracing_patches(root: nn.Module, num_axes: int) -> Iterator[None]:
    """While torch.fx traces ``root``: the patches of the module docstring, each restored on exit
    (also when tracing fails). Only the instances inside ``root`` and, for ``torch.as_tensor`` and
    EfficientNet's ``drop_connect``, the module attribute are patched, and only meanwhile."""
    undo: list[Any] = []
    try:
        with _as_tensor_passes_traced_values():
            for m in root.modules():
                name = _dotted(m)
                if name.startswith("monai.networks.nets.segresnet_ds.SegResNetDS") and "is_valid_shape" not in vars(m):
                    check = m.is_valid_shape
                    m.is_valid_shape = lambda x, check=check: isinstance(x, fx.Proxy) or check(x)
                    undo.append(lambda m=m: vars(m).pop("is_valid_shape", None))
                elif name == "monai.networks.nets.dynunet.DynUNet" and isinstance(getattr(m, "heads", None), list):
                    undo.append(lambda heads=m.heads, saved=list(m.heads): heads.__setitem__(slice(None), saved))
            efficientnet = sys.modules.get("monai.networks.nets.efficientnet")
            if efficientnet is not None and hasattr(efficientnet, "drop_connect"):
                real = efficientnet.drop_connect
                efficientnet.drop_connect = _drop_connect(num_axes, real)
                undo.append(lambda: setattr(efficientnet, "drop_connect", real))
            yield
    finally:
        for restore in reversed(undo):
            restore()
