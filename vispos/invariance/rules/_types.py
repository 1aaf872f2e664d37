"""The built-in rule types of the one table (:mod:`vispos.invariance.rules`) for windows and moves: each states what a
module, function or method does to the cells of a padded batch, reads its arguments by name (a
module's from its attributes, a function's by its signature) and rewrites its node through the
:class:`~vispos.invariance.rules.RewriteStep`. One object serves a module and its functional twin
(``nn.Conv2d`` and ``F.conv2d``); :mod:`vispos.invariance.rules._builtin` registers them.

* **reads neighbours** (:class:`Conv`, :class:`ConvTranspose`, :class:`MaxPool`,
  :class:`AvgPool`, :class:`Interpolate`, :class:`Pad`): a window; its input's padding is filled (0, ``-inf``,
  or each item's edge values) and its output gets a new geometry by convolution arithmetic;
* **per-item statistics** and reductions along the channels: :mod:`._reductions`;
* **moves cells without mixing them** (:class:`Permute`, :class:`Cat`, :class:`Split`,
  :class:`GetItem`, :class:`Repeat` over the channels, :class:`Expand` of each item's value over a
  map's cells) and **reads the channels axis**
  (:class:`OverChannels`: a layer norm or linear layer over the last axis, cell-wise when that
  axis holds the channels).

References:
    ``torch.nn`` / ``torch.nn.functional`` / ``torch.Tensor`` signatures; Dumoulin and Visin, A
    guide to convolution arithmetic for deep learning, 2016; Liu et al., Partial Convolution based
    Padding, 2018.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.fx as fx

from . import _functions as sig
from ..rewrite import _ops as ops
from ..cells import _upsampling as upsampling
from ._functions import window_of
from ..geometry._geometry import TransposedWindow, Window
from ._book import InvarianceRule, RewriteStep

__all__ = [
    "AvgPool", "Cat", "ChannelView", "Conv", "ConvTranspose", "Expand", "GetItem", "Interpolate", "MaxPool",
    "OverChannels", "Pad", "Permute", "Repeat", "Split", "Transpose",
]


def _channels_dim(dim: Any, rank: int) -> bool:
    """Whether ``dim`` is an int naming the channels axis (1, or ``1 - rank``) of a channels-first
    map of ``rank`` axes."""
    return isinstance(dim, int) and dim % rank == 1


# ------------------------------------------------------------------------------ windows
@dataclass(frozen=True)
class Conv(InvarianceRule):
    """``nn.Conv1d/2d/3d`` and ``F.conv1d/2d/3d``: zeros in the input's padding (what its own zero
    padding gives the item alone)."""

    kind = "conv"
    fresh_output = True
    reads_one_map = True
    signature = staticmethod(sig._sig_conv)
    attributes = ("weight", "bias", "kernel_size", "stride", "padding", "dilation", "groups", "padding_mode")

    def apply(self, step: RewriteStep, node: fx.Node, args: dict[str, Any]) -> None:
        mode = args.get("padding_mode") or "zeros"
        if mode != "zeros":
            step.refuse(node, f"padding_mode={mode!r} (only zero padding is what an item alone sees)")
        kernel = args.get("kernel_size") or step.kernel_size(args["weight"], node)
        step.window(node, window_of(step.num_axes, kernel, args["stride"], args["padding"], args["dilation"]), "zero")


@dataclass(frozen=True)
class ConvTranspose(InvarianceRule):
    """``nn.ConvTranspose1d/2d/3d`` and ``F.conv_transpose1d/2d/3d``: zeros in the input's padding,
    each item's output box by the transposed-convolution size formula on its own box
    (:mod:`vispos.invariance.cells._upsampling`); ``output_size=`` refused."""

    kind = "conv_transpose"
    fresh_output = True
    reads_one_map = True
    signature = staticmethod(sig._sig_conv_transpose)
    attributes = ("weight", "bias", "kernel_size", "stride", "padding", "output_padding", "groups", "dilation")

    def apply(self, step: RewriteStep, node: fx.Node, args: dict[str, Any]) -> None:
        if args.get("output_size") is not None:
            step.refuse(node, "it is called with output_size= (the canvas's size, from which torch picks the "
                              "output padding; the item alone would get its own)")
        kernel = args.get("kernel_size") or step.kernel_size(args["weight"], node)
        step.window(node, upsampling.transposed_window(step.num_axes, kernel, args["stride"], args["padding"],
                                                       args["output_padding"], args["dilation"]), "zero")


@dataclass(frozen=True)
class MaxPool(InvarianceRule):
    """``nn.MaxPool1d/2d/3d`` and ``F.max_pool1d/2d/3d``: ``-inf`` in the input's padding."""

    kind = "max_pool"
    reads_one_map = True
    signature = staticmethod(sig._sig_max_pool)
    attributes = ("kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices")

    def apply(self, step: RewriteStep, node: fx.Node, args: dict[str, Any]) -> None:
        if args["return_indices"]:
            step.refuse(node, "return_indices=True (indices into the padded canvas differ from the item's)")
        step.window(node, window_of(step.num_axes, args["kernel_size"], args["stride"], args["padding"],
                                    args["dilation"], args["ceil_mode"]), "max")


