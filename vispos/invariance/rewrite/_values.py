"""What a traced graph does besides computing on feature maps, as the rewrite of
:mod:`vispos.invariance.rewrite._rewrite` must see it: values read from a map's size, permuted axes and
in-place writes.

* **Sizes.** ``x.shape``, ``x.size()``, ``x.numel()`` of a feature map in a padded batch are the
  canvas's, not the item's. A value computed from them (``H * W``, ``W ** -0.5``,
  ``torch.linspace(-1, 1, x.shape[3])``) is a :class:`CanvasSize`; the rewrite refuses it where it
  reaches a computation on features, except a sum over every spatial axis divided by the map's
  own ``H * W`` (a mean), which becomes each item's count. The batch and channel sizes, the rank,
  dtype and device are the same alone and in a batch (:data:`FACTS`).
* **Layouts.** A permute of a feature map (ConvNeXt's channels-last blocks) gives a *layout*: for
  each tensor axis, the channels-first axis it holds (``(0, 2, 3, 1)`` is channels last).
* **In-place writes.** ``a.add_(1)`` after ``a``'s padding was zero-filled undoes the fill for every
  later reader of ``a``; :func:`writes_in_place` finds such nodes.

References:
    torch.fx (``Node``, ``call_method``); Liu et al., An Intriguing Failing of Convolutional Neural
    Networks and the CoordConv Solution, NeurIPS 2018 (coordinates read from the map's size).
"""

from __future__ import annotations

import inspect
import operator
from dataclasses import dataclass
from typing import Any

import torch.fx as fx
from torch import nn

__all__ = [
    "CanvasSize", "FACTS", "FACT_METHODS", "FACTORY_METHODS", "combine_sizes", "compose_layout", "index_size",
    "writes_in_place", "written_in_place",
]


@dataclass(frozen=True)
class CanvasSize:
    """A value computed from the spatial size of feature map ``geometry_id`` (a padded canvas's size).

    Attributes:
        geometry_id (int): the map's geometry id.
        axes (tuple of int, optional): channels-first axes (``>= 2``) whose sizes multiply to this
            value; None for any other value (a ramp, a power, a sum of sizes).
        layout (tuple of int, optional): for the whole ``torch.Size`` of the map (``x.shape``), the
            channels-first axis of each tensor axis; None for a number.
        listed (tuple of int, optional): for a part of that ``torch.Size`` that holds spatial sizes
            only (``x.shape[-2:]``, ``x.size()[2:]``), the channels-first axis of each entry; None
            otherwise. An interpolation to such a size resizes each item to its own size on the map.
    """

    geometry_id: int
    axes: tuple[int, ...] | None = None
    layout: tuple[int, ...] | None = None
    listed: tuple[int, ...] | None = None


#: attributes of a tensor that are the same alone and in a batch
FACTS = frozenset({"ndim", "dtype", "device", "is_cuda", "layout", "requires_grad", "is_sparse", "is_quantized",
                   "is_meta", "is_mps", "is_leaf"})
#: methods that read such facts
FACT_METHODS = frozenset({"dim", "ndimension", "get_device", "is_contiguous", "is_floating_point", "is_complex",
                          "element_size", "type"})
#: methods that make a new tensor of the given size (a per-sample draw of stochastic depth)
FACTORY_METHODS = frozenset({"new_empty", "new_zeros", "new_ones", "new_full", "new_tensor"})


def index_size(shape: CanvasSize, index: Any) -> CanvasSize | None:
    """``x.shape[index]``: a :class:`CanvasSize` for a spatial axis (its ``axes``) or a slice of
    spatial axes only (its ``listed`` axes), None (a fact) for the batch or channel size."""
    layout = shape.layout or ()
    if isinstance(index, int):
        if not -len(layout) <= index < len(layout):
            return CanvasSize(shape.geometry_id)
        axis = layout[index]
        return CanvasSize(shape.geometry_id, (axis,)) if axis >= 2 else None
    if isinstance(index, slice):
        picked = tuple(layout[i] for i in range(len(layout))[index])
        if picked and all(a >= 2 for a in picked):
            return CanvasSize(shape.geometry_id, listed=picked)
        return CanvasSize(shape.geometry_id) if any(a >= 2 for a in picked) else None
    return CanvasSize(shape.geometry_id)


