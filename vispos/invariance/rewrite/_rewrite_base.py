"""What the graph rewrite knows about each node, and where it writes zeros into padding.

:class:`RewriterBase` holds the state of one pass over one traced graph: each feature map's
geometry id and axis order, the values read from a map's size, and which maps hold zeros in their
padding. It fills a map's padding before a window reads it: in place, right after the layer that
made the map (a convolution, a norm or a sum, whose backward never reads its output) and ahead of
activations that keep zeros zero, so the convolution after them needs no copy; or, where the map
was written in place since, at the reader's time. :mod:`vispos.invariance.rewrite._rewrite` adds the
node handlers.

References:
    torch.fx (``Graph``, ``Node``); Liu et al., Partial Convolution based Padding, 2018.
"""

from __future__ import annotations

import contextlib
import contextvars
import operator
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
import torch.fx as fx
from torch import Tensor
from torch.utils import _pytree as pytree

from ... import _deprecation
from . import _ops as ops
from . import _values as values
from ..geometry._geometry import Geometry, TransposedWindow, Window
from ..rules import InvarianceRule, RuleBook, as_book
from ..rules._sized import CANVAS_SIZE

__all__ = ["NETWORK_ADVICE", "RewriterBase", "Split", "refusal_voice"]

#: what a backbone adapter (``padding_invariant=True``) tells its user to do about a refused layer
BACKBONE_ADVICE = (
    "Cut the backbone before this layer (return_nodes naming an earlier node), register an exact rule for it "
    "(vispos.register_invariance_rule), or use padding_invariant=False (DETR's behaviour)")
#: what make_padding_invariant tells its user to do about a refused layer
NETWORK_ADVICE = (
    "Cut the network before this layer (make_padding_invariant(..., return_nodes=[an earlier node]; "
    "torchvision.models.feature_extraction.get_graph_node_names lists them)), register an exact rule for it "
    "(vispos.register_invariance_rule, or rules= with a RuleBook of your own), or write it with layers the rule "
    "book knows")
#: (who refuses, what to do), for the messages of a refused layer
_VOICE: contextvars.ContextVar[tuple[str, str]] = contextvars.ContextVar(
    "vispos_refusal_voice", default=("padding_invariant=True", BACKBONE_ADVICE))


@contextlib.contextmanager
def refusal_voice(who: str, advice: str) -> Iterator[None]:
    """Meanwhile (in this thread or task), a refused layer's message opens with ``who`` and ends
    with ``advice`` (default: a backbone adapter's ``padding_invariant=True`` and its advice)."""
    token = _VOICE.set((who, advice))
    try:
        yield
    finally:
        _VOICE.reset(token)


def voice() -> tuple[str, str]:
    """``(who, advice)`` of the current refusal messages (see :func:`refusal_voice`)."""
    return _VOICE.get()

_NEG_INF = float("-inf")


class Split:
    """The geometry of the parts of a channel split (``chunk`` / ``split`` along channels): the
    input's, for every part."""

    __slots__ = ("geometry_id",)

    def __init__(self, geometry_id: int) -> None:
        self.geometry_id = geometry_id


@dataclass
class _Maps:
    """What each node of the old graph is: a feature map (its geometry id, or a :class:`Split`;
    its axis order when permuted), a value computed from the input, or a value read from a map's
    size."""

    geometry: dict[fx.Node, Any] = field(default_factory=dict)
    layout: dict[fx.Node, tuple[int, ...]] = field(default_factory=dict)
    from_input: set[fx.Node] = field(default_factory=set)
    caller_owned: set[fx.Node] = field(default_factory=set)  # may be the caller's own input tensor
    sizes: dict[fx.Node, values.CanvasSize] = field(default_factory=dict)
    spatial_sums: dict[fx.Node, tuple[int, bool]] = field(default_factory=dict)  # (geometry id, keepdim)