@dataclass(frozen=True)
class AvgPool(InvarianceRule):
    """``nn.AvgPool1d/2d/3d`` and ``F.avg_pool1d/2d/3d``: window sums over zeros in the padding, each
    item's own divisor."""

    kind = "avg_pool"
    reads_one_map = True
    signature = staticmethod(sig._sig_avg_pool)
    attributes = ("kernel_size", "stride", "padding", "ceil_mode", "count_include_pad", "divisor_override")

    def apply(self, step: RewriteStep, node: fx.Node, args: dict[str, Any]) -> None:
        window = window_of(step.num_axes, args["kernel_size"], args["stride"], args["padding"], 1, args["ceil_mode"])
        step.avg_pool(node, window, args["count_include_pad"], args["divisor_override"])


@dataclass(frozen=True)
class Interpolate(InvarianceRule):
    """``nn.Upsample`` and ``F.interpolate`` (:mod:`vispos.invariance.cells._upsampling`): an integer
    ``scale_factor`` runs as it is (nearest) or on each item's edge values (linear modes); a size
    read from another feature map (``size=skip.shape[-2:]``), a non-integer factor
    (``scale_factor=0.5``) or ``align_corners=True`` resizes each item from its own size to its own
    output size (``"area"``: each item's own adaptive bins). Refused: a constant ``size=``, or
    ``antialias=True`` on the per-item path."""

    kind = "upsample"
    reads_one_map = True
    reads_sizes = True  # its size= may be read from a feature map
    signature = staticmethod(sig._sig_interpolate)
    attributes = ("size", "scale_factor", "mode", "align_corners", "recompute_scale_factor")

    def apply(self, step: RewriteStep, node: fx.Node, args: dict[str, Any]) -> None:
        size, scale_factor, mode = args["size"], args["scale_factor"], args["mode"]
        align_corners, antialias = args["align_corners"], bool(args.get("antialias"))
        n = step.num_axes
        if mode not in upsampling.NEAREST + upsampling.LINEAR:
            step.refuse(node, f"mode={mode!r}")
        if size is not None:
            target = step.size_source(size)
            if target is None and (isinstance(size, fx.Node) or isinstance(size, (tuple, list)) and any(
                    isinstance(v, fx.Node) for v in size)):
                step.refuse(node, f"it resizes to size={size!r}, computed in the graph (only another feature map's "
                                  "own size, size=skip.shape[-2:], is each item's own)")
            if target is None:
                step.refuse(node, f"it resizes to a fixed size={size!r}, the canvas's output rather than the item's "
                                  "(use a scale_factor, or the size of another feature map: size=skip.shape[-2:])")
            return self._per_item(step, node, target, args)
        scales = scale_factor if isinstance(scale_factor, (tuple, list)) else (scale_factor,) * n
        if len(scales) != n or not all(type(s) in (int, float) and s > 0 for s in scales):  # a bool is no factor
            step.refuse(node, f"scale_factor={scale_factor!r} (only constant factors > 0, one or one per spatial "
                              "axis)")
        if not all(float(s).is_integer() for s in scales):
            return self._per_item(step, node, upsampling.ScaledWindow(tuple(float(s) for s in scales)), args)
        scales = tuple(int(s) for s in scales)
        window = TransposedWindow(scales, scales, (0,) * n, (0,) * n, (1,) * n)
        if align_corners and mode in upsampling.LINEAR:
            return self._per_item(step, node, window, args)
        if mode in upsampling.NEAREST:
            return step.window(node, window, "zero")  # taps never meet: nothing is filled
        if antialias and mode == "bicubic":
            step.refuse(node, "mode='bicubic' with antialias=True: its taps are renormalised over the cells inside "
                              "the input, so at the item's edge alone over fewer taps than in a batch")
        step.window(node, window, "edge")

    @staticmethod
    def _per_item(step: RewriteStep, node: fx.Node, target: Any, args: dict[str, Any]) -> None:
        """Each item resized from its own size to its own output size (``target``: the output's
        geometry id, or a window on the input's geometry)."""
        mode, scale_factor, recompute = args["mode"], args["scale_factor"], args.get("recompute_scale_factor")
        if args.get("antialias"):
            step.refuse(node, f"mode={mode!r} with antialias=True to a size or by a non-integer factor (its taps "
                              "are renormalised over the cells inside the input, fewer at the item's edge alone)")
        scales = None if recompute or scale_factor is None else scale_factor
        step.resize(node, target, ops.resize, args["size"], scale_factor, mode, bool(args["align_corners"]),
                    recompute, scales)


