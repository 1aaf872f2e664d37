"""The built-in rule types of the one table (:mod:`vispos.invariance.rules`): each states what a
module, function or method does to the cells of a padded batch, reads its arguments by name (a
module's from its attributes, a function's by its signature) and rewrites its node through the
:class:`~vispos.invariance.rules.RewriteStep`. One object serves a module and its functional twin
(``nn.Conv2d`` and ``F.conv2d``); :mod:`vispos.invariance.rules._builtin` registers them.

* **reads neighbours** (:class:`Conv`, :class:`ConvTranspose`, :class:`MaxPool`,
  :class:`AvgPool`, :class:`Interpolate`): a window; its input's padding is filled (0, ``-inf``,
  or each item's edge values) and its output gets a new geometry by convolution arithmetic;
* **per-item statistics** (:class:`Norm`, :class:`BatchNormFunction`, :class:`GroupNormFunction`,
  :class:`InstanceNormFunction`, :class:`GlobalPool`, :class:`Reduction`): over valid cells;
* **moves cells without mixing them** (:class:`Permute`, :class:`Cat`, :class:`Split`,
  :class:`GetItem`, :class:`Repeat` over the channels) and **reads the channels axis**
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
from torch import nn

from . import _functions as sig
from ..rewrite import _ops as ops
from ..cells import _upsampling as upsampling
from ._functions import window_of
from ..geometry._geometry import TransposedWindow, Window
from ._book import InvarianceRule, RewriteStep

__all__ = [
    "AlongChannels", "AvgPool", "BatchNormFunction", "Cat", "Conv", "ConvTranspose", "Expand", "GetItem", "GlobalPool",
    "GroupNormFunction", "InstanceNormFunction", "Interpolate", "MaxPool", "Norm", "OverChannels", "Pad", "Permute",
    "Reduction", "Repeat", "Split",
]


def _spatial_dims(dims: Any, rank: int, layout: tuple[int, ...] | None = None) -> bool:
    """Whether ``dims`` (an int, a sequence or None) are exactly the spatial axes of a map of
    ``rank`` axes, read through ``layout`` (a permuted map) when given."""
    if dims is None:
        return False
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    axes = [(layout[d % rank] if layout is not None else d % rank) for d in dims]
    return sorted(axes) == list(range(2, rank))


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
    output size. Refused: a constant ``size=``, ``mode="area"`` or ``antialias=True`` on the per-item
    path."""

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
        if len(scales) != n or any(isinstance(s, bool) or not isinstance(s, (int, float)) or not s > 0
                                   for s in scales):
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
        if mode == "area":
            step.refuse(node, "mode='area' to a size or by a non-integer factor (an adaptive average pool over the "
                              "canvas's bins; use an integer scale_factor, or mode='bilinear')")
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


# ------------------------------------------------------------------------- statistics
@dataclass(frozen=True)
class GlobalPool(InvarianceRule):
    """``nn.AdaptiveAvgPool*`` / ``nn.AdaptiveMaxPool*`` and their functions with output size 1:
    each item's own cells (``mode``: ``"mean"`` or ``"max"``)."""

    mode: str
    kind = "global"
    reads_one_map = True
    signature = staticmethod(sig._sig_adaptive)
    attributes = ("output_size", "return_indices")

    def apply(self, step: RewriteStep, node: fx.Node, args: dict[str, Any]) -> None:
        size = args["output_size"]
        if any(s != 1 for s in (size if isinstance(size, (tuple, list)) else (size,))):
            step.refuse(node, f"output_size={size!r} (only a global pool, output size 1, has the item's bins)")
        if args["return_indices"]:
            step.refuse(node, "return_indices=True (indices into the padded canvas differ from the item's)")
        step.global_pool(node, self.mode)


