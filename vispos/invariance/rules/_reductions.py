"""The built-in rule types of the one table (:mod:`vispos.invariance.rules`) for statistics: each
states what a module, function or method computes from many cells of a padded batch, and rewrites
it to take them over each item's own cells (:mod:`vispos.invariance.cells._pools`,
:mod:`vispos.invariance.cells._norms`); :mod:`vispos.invariance.rules._builtin` registers them.

* **over every spatial axis** (:class:`GlobalPool`, :class:`Reduction`): each item's mean, sum,
  extreme, norm, variance or standard deviation over its valid cells; a fixed-size adaptive pool
  over each item's own bins;
* **norms** (:class:`Norm`, :class:`BatchNormFunction`, :class:`GroupNormFunction`,
  :class:`InstanceNormFunction`): statistics over valid cells, running statistics as alone;
* **along the channels** (:class:`Reduction` with ``keepdim``, :class:`AlongChannels`): each cell
  alone, cell-wise.

References:
    ``torch.nn`` / ``torch.nn.functional`` / ``torch.Tensor`` signatures; ATen
    ``AdaptiveAveragePooling.cpp`` (``start_index`` / ``end_index``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.fx as fx

from . import _functions as sig
from ..rewrite import _ops as ops
from ._book import InvarianceRule, RewriteStep

__all__ = [
    "AlongChannels", "BatchNormFunction", "GlobalPool", "GroupNormFunction", "InstanceNormFunction", "Norm",
    "Reduction",
]


def _spatial_dims(dims: Any, rank: int, layout: tuple[int, ...] | None = None) -> bool:
    """Whether ``dims`` (an int, a sequence or None) are exactly the spatial axes of a map of
    ``rank`` axes, read through ``layout`` (a permuted map) when given."""
    if dims is None:
        return False
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    axes = [(layout[d % rank] if layout is not None else d % rank) for d in dims]
    return sorted(axes) == list(range(2, rank))


@dataclass(frozen=True)
class GlobalPool(InvarianceRule):
    """``nn.AdaptiveAvgPool*`` / ``nn.AdaptiveMaxPool*`` and their functions (``mode``:
    ``"mean"`` or ``"max"``): with output size 1 each item's own cells; with a fixed size
    (``(7, 7)`` in VGG and AlexNet) each item's own bins, an output every item fills alike (so what
    follows it, a flatten and a classifier, runs as it is). Refused: ``return_indices=True``, a
    ``None`` size."""

    mode: str
    kind = "global"
    reads_one_map = True
    signature = staticmethod(sig._sig_adaptive)
    attributes = ("output_size", "return_indices")

    def apply(self, step: RewriteStep, node: fx.Node, args: dict[str, Any]) -> None:
        size = args["output_size"]
        sizes = tuple(size) if isinstance(size, (tuple, list)) else (size,) * step.num_axes
        if args["return_indices"]:
            step.refuse(node, "return_indices=True (indices into the padded canvas differ from the item's)")
        if len(sizes) != step.num_axes or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1
                                                  for s in sizes):
            step.refuse(node, f"output_size={size!r} (a constant size >= 1 on every spatial axis; None keeps the "
                              "canvas's size)")
        if all(s == 1 for s in sizes):
            return step.global_pool(node, self.mode)
        # a fixed-size output: each item's own bins, and every item fills the output (a value of its own)
        step.with_padding(node, ops.adaptive_pool, self.mode, sizes, keeps_geometry=False)


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
    methods, ``torch.linalg.vector_norm``. Over every spatial axis: each item's own cells (``mode``: ``"mean"``, ``"sum"``,
    ``"max"``, ``"min"``, ``"norm"`` with ``p`` 1, 2 or inf, ``"var"`` / ``"std"`` with their
    correction). Over the channels with ``keepdim=True`` (CBAM's channel mean, a segmentation
    head's post-processing): cell-wise. Refused: a ``dtype``, another ``p``, some spatial axes only
    or the channels without ``keepdim`` (the map would lose its channel axis), each by name."""

    mode: str
    kind = "reduction"
    reads_one_map = True

    @property
    def signature(self):  # type: ignore[override]
        return {"norm": sig._sig_norm, "vector_norm": sig._sig_vector_norm, "var": sig._sig_var,
                "std": sig._sig_var}.get(self.mode, sig._sig_reduce)

    def _pool_mode(self, step: RewriteStep, node: fx.Node, args: dict[str, Any]) -> str:
        """The global-pool mode of this call (refused by name where no mode is exact)."""
        if args.get("dtype") is not None:
            step.refuse(node, f"a reduction with dtype={args['dtype']!r} (cast the map before it)")
        if self.mode in ("norm", "vector_norm"):
            p = args["p"] if self.mode == "norm" else args["ord"]
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