@dataclass(frozen=True)
class Pad(InvarianceRule):
    """``F.pad`` on the spatial axes (MedNeXt, timm's hgnetv2 stem, user code): ``mode="constant"``
    with the value 0 puts zeros around each item (its padding filled with zeros), ``"replicate"``
    its edge values (its padding filled with them), both a one-cell window whose border is the pad,
    as ``nn.ZeroPad2d`` is. Refused: another value, ``"reflect"`` / ``"circular"`` (they read the
    item's far cells), negative pads (a crop of the canvas's border, not the item's), pads of the
    batch or channel axes, pads that are not constant ints."""

    kind = "pad"
    reads_one_map = True
    signature = staticmethod(sig._sig_pad)

    def apply(self, step: RewriteStep, node: fx.Node, args: dict[str, Any]) -> None:
        pad, mode, value, n = args["pad"], args["mode"], args["value"], step.num_axes
        if not isinstance(pad, (tuple, list)) or not all(isinstance(p, int) and not isinstance(p, bool) for p in pad):
            step.refuse(node, f"pad={pad!r} is not constant ints in the traced graph")
        if len(pad) % 2 or len(pad) > 2 * n:
            step.refuse(node, f"pad={tuple(pad)!r} pads the channel or batch axis (only the {n} spatial axes)")
        if any(p < 0 for p in pad):
            step.refuse(node, f"pad={tuple(pad)!r} crops (a negative pad cuts the canvas's border, not the item's)")
        if mode == "constant" and (value is None or isinstance(value, (int, float)) and float(value) == 0.0):
            fill = "zero"
        elif mode == "replicate":
            fill = "edge"
        else:
            step.refuse(node, f"mode={mode!r}, value={value!r} (only zeros, or mode='replicate', are what the item "
                              "alone gets around it)")
        pad = tuple(pad) + (0,) * (2 * n - len(pad))  # last axis first, (low, high) each
        lo = tuple(pad[2 * (n - 1 - a)] for a in range(n))
        hi = tuple(pad[2 * (n - 1 - a) + 1] for a in range(n))
        step.window(node, Window((1,) * n, (1,) * n, lo, hi, (1,) * n, False), fill)


# ----------------------------------------------------------------- moves and channels
@dataclass(frozen=True)
class Permute(InvarianceRule):
    """torchvision's ``Permute`` (ConvNeXt), ``torch.permute`` and ``x.permute``: a new axis order of
    the same cells (the batch axis first)."""

    kind = "permute"
    signature = staticmethod(sig._sig_permute)
    attributes = ("dims",)

    def apply(self, step: RewriteStep, node: fx.Node, args: dict[str, Any]) -> None:
        dims = args.get("dims")
        if dims is None:
            rest = tuple(args.get("rest") or ())
            dims = rest[0] if len(rest) == 1 and isinstance(rest[0], (tuple, list)) else rest
        step.permute(node, tuple(dims))

    def on_permuted(self, step: RewriteStep, node: fx.Node, args: dict[str, Any], layout: tuple[int, ...]) -> None:
        self.apply(step, node, args)