@dataclass
class _Zeros:
    """Which maps hold zeros (and no negative value) in their padding, and which storages were
    written in place by an op that does not keep zeros zero."""

    zeroed: set[fx.Node] = field(default_factory=set)
    nonneg: set[fx.Node] = field(default_factory=set)
    storage: dict[fx.Node, fx.Node] = field(default_factory=dict)  # view / in-place result -> maker
    overwritten: set[fx.Node] = field(default_factory=set)

    def owner(self, node: fx.Node) -> fx.Node:
        return self.storage.get(node, node)


class RewriterBase:
    """State and helpers of one pass over one graph (see the module docstring)."""

    n_spatial = _deprecation.renamed_attribute("n_spatial", "num_axes")

    def __init__(self, gm: fx.GraphModule, graph: fx.Graph, geometry: Geometry, num_axes: int,
                 inputs: Any = None, rules: RuleBook | None = None) -> None:
        self.gm, self.old, self.geometry, self.num_axes = gm, graph, geometry, num_axes
        self.rules = as_book(rules)
        self._keeps_zero: dict[fx.Node, bool] = {}
        self.inputs = ((),) if inputs is None else tuple(inputs)  # per placeholder: windows from input 0
        self.new = fx.Graph(tracer_cls=graph._tracer_cls)
        self.env: dict[fx.Node, fx.Node] = {}
        self.maps = _Maps()
        self.zeros = _Zeros()
        self.paddings_node: fx.Node | None = None
        self.padding_nodes: dict[int, fx.Node] = {}
        self.last_path = "the input"

    # ------------------------------------------------------------------------------ helpers
    def where(self, node: fx.Node) -> str:
        """The layer a node belongs to: the module it calls, the module it was traced in, the owner
        of a parameter it reads (a functional convolution), or the module before it."""
        if node.op == "call_module":
            return f"{node.target} ({type(self.gm.get_submodule(node.target)).__name__})"
        target = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", str(node.target))
        path = node.meta.get("vispos_path")
        if not path:
            owners = [a.target.rpartition(".")[0] for a in node.all_input_nodes if a.op == "get_attr"]
            path = owners[0] if owners and owners[0] else f"the layer after {self.last_path}"
        return f"{target} in {path} (graph node {node.name!r})"

    def refuse(self, node: fx.Node, why: str) -> None:
        who, advice = voice()
        raise ValueError(f"{who} cannot run {self.where(node)} exactly on a padded batch: {why}. {advice}")

    def padding_of(self, geometry_id: int) -> fx.Node:
        """The node holding the :class:`~vispos.Padding` of geometry ``geometry_id`` (made once,
        right after the inputs)."""
        if geometry_id not in self.padding_nodes:
            with self.new.inserting_after(self.paddings_node):
                self.padding_nodes[geometry_id] = self.new.call_function(
                    ops.padding_at, (self.paddings_node, geometry_id))
        return self.padding_nodes[geometry_id]

    def spatial_args(self, node: fx.Node) -> list[fx.Node]:
        found: list[fx.Node] = []
        fx.node.map_arg((node.args, node.kwargs), lambda n: found.append(n) if n in self.maps.geometry else None)
        return found

    def copy(self, node: fx.Node, args=None, kwargs=None) -> fx.Node:
        new = self.new.node_copy(node, lambda n: self.env[n])
        if args is not None:
            new.args = args
        if kwargs is not None:
            new.kwargs = kwargs
        return new

    def rule_of(self, node: fx.Node) -> tuple[InvarianceRule | None, Any]:
        """The table's rule for what ``node`` calls, and the module it calls (None for a function
        or method)."""
        module = self.gm.get_submodule(node.target) if node.op == "call_module" else None
        return self.rules.rule_for_call(node.op, node.target, module), module

    def keeps_zero(self, node: fx.Node, rule: InvarianceRule | None) -> bool:
        """The call of ``node`` maps a zero cell to zero: its rule says so for the class
        (``zero_preserving``) and the call itself, with its own attributes and constant arguments
        (``nn.Hardtanh(0.5, 2)``, ``F.hardtanh(x, 0.5, 2)``, ``nn.Threshold(0.1, 20)``), gives 0
        on a zero input. Run once per node on a one-cell map (the module's ``forward``, so no hook
        runs); a call that cannot run on it counts as not keeping zeros."""
        if rule is None or not rule.zero_preserving:
            return False
        known = self._keeps_zero.get(node)
        if known is None:
            known = self._keeps_zero[node] = self._zero_at_zero(node)
        return known

    def _zero_at_zero(self, node: fx.Node) -> bool:
        rest, kwargs = node.args[1:], dict(node.kwargs)
        constants = fx.node.map_arg((rest, kwargs), lambda n: n)
        if any(isinstance(a, fx.Node) for a in pytree.tree_leaves(constants)):
            return False  # another map or a computed value: not a fixed function of one cell
        module = self.gm.get_submodule(node.target) if node.op == "call_module" else None
        tensors = [] if module is None else [t for t in module.parameters()] + [t for t in module.buffers()]
        dtype = next((t.dtype for t in tensors if t.is_floating_point()), torch.float64)
        sizes = {1} | {t.numel() for t in tensors if t.dim() == 1}
        for channels in sorted(sizes):
            zero = torch.zeros((1, channels) + (1,) * self.num_axes, dtype=dtype)
            try:
                with torch.no_grad():
                    if module is not None:
                        out = module.forward(zero, *rest, **kwargs)
                    elif node.op == "call_method":
                        out = getattr(zero, node.target)(*rest, **kwargs)
                    else:
                        out = node.target(zero, *rest, **kwargs)
            except Exception:  # noqa: BLE001 - another shape may fit (a per-channel parameter)
                continue
            return isinstance(out, Tensor) and out.shape == zero.shape and not bool(out.ne(0).any())
        return False

    @staticmethod
    def input_of(node: fx.Node) -> Any:
        """The node's feature map: its first argument, or the keyword ``input``."""
        return node.args[0] if node.args else node.kwargs["input"]

    def mapped(self, value: Any) -> Any:
        return fx.node.map_arg(value, lambda n: self.env[n])

    def layout_of(self, node: fx.Node) -> tuple[int, ...]:
        return self.maps.layout.get(node, tuple(range(2 + self.num_axes)))

    def attribute(self, target: str) -> Any:
        value = self.gm
        for part in target.split("."):
            value = getattr(value, part)
        return value

    def kernel_of(self, weight: Any, node: fx.Node) -> tuple[int, ...]:
        """The kernel size of a functional convolution from its weight (a get_attr, possibly
        reshaped by weight standardisation)."""
        seen = weight
        while isinstance(seen, fx.Node):
            if seen.op == "get_attr":
                value = self.attribute(seen.target)
                if isinstance(value, Tensor) and value.dim() == 2 + self.num_axes:
                    return tuple(int(k) for k in value.shape[2:])
                break
            seen = seen.args[0] if seen.args else None
        self.refuse(node, "its kernel size cannot be read from the graph")
        raise AssertionError  # unreachable

    # -------------------------------------------------------------------------------- fills
    def fill_for_window(self, node: fx.Node, x: fx.Node, window: Window | TransposedWindow,
                        fill: str) -> tuple[int, fx.Node]:
        """Zeros (``fill="zero"``) or ``-inf`` (``"max"``) in ``x``'s padding before a window that
        reads neighbours, or each item's edge values (``"edge"``, before a linear up-sampling).
        Returns the output's geometry id and the node the window must read."""
        geometry_in = self.maps.geometry[x]
        out = self.geometry.child(geometry_in, window, self.where(node))
        zeros = self.zeros
        if fill == "edge":  # a copy for the linear up-sampling alone, as for a max pool
            return out, self.new.call_function(ops.fill_edges, (self.env[x], self.padding_of(geometry_in)))
        if not window.reads_neighbours:
            return out, self.env[x]
        if x in zeros.zeroed and (fill == "zero" or x in zeros.nonneg):
            return out, self.env[x]
        if self.zero_at_producer(x, need_nonneg=fill == "max"):
            return out, self.env[x]
        padding = self.padding_of(geometry_in)
        if fill == "zero":
            may_write = x not in self.maps.caller_owned
            self.env[x] = self.new.call_function(ops.fill, (self.env[x], padding, 0.0, may_write))
            self.maps.caller_owned.discard(x)
            zeros.zeroed.add(x)
            return out, self.env[x]
        # a copy for the max pool alone: -inf must not reach a layer that reads x without a fill
        return out, self.new.call_function(ops.fill, (self.env[x], padding, _NEG_INF, False))

    def zero_at_producer(self, x: fx.Node, need_nonneg: bool) -> bool:
        """Writes zeros into the padding right after the layer that made ``x`` (through activations
        that map 0 to 0), when that layer's backward does not read its output and nothing wrote
        into it since. With ``need_nonneg`` (a max pool) one of the activations must be a ReLU:
        its window then has a valid cell >= 0, and a 0 in the padding never wins over it, as
        ``-inf`` would not."""
        chain, cur, nonneg = [], x, False
        while True:
            rule = self.rule_of(cur)[0] if cur.op in ("call_module", "call_function", "call_method") else None
            zero = self.keeps_zero(cur, rule)
            positive = zero and rule.nonnegative
            inputs = [a for a in cur.all_input_nodes if a in self.maps.geometry]
            if not zero or len(inputs) != 1 or cur.args[:1] != (inputs[0],):
                break
            chain.append(cur)
            nonneg |= positive
            cur = inputs[0]
        if need_nonneg and not nonneg:
            return False
        if cur in self.maps.caller_owned or not self.output_is_writable(cur):
            return False
        if any(self.zeros.owner(n) in self.zeros.overwritten for n in chain + [cur]):
            return False  # written in place since it was made: a fill there would be undone
        made = self.env[cur]
        if made.op == "call_function" and made.target is ops.norm_module and len(made.args) == 3:
            made.args = (*made.args, True)  # the norm writes the zeros in the same call
        else:
            with self.new.inserting_after(made):
                self.new.call_function(ops.fill_in_place, (made, self.padding_of(self.maps.geometry[cur]), 0.0))
        self.zeros.zeroed.update(chain + [cur])
        if nonneg:
            self.zeros.nonneg.add(x)
        return True

    def output_is_writable(self, node: fx.Node) -> bool:
        """A new map whose maker's backward does not read it (a fill may write into it): the
        table's ``fresh_output`` fact of what made it."""
        if node.op not in ("call_module", "call_function"):
            return False
        rule = self.rule_of(node)[0]
        return rule is not None and rule.fresh_output

    def finite_padding(self, node: fx.Node, geometry_id: int) -> None:
        """Zeros in a max pool's output padding, where windows of padding alone gave ``-inf``: no
        layer without a fill (a 1x1 convolution) may read a non-finite value, whose product with
        the zero gradient of a padded cell would be NaN in the weights' gradient."""
        self.env[node] = self.new.call_function(ops.fill, (self.env[node], self.padding_of(geometry_id), 0.0, True))
        self.zeros.zeroed.add(node)

    def track_writes(self, node: fx.Node) -> None:
        """Follows storages through views and in-place ops: an in-place write that does not keep
        zeros zero (``a.add_(1)``) undoes every fill of that storage's padding, so the next window
        that reads it fills again, at its own time (never at the producer, before the write)."""
        module = self.gm.get_submodule(node.target) if node.op == "call_module" else None
        written = values.written_in_place(node, module)
        first = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else None
        zeros = self.zeros
        if first is not None and first in self.maps.from_input and (
                written is first or node in self.maps.caller_owned or node in self.maps.layout or (
                    node.op == "call_function" and node.target is operator.getitem) or isinstance(
                    self.maps.geometry.get(node), Split)):
            zeros.storage[node] = zeros.owner(first)
        if written is not None and written is not first:  # ``out=``: the result is that tensor
            zeros.storage[node] = zeros.owner(written)
        rule = self.rule_of(node)[0] if node.op in ("call_module", "call_function", "call_method") else None
        if written is not None and written in self.maps.from_input and (
                written is not first or not self.keeps_zero(node, rule)):
            owner = zeros.owner(written)
            zeros.overwritten.add(owner)
            zeros.zeroed = {n for n in zeros.zeroed if zeros.owner(n) != owner}
            zeros.nonneg = {n for n in zeros.nonneg if zeros.owner(n) != owner}

    # ------------------------------------------------------------------------------- sizes
    def reads_facts(self, node: fx.Node) -> bool:
        """A read of a tensor's facts: its size (a :class:`~._values.CanvasSize` for a spatial
        axis of a feature map), rank, dtype, device, or a new tensor of a given size. Returns
        False for any other node."""
        args, maps = node.args, self.maps
        if node.op == "call_function" and node.target is getattr:
            src, attr = args[0], args[1]
            if attr == "shape":
                if isinstance(maps.geometry.get(src), int):
                    maps.sizes[node] = values.CanvasSize(maps.geometry[src], layout=self.layout_of(src))
            elif attr not in values.FACTS:
                self.refuse(node, f"it reads the attribute {attr!r} of a feature map")
        elif node.op == "call_method" and args and args[0] in maps.from_input:
            name, src = node.target, args[0]
            spatial = isinstance(maps.geometry.get(src), int)
            if name == "size" and spatial:
                dim = args[1] if len(args) > 1 else node.kwargs.get("dim")
                whole = values.CanvasSize(maps.geometry[src], layout=self.layout_of(src))
                size = whole if dim is None else values.index_size(whole, dim)
                if size is not None:
                    maps.sizes[node] = size
            elif name == "numel" and spatial:
                maps.sizes[node] = values.CanvasSize(maps.geometry[src])
            elif name in values.FACTORY_METHODS:
                if any(n in maps.sizes for n in node.all_input_nodes):
                    return False
            elif name not in values.FACT_METHODS and name not in ("size", "numel"):
                return False
        else:
            return False
        self.env[node] = self.copy(node)
        return True

    def sized_features(self, node: fx.Node) -> None:
        """A computation on features with a value read from a map's size: the book's sized rule
        for it (:meth:`~vispos.invariance.RuleBook.register_sized`; built in: a sum over every
        spatial axis divided by the map's own ``H * W``, ``* D``, becomes each item's mean);
        without one, refused."""
        rule = self.rules.sized_rule(node.op, node.target)
        if rule is None:
            self.refuse(node, CANVAS_SIZE)
        rule.apply(self, node, {})

    def mean_of_spatial_sum(self, node: fx.Node, total: Any, size: Any) -> bool:
        """Rewrites ``node`` (``total / size``) to each item's mean when ``total`` is a sum over
        every spatial axis of a map and ``size`` that map's own spatial size; False otherwise."""
        summed = self.maps.spatial_sums.get(total) if isinstance(total, fx.Node) else None
        canvas = self.maps.sizes.get(size) if isinstance(size, fx.Node) else None
        if summed is None or canvas is None or canvas.geometry_id != summed[0] or \
                canvas.axes != tuple(range(2, 2 + self.num_axes)):
            return False
        geometry_id, keepdim = summed
        self.env[node] = self.new.call_function(
            ops.per_item_mean, (self.env[total], self.padding_of(geometry_id), self.env[size], keepdim))
        self.maps.from_input.add(node)
        return True
