"""The rule book's entries for MONAI's layers, and what the tracer does while it traces a MONAI
network so that the traced graph is the network's own code.

Rules (registered by dotted name, so importing vispos never imports MONAI; :func:`register` is
called once, with every other built-in entry, by :mod:`._builtin`):

* ``ChannelPad`` (HighResNet's residual: zeros appended to the channels, or a 1x1 projection)
  and MONAI's ``Swish`` / ``MemoryEfficientSwish`` read one cell at a time (:class:`CellWise`);
* ``nn.ConstantPad1d/2d/3d`` with value 0 (MONAI's EfficientNet "same" padders, fixed when the
  network is built): zeros around each item, a window of one cell with the pad as its border
  (:class:`ZeroPadRule`);
* refusals that name the real reason: MONAI's ``PatchEmbeddingBlock`` (stock ``ViT`` / ``UNETR``:
  a position table of one fixed patch grid, flattened into tokens; ``vispos.monai.AnySizeUNETR``
  is the exact one) and einops' ``Rearrange``; ``SubpixelUpsample`` (pixel shuffle reshapes
  channels into cells).

Tracing patches (entries of the book's tracing policy, keyed by the MONAI class whose instances
need them, so nothing is patched while any other network is traced; each restored when the trace
ends or fails):

* ``UpCat`` (BasicUNet's decoder block, whose skip concatenation is guarded by
  ``torch.jit.isinstance``, which the tracer answers for a traced value:
  :mod:`vispos.invariance.tracing._policy`): its ``is_pad`` is off (the one-cell replicate pad
  after an odd size was halved reads shapes in Python; with sizes divisible by the total stride
  it never pads, and other sizes are refused when run, since the two maps it concatenates then
  differ);
* ``HighResNet`` and its ``HighResBlock``: ``torch.as_tensor`` returns a traced value as it is (it returns a tensor itself;
  HighResNet wraps outputs in it), process-wide for the same reason;
* ``SegResNetDS``: its shape check is skipped for a traced value (it iterates over the shape), on
  the instance;
* ``EfficientNet``: ``efficientnet.drop_connect`` reads the number of spatial axes from the tracer
  rather than ``len(x.shape)`` (its random draw is the same call on the same shape), on MONAI's
  module attribute;
* ``DynUNet``: its list of deep-supervision heads, which its forward fills with traced values, gets
  its own entries back.

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
from ._rule import CellWise, InvarianceRule, Refuse

__all__ = ["ZeroPadRule", "register"]

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

    def apply(self, step, node, args):
        module = args["module"]
        pad, n = tuple(module.padding), step.num_axes
        if float(module.value) != 0.0 or any(p < 0 for p in pad) or len(pad) > 2 * n:
            step.refuse(node, f"padding={pad} with value={module.value} (only zeros added to spatial axes are what "
                              "an item alone gets)")
        pad = pad + (0,) * (2 * n - len(pad))  # F.pad order: last axis first, (low, high) each
        lo = tuple(pad[2 * (n - 1 - a)] for a in range(n))
        hi = tuple(pad[2 * (n - 1 - a) + 1] for a in range(n))
        step.window(node, Window((1,) * n, (1,) * n, lo, hi, (1,) * n, False), "zero")


@contextlib.contextmanager
def _as_tensor_passes_traced_values(module: nn.Module, num_axes: int) -> Iterator[None]:
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


@contextlib.contextmanager
def _upcat(module: nn.Module, num_axes: int) -> Iterator[None]:
    pad = getattr(module, "is_pad", False)
    module.is_pad = False
    try:
        yield
    finally:
        module.is_pad = pad


@contextlib.contextmanager
def _segresnet_ds(module: nn.Module, num_axes: int) -> Iterator[None]:
    if "is_valid_shape" in vars(module):
        yield
        return
    check = module.is_valid_shape
    module.is_valid_shape = lambda x: isinstance(x, fx.Proxy) or check(x)
    try:
        yield
    finally:
        vars(module).pop("is_valid_shape", None)


@contextlib.contextmanager
def _dynunet(module: nn.Module, num_axes: int) -> Iterator[None]:
    heads = getattr(module, "heads", None)
    saved = list(heads) if isinstance(heads, list) else None
    try:
        yield
    finally:
        if saved is not None:
            heads[:] = saved


@contextlib.contextmanager
def _efficientnet(module: nn.Module, num_axes: int) -> Iterator[None]:
    efficientnet = sys.modules.get("monai.networks.nets.efficientnet")
    real = getattr(efficientnet, "drop_connect", None)
    if real is None or getattr(real, "_vispos_traced", False):
        yield
        return
    efficientnet.drop_connect = _drop_connect(num_axes, real)
    try:
        yield
    finally:
        efficientnet.drop_connect = real


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

    drop_connect._vispos_traced = True  # one patch for several EfficientNets in one network
    return drop_connect


def register(book: Any) -> None:
    """Registers MONAI's rows and tracing patches in ``book`` (a :class:`~vispos.invariance.RuleBook`)."""
    for name in ("monai.networks.layers.simplelayers.ChannelPad", "monai.networks.blocks.activation.Swish",
                 "monai.networks.blocks.activation.MemoryEfficientSwish"):
        book.register(name, CellWise())
    for cls in (nn.ConstantPad1d, nn.ConstantPad2d, nn.ConstantPad3d):
        book.register(cls, ZeroPadRule())
    book.register("monai.networks.blocks.patchembedding.PatchEmbeddingBlock", Refuse(FIXED_GRID))
    book.register("einops.layers.torch.Rearrange", Refuse(
        "einops' Rearrange reshapes the map by a pattern whose sizes are the canvas's, without a padding mask"))
    book.register("monai.networks.blocks.upsample.SubpixelUpsample", Refuse(
        "pixel shuffle (upsample='pixelshuffle') reshapes channels into cells after a convolution, with a "
        "replicate pad and average pool of the canvas; use upsample='deconv' or 'nontrainable'"))
    book.tracing_patch("monai.networks.nets.basic_unet.UpCat", _upcat)
    for name in ("monai.networks.nets.highresnet.HighResNet", "monai.networks.nets.highresnet.HighResBlock"):
        book.tracing_patch(name, _as_tensor_passes_traced_values)
    book.tracing_patch("monai.networks.nets.segresnet_ds.SegResNetDS", _segresnet_ds)
    book.tracing_patch("monai.networks.nets.dynunet.DynUNet", _dynunet)
    book.tracing_patch("monai.networks.nets.efficientnet.EfficientNet", _efficientnet)