@dataclass(frozen=True)
class Repeat(InvarianceRule):
    """``x.repeat(*repeats)`` / ``x.repeat(repeats)`` over the channels only (MONAI's VNet copies its
    input over 16 channels, ``x.repeat(1, 16, 1, 1, 1)``): each output cell reads the same cell of
    the input, so it runs as it is. Refused: repeats that are not constant ints in the traced graph,
    or that are not 1 on the batch axis and every spatial axis (or add axes)."""

    kind = "repeat"
    zero_preserving = True  # a copy: zeros in the input's padding are zeros in the output's
    fresh_output = True  # always a new tensor, whose backward (a sum over the copies) never reads it
    reads_one_map = True
    signature = staticmethod(sig._sig_repeat)

    def apply(self, step: RewriteStep, node: fx.Node, args: dict[str, Any]) -> None:
        self.on_permuted(step, node, args, tuple(range(2 + step.num_axes)))

    def on_permuted(self, step: RewriteStep, node: fx.Node, args: dict[str, Any], layout: tuple[int, ...]) -> None:
        repeats = args["repeats"] if args.get("repeats") is not None else tuple(args.get("sizes") or ())
        if isinstance(repeats, (tuple, list)) and len(repeats) == 1 and isinstance(repeats[0], (tuple, list)):
            repeats = repeats[0]  # x.repeat([1, 16, 1, 1])
        if not isinstance(repeats, (tuple, list)) or not all(
                isinstance(r, int) and not isinstance(r, bool) for r in repeats):
            step.refuse(node, f"its repeats {repeats!r} are not constant ints in the traced graph (only a constant "
                              "repeat over the channels is cell-wise)")
        if len(repeats) != len(layout):
            step.refuse(node, f"repeats {tuple(repeats)!r} have {len(repeats)} entries for a feature map of "
                              f"{len(layout)} axes (more add axes in front of the batch axis)")
        touched = [d for d, (r, axis) in enumerate(zip(repeats, layout)) if axis != 1 and r != 1]
        if touched:
            where = ", ".join(f"axis {d} (the batch)" if layout[d] == 0 else f"axis {d} (spatial)" for d in touched)
            step.refuse(node, f"repeats {tuple(repeats)!r} copy the map along {where} (only a repeat over the "
                              "channels, 1 on every other axis, is cell-wise)")
        step.cell_wise(node)


@dataclass(frozen=True)
class Expand(InvarianceRule):
    """``y.expand(b, c, h, w)`` of each item's own value (a pooled ``[B, C, 1, 1]``, SENet's and
    ECA's gate) over the cells of a feature map whose sizes ``h, w`` are read from it
    (``x.size(2)``, ``x.shape[3]``): the value on every cell of that map, as alone. With ``-1`` on
    every spatial axis: cell-wise. Refused: spatial sizes that are not one map's own."""

    kind = "expand"
    reads_sizes = True  # its sizes are read from a feature map
    signature = staticmethod(sig._sig_expand)

    def apply(self, step: RewriteStep, node: fx.Node, args: dict[str, Any]) -> None:
        sizes = tuple(args.get("sizes") or ())
        if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)):
            sizes = tuple(sizes[0])
        n = step.num_axes
        if len(sizes) != 2 + n:
            step.refuse(node, f"it expands to {len(sizes)} axes, not a feature map's {2 + n}")
        if all(isinstance(v, int) and v == -1 for v in sizes[2:]):
            return step.cell_wise(node)
        target = step.size_source(sizes[2:])
        if target is None:
            step.refuse(node, f"it expands to spatial sizes {sizes[2:]!r}, not one feature map's own (use "
                              "y.expand_as(x), or x.size(2), x.size(3), ... of that map)")
        step.broadcast(node, target)


@dataclass(frozen=True)
class Transpose(InvarianceRule):
    """``torch.transpose`` / ``x.transpose(a, b)``: a permute that swaps two axes (the batch axis
    stays first), so ShuffleNet's swap of its channel groups is cell-wise."""

    kind = "transpose"
    signature = staticmethod(sig._sig_transpose)

    def apply(self, step: RewriteStep, node: fx.Node, args: dict[str, Any]) -> None:
        self.on_permuted(step, node, args, tuple(range(2 + step.num_axes)))

    def on_permuted(self, step: RewriteStep, node: fx.Node, args: dict[str, Any], layout: tuple[int, ...]) -> None:
        a, b, rank = args["dim0"], args["dim1"], len(layout)
        if not all(isinstance(d, int) and not isinstance(d, bool) and -rank <= d < rank for d in (a, b)):
            step.refuse(node, f"it swaps axes {a!r} and {b!r} of a map of {rank} axes")
        dims = list(range(rank))
        dims[a % rank], dims[b % rank] = dims[b % rank], dims[a % rank]
        step.permute(node, tuple(dims))