def combine_sizes(node: fx.Node, sizes: dict[fx.Node, CanvasSize]) -> CanvasSize | None:
    """The size value of a node that computes on size values only (no feature in its inputs):
    a product of distinct axes of one map stays a product; an index picks an axis; anything else
    is an opaque canvas value of the first map read."""
    inputs = [n for n in node.all_input_nodes if n in sizes]
    first = sizes[inputs[0]]
    if node.op == "call_function" and node.target is operator.getitem and node.args[0] in sizes:
        whole = sizes[node.args[0]]
        if whole.layout is not None and not isinstance(node.args[1], fx.Node):
            return index_size(whole, node.args[1])
        if whole.listed is not None and not isinstance(node.args[1], fx.Node):  # ``x.shape[-2:][0]``
            return index_size(CanvasSize(whole.geometry_id, layout=whole.listed), node.args[1])
    if node.op == "call_function" and node.target is operator.mul and len(node.args) == 2:
        a, b = (sizes.get(arg) if isinstance(arg, fx.Node) else None for arg in node.args)
        if a is not None and b is not None and a.axes and b.axes and a.geometry_id == b.geometry_id:
            if not set(a.axes) & set(b.axes):
                return CanvasSize(a.geometry_id, tuple(sorted(a.axes + b.axes)))
    return CanvasSize(first.geometry_id)


def compose_layout(layout: tuple[int, ...], dims: Any) -> tuple[int, ...] | None:
    """The layout after ``permute(dims)`` of a map in ``layout`` (None: ``dims`` is not a
    permutation of the map's axes)."""
    dims = tuple(dims)
    rank = len(layout)
    if len(dims) != rank or not all(isinstance(d, int) for d in dims):
        return None
    dims = tuple(d % rank for d in dims)
    if sorted(dims) != list(range(rank)):
        return None
    return tuple(layout[d] for d in dims)


def _in_place_function(target: Any) -> bool:
    """An in-place function by Python's and torch's naming: ``operator.iadd`` (``i`` + an operator
    of the module), ``torch.relu_`` / ``F.leaky_relu_`` (a trailing underscore)."""
    name = getattr(target, "__name__", "")
    if not isinstance(name, str) or not name:
        return False
    if getattr(target, "__module__", None) in ("_operator", "operator"):
        return name.startswith("i") and getattr(operator, name, None) is target and \
            callable(getattr(operator, name[1:], None)) and getattr(operator, f"__{name}__", None) is target
    return name.endswith("_") and not name.startswith("_")


def _inplace_argument(node: fx.Node) -> bool:
    """Whether a function call passes ``inplace=True`` (by keyword or at its parameter's position)."""
    if node.kwargs.get("inplace") is True:
        return True
    try:
        parameters = list(inspect.signature(node.target).parameters)
    except (TypeError, ValueError):  # a builtin without a signature
        return False
    position = parameters.index("inplace") if "inplace" in parameters else None
    return position is not None and len(node.args) > position and node.args[position] is True


def written_in_place(node: fx.Node, module: nn.Module | None) -> fx.Node | None:
    """The node whose tensor ``node`` writes into: its ``out=`` argument, or its first argument
    for an in-place op (``x.add_(1)``, ``operator.iadd``, ``F.relu(x, inplace=True)``,
    ``nn.ReLU(inplace=True)``); None when it writes into nothing it was given."""
    out = node.kwargs.get("out")
    if isinstance(out, fx.Node):
        return out
    first = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else None
    return first if first is not None and writes_in_place(node, module) else None


def writes_in_place(node: fx.Node, module: nn.Module | None) -> bool:
    """Whether ``node`` writes into its first argument (``x.add_(1)``, ``x += y`` on a tensor
    traced as ``operator.iadd``, ``F.relu(x, inplace=True)``, ``nn.ReLU(inplace=True)``)."""
    if node.op == "call_method":
        return node.target.endswith("_") and not node.target.startswith("_") and node.target != "requires_grad_"
    if node.op == "call_module":
        return bool(getattr(module, "inplace", False))
    if node.op != "call_function":
        return False
    return _in_place_function(node.target) or _inplace_argument(node)