def _channels_only(dims: Any, layout: tuple[int, ...]) -> bool:
    """Whether ``dims`` (an int or a sequence of ints) name the channels axis only, read through
    ``layout`` (the channels-first axis of each tensor axis)."""
    dims = (dims,) if isinstance(dims, int) else tuple(dims) if isinstance(dims, (tuple, list)) else None
    if not dims or not all(isinstance(d, int) and not isinstance(d, bool) for d in dims):
        return False
    return {layout[d % len(layout)] for d in dims} == {1}


#: the p of a norm over space the rewrite takes over each item's cells, as its global-pool mode
_NORMS = {1: "norm:1", 2: "norm", "fro": "norm", float("inf"): "norm:inf"}


@dataclass(frozen=True)
class Reduction(InvarianceRule):
    """``torch.mean`` / ``sum`` / ``amax`` / ``amin`` / ``norm`` / ``var`` / ``std`` and their
    methods. Over every spatial axis: each item's own cells (``mode``: ``"mean"``, ``"sum"``,
    ``"max"``, ``"min"``, ``"norm"`` with ``p`` 1, 2 or inf, ``"var"`` / ``"std"`` with their
    correction). Over the channels with ``keepdim=True`` (CBAM's channel mean, a segmentation
    head's post-processing): cell-wise. Refused: a ``dtype``, another ``p``, some spatial axes only
    or the channels without ``keepdim`` (the map would lose its channel axis), each by name."""

    mode: str
    kind = "reduction"
    reads_one_map = True

    @property
    def signature(self):  # type: ignore[override]
        return {"norm": sig._sig_norm, "var": sig._sig_var, "std": sig._sig_var}.get(self.mode, sig._sig_reduce)

    def _pool_mode(self, step: RewriteStep, node: fx.Node, args: dict[str, Any]) -> str:
        """The global-pool mode of this call (refused by name where no mode is exact)."""
        if args.get("dtype") is not None:
            step.refuse(node, f"a reduction with dtype={args['dtype']!r} (cast the map before it)")
        if self.mode == "norm":
            p = args.get("p")
            try:
                mode = None if isinstance(p, bool) else _NORMS.get(p)  # 1.0 and 1 are one key
            except TypeError:  # an unhashable p
                mode = None
            if mode is None:
                step.refuse(node, f"a norm with p={p!r} over space (p = 1, 2 or inf are taken over each item's "
                                  "cells)")
            return mode
        if self.mode in ("var", "std"):
            correction, unbiased = args.get("correction"), args.get("unbiased")
            if correction is None:
                correction = 0 if unbiased is False else 1
            if not isinstance(correction, (int, float)) or isinstance(correction, bool):
                step.refuse(node, f"{self.mode} with correction={correction!r} (a constant number only)")
            return f"{self.mode}:{correction}"
        return self.mode

    def apply(self, step: RewriteStep, node: fx.Node, args: dict[str, Any]) -> None:
        self.on_permuted(step, node, args, tuple(range(2 + step.num_axes)))

    def on_permuted(self, step: RewriteStep, node: fx.Node, args: dict[str, Any], layout: tuple[int, ...]) -> None:
        dims = args["dim"]
        if args.get("out") is not None:
            step.refuse(node, f"a {self.mode} written into out= (use its result)")
        if _channels_only(dims, layout):
            if not args["keepdim"]:
                step.refuse(node, f"a {self.mode} over the channels without keepdim=True (the map would lose its "
                                  "channel axis; keep it, and squeeze it after the network)")
            if args.get("dtype") is not None:
                step.refuse(node, f"a reduction with dtype={args['dtype']!r} (cast the map before it)")
            return step.cell_wise(node)
        if not _spatial_dims(dims, len(layout), layout):
            step.refuse(node, f"a {self.mode} over dims {dims!r} (only over every spatial axis, each item's own "
                              "cells, or over the channels with keepdim=True)")
        step.global_pool(node, self._pool_mode(step, node, args), args["keepdim"])