@dataclass(frozen=True)
class ChannelView(InvarianceRule):
    """``x.view(b, g, c // g, h, w)`` / ``reshape`` that splits or merges the channels and keeps the
    map's own spatial sizes (read from it, ``h, w = x.shape[2:]``, or -1 nowhere among them):
    ShuffleNet's channel shuffle (a view, a transpose of the channel groups, a view back), each
    cell's channels rearranged alone. Refused: any other shape (one that moves cells)."""

    kind = "view"
    reads_sizes = True  # its spatial sizes are read from the map
    signature = staticmethod(sig._sig_view)

    def apply(self, step: RewriteStep, node: fx.Node, args: dict[str, Any]) -> None:
        self.on_permuted(step, node, args, tuple(range(2 + step.num_axes)))

    def on_permuted(self, step: RewriteStep, node: fx.Node, args: dict[str, Any], layout: tuple[int, ...]) -> None:
        shape = tuple(args.get("shape") or ())
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        n = step.num_axes
        split = layout[: len(layout) - n]  # a map whose channels are one axis or split in several
        if layout[len(layout) - n:] != tuple(range(2, 2 + n)) or split[:1] != (0,) or set(split[1:]) != {1}:
            step.refuse(node, "it reshapes a map whose spatial axes were moved")
        if len(shape) < 2 + n:
            step.refuse(node, f"it reshapes a feature map to {len(shape)} axes (only the channels may be split or "
                              "merged, the spatial axes kept)")
        step.channel_view(node, shape[0], shape[1:len(shape) - n], shape[len(shape) - n:])


@dataclass(frozen=True)
class Cat(InvarianceRule):
    """``torch.cat`` / ``concat`` / ``concatenate`` along the channels: cell-wise."""

    kind = "cat"
    signature = staticmethod(sig._sig_cat)

    def apply(self, step: RewriteStep, node: fx.Node, args: dict[str, Any]) -> None:
        if not _channels_dim(args["dim"], 2 + step.num_axes):
            step.refuse(node, "it concatenates feature maps along a spatial axis")
        step.cell_wise(node)


@dataclass(frozen=True)
class Split(InvarianceRule):
    """``torch.split`` / ``chunk`` and their methods along the channels: every part on the input's
    cells."""

    kind = "split"
    signature = staticmethod(sig._sig_split)

    def apply(self, step: RewriteStep, node: fx.Node, args: dict[str, Any]) -> None:
        if not _channels_dim(args["dim"], 2 + step.num_axes):
            step.refuse(node, "it splits a feature map along a spatial axis")
        step.split(node)


@dataclass(frozen=True)
class GetItem(InvarianceRule):
    """``x[index]`` (``operator.getitem``): a part of a channel split or a channel selection."""

    kind = "getitem"

    def apply(self, step: RewriteStep, node: fx.Node, args: dict[str, Any]) -> None:
        step.getitem(node)


@dataclass(frozen=True)
class OverChannels(InvarianceRule):
    """A layer norm or linear layer over the last axis (``nn.LayerNorm`` with one normalised axis,
    ``nn.Linear``, ``F.layer_norm``, ``F.linear``): cell-wise on a permuted map whose last axis
    holds the channels; on a channels-first map the last axis is spatial: refused with ``why``.

    Args:
        why (str): the refusal on a channels-first map.
        normalized (bool): a layer norm (its ``normalized_shape`` must have one axis).
        strict (bool): on a permuted map, anything but a cell-wise run is refused with ``why`` too.
    """

    why: str
    normalized: bool = False
    strict: bool = False
    kind = "channels"
    attributes = ("normalized_shape",)

    @property
    def signature(self):  # type: ignore[override]
        return sig._sig_layer_norm if self.normalized else sig._sig_linear

    def apply(self, step: RewriteStep, node: fx.Node, args: dict[str, Any]) -> None:
        step.refuse(node, self.why)

    def on_permuted(self, step: RewriteStep, node: fx.Node, args: dict[str, Any], layout: tuple[int, ...]) -> None:
        shape = args.get("normalized_shape")
        over_last = not self.normalized or (isinstance(shape, (tuple, list)) and len(shape) == 1)
        if over_last and layout[-1] == 1:
            return step.cell_wise(node)
        if self.strict:
            step.refuse(node, self.why)
        what = "over an axis that is not the channels" if over_last else "on a feature map"
        step.refuse(node, f"it runs {what} whose axes were permuted (channels last), with no rule for it")