@dataclass(frozen=True)
class AlongChannels(InvarianceRule):
    """An operation along one axis (``softmax``, ``log_softmax``; with ``reduces``: ``argmax``,
    ``argmin``, and ``torch.max`` / ``min`` with a ``dim``, whose values and indices are a pair)
    along the channels: each cell alone, cell-wise (every segmentation head's post-processing). A
    reduction keeps its channel axis (``keepdim=True``). ``torch.max(a, b)`` of two maps is
    cell-wise. Refused: along a spatial axis, or over every element.

    Args:
        reduces (bool): it removes the axis unless ``keepdim``.
        pair (bool): it returns ``(values, indices)`` (``torch.max`` / ``min`` with a ``dim``).
    """

    reduces: bool = False
    pair: bool = False
    kind = "along_channels"

    @property
    def signature(self):  # type: ignore[override]
        return sig._sig_argmax if self.reduces else sig._sig_softmax

    def apply(self, step: RewriteStep, node: fx.Node, args: dict[str, Any]) -> None:
        self.on_permuted(step, node, args, tuple(range(2 + step.num_axes)))

    def on_permuted(self, step: RewriteStep, node: fx.Node, args: dict[str, Any], layout: tuple[int, ...]) -> None:
        dim = args.get("dim")
        if self.pair and isinstance(dim, fx.Node):  # torch.max(a, b): element-wise
            return step.cell_wise(node)
        if not _channels_only(dim, layout):
            step.refuse(node, f"it runs along dim={dim!r} (only along the channels is each cell alone)")
        if self.reduces and not args.get("keepdim"):
            step.refuse(node, "it reduces the channels without keepdim=True (the map would lose its channel axis; "
                              "keep it, and squeeze it after the network)")
        if self.pair:
            return step.split(node)
        step.cell_wise(node)


@dataclass(frozen=True)
class Norm(InvarianceRule):
    """Batch, group and instance norm modules, and timm's norm + activation modules: statistics
    over valid cells (:meth:`RewriteStep.norm`).

    Args:
        activation (bool): the module applies an activation after the norm (timm's
            ``BatchNormAct2d``), whose backward may read the output: never filled in place.
    """

    activation: bool = False
    kind = "norm"
    reads_one_map = True

    @property
    def fresh_output(self) -> bool:  # type: ignore[override]
        return not self.activation

    def apply(self, step: RewriteStep, node: fx.Node, args: dict[str, Any]) -> None:
        step.norm(node)


@dataclass(frozen=True)
class BatchNormFunction(InvarianceRule):
    """``F.batch_norm``: statistics over valid cells."""

    kind = "batch_norm"
    fresh_output = True
    reads_one_map = True
    signature = staticmethod(sig._sig_batch_norm)

    def apply(self, step: RewriteStep, node: fx.Node, args: dict[str, Any]) -> None:
        step.with_padding(node, ops.batch_norm_fn, args["running_mean"], args["running_var"], args["weight"],
                          args["bias"], args["training"], args["momentum"], args["eps"])


@dataclass(frozen=True)
class GroupNormFunction(InvarianceRule):
    """``F.group_norm``: each item's statistics over its own cells."""

    kind = "group_norm"
    fresh_output = True
    reads_one_map = True
    signature = staticmethod(sig._sig_group_norm)

    def apply(self, step: RewriteStep, node: fx.Node, args: dict[str, Any]) -> None:
        step.with_padding(node, ops.group_norm, args["num_groups"], args["weight"], args["bias"], args["eps"])


@dataclass(frozen=True)
class InstanceNormFunction(InvarianceRule):
    """``F.instance_norm``: each item's statistics over its own cells (running statistics, when
    given, updated from them as torch does); with the running statistics (``use_input_stats=False``)
    each cell alone."""

    kind = "instance_norm"
    reads_one_map = True
    signature = staticmethod(sig._sig_instance_norm)

    def apply(self, step: RewriteStep, node: fx.Node, args: dict[str, Any]) -> None:
        step.with_padding(node, ops.instance_norm_fn, args["weight"], args["bias"], args["eps"], args["running_mean"],
                          args["running_var"], args["momentum"], args["use_input_stats"])


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
