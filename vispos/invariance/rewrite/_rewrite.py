"""Padding-invariant backbones: a traced graph rewritten so that every item of a padded batch gets,
on its own cells, the features it gets alone.

:func:`make_padding_invariant` walks the FX graph(s) of a backbone (torchvision's feature-extraction
graph, or a timm / any module traced by ``trace_dual``) node by node and rewrites it by the rule
book: every module, function or method call by its entry in the one table
(:mod:`vispos.invariance.rules`), its arguments bound by name:

* before every layer that reads neighbours (convolution, pooling) the input's padding is filled
  (zeros; ``-inf`` for max pooling), exactly what the layer's own padding gives the item alone;
* statistics (batch / group / instance norm, global pooling, means, L2 norms over space) are taken
  over valid cells (:mod:`vispos.invariance.rewrite._ops`);
* a permuted map (channels last) keeps its axis order; layer norms and linear layers over its
  channels are cell-wise; values read from a map's size and in-place writes are followed
  (:mod:`vispos.invariance.rewrite._values`);
* every feature map gets a geometry id; :class:`~vispos.invariance.geometry._geometry.Geometry` replays the
  convolution arithmetic on each item's box on the host, so each returned level's padding marks
  exactly the cells outside the item's own feature map.

A layer that cannot be made exact is refused when the graph is rewritten (at construction), with
its name. The rewritten graph takes one more argument, ``paddings`` (a tuple with the
:class:`~vispos.Padding` of every geometry id, or None): without it (or with None) it runs exactly
as before. :class:`~vispos.invariance.geometry._run.InvariantRunner` derives the paddings of a batch and
pairs each output with its padding.

References:
    Carion et al., DETR, ECCV 2020 (padded batches; evaluation depends on images per GPU,
    facebookresearch/detr#217 and #239); torchvision ``models/feature_extraction.py``
    (``DualGraphModule``); Liu et al., Partial Convolution based Padding, 2018.
"""

from __future__ import annotations

from typing import Any, Callable

import torch.fx as fx
from torch import Tensor
from torch.utils import _pytree as pytree

from . import _ops as ops
from . import _values as values
from ..rules import RuleBook, default_rules
from ..rules._functions import call_arguments
from ..geometry._geometry import Geometry, TransposedWindow, Window
from ._rewrite_base import RewriterBase, Split
from ..geometry._run import InvariantRunner

__all__ = ["make_padding_invariant"]


class _Rewriter(RewriterBase):
    """One pass over one graph; the :class:`~vispos.invariance.rules.RewriteStep` the rules use."""

    # ----------------------------------------------------------------------- the walk
    def run(self) -> list[Any]:
        outputs: list[Any] = []
        index = 0
        for node in self.old.nodes:
            if node.op == "placeholder":
                self.env[node] = self.copy(node)
                windows = self.inputs[index] if index < len(self.inputs) else None
                index += 1
                if windows is not None:  # a feature map: input 0, or those windows applied to it
                    geometry_id = 0
                    for window in windows:
                        geometry_id = self.geometry.child(geometry_id, window, f"the input {node.name!r}")
                    self.maps.geometry[node] = geometry_id
                    self.maps.caller_owned.add(node)
                    self.maps.from_input.add(node)
                continue
            if self.paddings_node is None:  # after every input of the original graph
                self.paddings_node = self.new.placeholder("paddings", default_value=None)
            if node.op == "output":
                leaves = list(pytree.tree_leaves(node.args[0]))
                for leaf in leaves:
                    if leaf in self.maps.layout:
                        self.refuse(leaf, "the backbone returns a feature map with permuted axes")
                outputs = [self.output_kind(n) for n in leaves]
                self.copy(node)
                continue
            if node.op == "call_module":
                self.last_path = node.target
            self.step(node)
        return outputs

    def output_kind(self, leaf: Any) -> int | str | None:
        """What one returned value is: a feature map (its geometry id), ``"item"`` (a value
        computed from the input that no longer has its spatial axes: a global pool and what follows
        it, each item's own), ``"constant"`` (a value that does not depend on the input at all), or
        None (anything else: a value read from the canvas's size, a whole split)."""
        if not isinstance(leaf, fx.Node):
            return "constant"
        geometry_id = self.maps.geometry.get(leaf)
        if geometry_id is not None:
            return geometry_id if isinstance(geometry_id, int) else None
        if leaf in self.maps.from_input:
            return None if leaf in self.maps.sizes else "item"
        seen, stack = set(), [leaf]
        while stack:  # no path from an input: the same value for any batch
            node = stack.pop()
            if node.op == "placeholder":
                return None
            for parent in node.all_input_nodes:
                if parent not in seen:
                    seen.add(parent)
                    stack.append(parent)
        return "constant"

    def step(self, node: fx.Node) -> None:
        """Rewrites one node: a read of a tensor's facts, a computation on size values, a node
        without feature maps, or a node on feature maps (by the rule book)."""
        inputs = node.all_input_nodes
        from_input = any(n in self.maps.from_input for n in inputs)
        if self.pair_field(node):
            return
        if from_input and self.reads_facts(node):
            return
        if any(n in self.maps.sizes for n in inputs):
            if from_input and self.takes_sizes(node):  # F.interpolate(x, size=skip.shape[-2:])
                self.call(node, self.spatial_args(node))
                self.maps.from_input.add(node)
                self.track_writes(node)
                return
            if from_input:
                return self.sized_features(node)
            size = values.combine_sizes(node, self.maps.sizes)
            if size is not None:
                self.maps.sizes[node] = size
            self.env[node] = self.copy(node)
            return
        spatial = self.spatial_args(node)
        if not spatial:
            self.env[node] = self.copy(node)
        else:
            self.call(node, spatial)
        if from_input:
            self.maps.from_input.add(node)
            self.track_writes(node)

    def pair_field(self, node: fx.Node) -> bool:
        """``torch.max(x, 1, keepdim=True).values`` / ``.indices``: one map of the pair a reduction
        along the channels returns, on its cells (as ``[0]`` / ``[1]``). False for any other node."""
        if node.op != "call_function" or node.target is not getattr or len(node.args) != 2:
            return False
        src, attr = node.args
        pair = self.maps.geometry.get(src)
        if not isinstance(pair, Split) or attr not in ("values", "indices"):
            return False
        self.maps.geometry[node] = pair.geometry_id
        self.env[node] = self.copy(node)
        self.maps.from_input.add(node)
        return True

    def takes_sizes(self, node: fx.Node) -> bool:
        """A call on one feature map (or on a value of each item's own) whose rule reads a size read
        from a map itself (``reads_sizes``: an interpolation to another map's size, an expand over a
        map's cells)."""
        if node.op not in ("call_module", "call_function", "call_method") or len(self.spatial_args(node)) > 1:
            return False
        rule = self.rule_of(node)[0]
        return rule is not None and rule.reads_sizes

    # ------------------------------------------------------------- RewriteStep (for rules)
    def size_source(self, value: Any) -> int | None:
        """The geometry id of the feature map whose spatial sizes ``value`` lists, in axis order
        (``skip.shape[-2:]``, ``skip.size()[2:]``, ``(skip.shape[2], skip.shape[3])``); None for any
        other value (a constant, a computed size)."""
        spatial = tuple(range(2, 2 + self.num_axes))
        if isinstance(value, fx.Node):
            size = self.maps.sizes.get(value)
            return size.geometry_id if size is not None and size.listed == spatial else None
        if isinstance(value, (tuple, list)) and len(value) == self.num_axes:
            sizes = [self.maps.sizes.get(v) if isinstance(v, fx.Node) else None for v in value]
            if all(s is not None and s.layout is None for s in sizes) and len({s.geometry_id for s in sizes}) == 1 \
                    and tuple(s.axes for s in sizes) == tuple((a,) for a in spatial):
                return sizes[0].geometry_id
        return None

    def resize(self, node: fx.Node, target: Any, fn: Callable[..., Tensor], *args: Any) -> None:
        """Replace the node by ``fn(x, padding, target_padding, *args)``: a map on the cells of
        ``target`` (a geometry id, or a window applied to the input's geometry). An input that is a
        value of each item's own (a pooled grid every item fills, PSPNet's and DeepLab's image
        pooling) gets ``padding`` None: each item resized from the whole of it to a map's cells."""
        x = self.input_of(node)
        geometry_in = self.maps.geometry.get(x)
        if not isinstance(geometry_in, int) and not (geometry_in is None and isinstance(target, int)):
            self.refuse(node, "it resizes something that is not a whole feature map")
        out = target if isinstance(target, int) else self.geometry.child(geometry_in, target, self.where(node))
        args = fx.node.map_arg(args, lambda n: self.env[n] if n.graph is self.old else n)
        padding = None if geometry_in is None else self.padding_of(geometry_in)
        self.env[node] = self.new.call_function(fn, (self.env[x], padding, self.padding_of(out), *args))
        self.maps.geometry[node] = out

    def broadcast(self, node: fx.Node, geometry_id: int) -> None:
        """The node as it is: each item's own value (or a map of the same cells) spread over the
        cells of map ``geometry_id``."""
        for n in self.spatial_args(node):
            self.geometry.require_equal(self.merge(node, [n]), geometry_id, self.where(node))
        self.maps.geometry[node] = geometry_id
        self.env[node] = self.copy(node)

    def channel_view(self, node: fx.Node, batch: Any, channels: tuple, spatial: tuple) -> None:
        """``x.view(batch, *channels, *spatial)`` of the node's map: the node as it is when
        ``spatial`` are the map's own sizes read from it and ``batch`` and ``channels`` are not read
        from a spatial size; its channels then span ``len(channels)`` axes (a layout with several
        channel axes), one again after a view back."""
        x = self.input_of(node)
        geometry_id = self.maps.geometry.get(x)
        if not isinstance(geometry_id, int):
            self.refuse(node, "it reshapes something that is not a whole feature map")
        if self.size_source(tuple(spatial)) != geometry_id and not (
                len(spatial) == 1 and self.size_source(spatial[0]) == geometry_id):
            self.refuse(node, f"it reshapes to spatial sizes {tuple(spatial)!r}, not the map's own read from it "
                              "(only the channels may be split or merged)")
        if any(isinstance(v, fx.Node) and v in self.maps.sizes for v in (batch, *channels)) or not channels:
            self.refuse(node, "it reshapes the batch or channel axes with a spatial size")
        self.env[node] = self.copy(node)
        self.maps.geometry[node] = geometry_id
        layout = (0,) + (1,) * len(channels) + tuple(range(2, 2 + self.num_axes))
        if len(channels) > 1:
            self.maps.layout[node] = layout

    def cell_wise(self, node: fx.Node, alias: bool = False) -> None:
        """Each output cell reads the same cell of its inputs: the node as it is."""
        spatial = self.spatial_args(node)
        layout = self.layout_of(spatial[0])
        for arg in pytree.tree_leaves((node.args, node.kwargs)):
            if isinstance(arg, fx.Node) and arg not in self.maps.geometry and arg.op == "get_attr":
                value = self.attribute(arg.target)
                if isinstance(value, Tensor) and value.dim() <= len(layout) and any(
                        size > 1 and layout[len(layout) - value.dim() + i] >= 2 for i, size in enumerate(value.shape)):
                    self.refuse(node, f"it adds a fixed spatial tensor {arg.target} of shape {tuple(value.shape)}")
        self.maps.geometry[node] = self.merge(node, spatial)
        self.env[node] = self.copy(node)
        if spatial[0] in self.maps.layout:
            self.maps.layout[node] = layout
        if alias and any(n in self.maps.caller_owned for n in spatial):
            self.maps.caller_owned.add(node)

    def window(self, node: fx.Node, window: Window | TransposedWindow, fill: str) -> None:
        """A convolution (``fill="zero"``) or max pool (``"max"``) on its first argument (or the
        keyword ``input``): that map's padding filled first, a new geometry for the output."""
        x = self.input_of(node)
        out, filled = self.fill_for_window(node, x, window, fill)
        args, kwargs = self.mapped(node.args), self.mapped(node.kwargs)
        if node.args:
            args = (filled, *args[1:])
        else:
            kwargs = {**kwargs, "input": filled}
        self.env[node] = self.copy(node, args=args, kwargs=kwargs)
        self.maps.geometry[node] = out
        if fill == "max" and filled is not self.env[x]:
            self.finite_padding(node, out)

    def avg_pool(self, node: fx.Node, window: Window, count_include_pad: bool, divisor: int | None) -> None:
        """Average pooling with each item's own divisor (:func:`._pools.box_avg_pool`)."""
        x = self.input_of(node)
        geometry_in = self.maps.geometry[x]
        self.maps.geometry[node] = self.geometry.child(geometry_in, window, self.where(node))
        self.env[node] = self.new.call_function(ops.avg_pool, (
            self.env[x], self.padding_of(geometry_in), window.kernel, window.stride, window.pad_lo,
            window.ceil_mode, count_include_pad, divisor))

    def global_pool(self, node: fx.Node, mode: str, keepdim: bool = True) -> None:
        """Per-item statistics over every spatial axis of the input (in any axis order): a per-item
        value ``[B, C, 1, ...]`` (``keepdim``) or ``[B, C]``."""
        x = self.input_of(node)
        padding = self.padding_of(self.maps.geometry[x])
        if len(set(self.layout_of(x))) != len(self.layout_of(x)):
            self.refuse(node, "it pools a map whose channels span several axes (view the channels back first)")
        if x in self.maps.layout:
            self.env[node] = self.new.call_function(ops.global_pool_permuted, (
                self.env[x], padding, mode, self.layout_of(x), keepdim))
            return
        self.env[node] = self.new.call_function(ops.global_pool, (
            self.env[x], padding, mode, tuple(range(2, 2 + self.num_axes)), keepdim))
        if mode == "sum":  # a sum over space that a division by the canvas's size may make a mean
            self.maps.spatial_sums[node] = (self.maps.geometry[x], keepdim)

    def with_padding(self, node: fx.Node, fn: Callable[..., Tensor], *args: Any, keeps_geometry: bool = True) -> None:
        x = self.input_of(node)
        geometry_in = self.maps.geometry[x]
        args = fx.node.map_arg(args, lambda n: self.env[n] if n.graph is self.old else n)
        self.env[node] = self.new.call_function(fn, (self.env[x], self.padding_of(geometry_in), *args))
        if keeps_geometry:
            self.maps.geometry[node] = geometry_in

    def norm(self, node: fx.Node) -> None:
        self.with_padding(node, ops.norm_module, self.module_ref(node))

    def padding_aware(self, node: fx.Node) -> None:
        if self.rules is default_rules():  # the global book's function is looked up when the graph runs
            return self.with_padding(node, ops.call_with_padding, self.module_ref(node))
        name = f"_vispos_padding_aware_{node.name}"  # a book of the caller's: its function, held by the module
        setattr(self.gm, name, self.rule_of(node)[0].fn)
        self.with_padding(node, ops.call_with_padding, self.module_ref(node), self.new.get_attr(name))

    def module_ref(self, node: fx.Node) -> fx.Node:
        """A node that reads the module ``node`` calls (for a function given to :meth:`with_padding`)."""
        return self.new.get_attr(node.target)

    def kernel_size(self, weight: Any, node: fx.Node) -> tuple[int, ...]:
        return self.kernel_of(weight, node)

    def permute(self, node: fx.Node, dims: Any) -> None:
        x = self.input_of(node)
        layout = values.compose_layout(self.layout_of(x), dims)
        if layout is None or layout[0] != 0:
            self.refuse(node, f"it permutes a feature map with dims {tuple(dims)!r} (only the batch axis first)")
        self.maps.geometry[node] = self.maps.geometry[x]
        self.env[node] = self.copy(node)
        if layout != tuple(range(2 + self.num_axes)):
            self.maps.layout[node] = layout
        if x in self.maps.caller_owned:
            self.maps.caller_owned.add(node)

    def split(self, node: fx.Node) -> None:
        """A split along the channels: every part on the input's cells."""
        x = self.input_of(node)
        if not isinstance(self.maps.geometry.get(x), int):
            self.refuse(node, "it splits something that is not a whole feature map")
        self.env[node] = self.copy(node)
        self.maps.geometry[node] = Split(self.maps.geometry[x])
        if x in self.maps.caller_owned:
            self.maps.caller_owned.add(node)

    def getitem(self, node: fx.Node) -> None:
        src, index = node.args
        geometry_id = self.maps.geometry.get(src)
        if isinstance(geometry_id, Split) and isinstance(index, int):  # one part of a channel split
            self.maps.geometry[node] = geometry_id.geometry_id
        elif isinstance(geometry_id, int) and _channel_index(index):
            self.maps.geometry[node] = geometry_id
        else:
            self.refuse(node, f"indexing a feature map with {index!r} (only channels may be selected)")
        self.env[node] = self.copy(node)
        if src in self.maps.caller_owned:  # a view of the caller's input
            self.maps.caller_owned.add(node)

    # ------------------------------------------------------------------- asking the table
    def merge(self, node: fx.Node, spatial: list[fx.Node]) -> int:
        ids = [self.maps.geometry[n] for n in spatial]
        if any(not isinstance(g, int) for g in ids):
            self.refuse(node, "it takes a whole split of a feature map")
        for g in ids[1:]:
            self.geometry.require_equal(ids[0], g, self.where(node))
        return ids[0]

    def call(self, node: fx.Node, spatial: list[fx.Node]) -> None:
        """A node on feature maps: its entry of the table, its arguments bound by name, then the
        rule's :meth:`~vispos.invariance.rules.InvarianceRule.apply` (or ``on_permuted`` for a map
        whose axes were permuted); a call without an entry is refused by name."""
        if node.op not in _NO_RULE:  # get_attr cannot take a feature map
            self.refuse(node, f"unexpected graph operation {node.op!r}")
        rule, module = self.rule_of(node)
        layouts = {self.layout_of(n) for n in spatial if n in self.maps.layout}
        if layouts and (len(layouts) > 1 or len(spatial) > 1 and any(n not in self.maps.layout for n in spatial)):
            self.refuse(node, "it combines feature maps whose axes are in different orders")
        if rule is None:
            self.refuse(node, _PERMUTED if layouts else _NO_RULE[node.op])
        if not layouts and rule.refusal() is not None:
            self.refuse(node, rule.refusal())
        args = call_arguments(rule, node, module)
        if args is None:
            self.refuse(node, "its arguments could not be read")
        if layouts:
            return rule.on_permuted(self, node, args, layouts.pop())
        if node.op == "call_module":
            if not spatial or node.args[:1] != (spatial[0],) or len(spatial) != 1:
                self.refuse(node, "its feature map is not its first argument")
        elif rule.reads_one_map and spatial and (not isinstance(args.get("input"), fx.Node) or
                                                 args["input"] not in self.maps.geometry or len(spatial) != 1):
            self.refuse(node, "its feature map is not its input")
        rule.apply(self, node, args)


_NO_RULE = {
    "call_module": "a module vispos does not know how to run on a padded batch (no rule for it; see "
                   "vispos.register_invariance_rule)",
    "call_function": "no rule for this function on a feature map",
    "call_method": "it reshapes, moves or mixes cells without a padding mask",
}
_PERMUTED = "it runs on a feature map whose axes were permuted (channels last), with no rule for it"


def _channel_index(index: Any) -> bool:
    """``x[:, a:b]`` / ``x[:, [..]]``: an index that selects channels only."""
    if not isinstance(index, tuple):
        return False
    if len(index) == 0 or index[0] != slice(None):
        return False
    return all(i == slice(None) or i is Ellipsis for i in index[2:])


def make_padding_invariant(gm: fx.GraphModule, num_axes: int, inputs: Any = None,
                           per_item: bool = False, rules: RuleBook | None = None) -> InvariantRunner:
    """Rewrites ``gm`` (both graphs of a torchvision ``DualGraphModule``) in place and returns the
    runner that feeds it paddings.

    Args:
        gm (fx.GraphModule): a traced backbone whose first input is the image batch
            ``Tensor[B, C, *S]``; its outputs must be feature maps of that input.
        num_axes (int): the number of spatial axes (2 or 3).
        inputs (sequence, optional): what each input of the graph is, in order: None (not a
            feature map), ``()`` (the input whose padding the runner is given, geometry 0) or a
            tuple of :class:`~vispos.invariance.geometry._geometry.Window` (a feature map on the cells those
            windows make of it: a ViT's tokens are one patch-sized window). Default ``[()]``: the
            first input is the image batch, the others are not feature maps.
        per_item (bool): also accept outputs that are each item's own values without spatial axes
            (a pooled classifier head, ``Tensor[B, ...]``) and outputs that do not depend on the
            input; the runner returns them as they are. Default False: every output must be a
            feature map.
        rules (RuleBook, optional): the rule book to ask. Default: the global one.

    Returns:
        InvariantRunner: derives every map's padding from a batch's and runs ``gm``.

    Raises:
        ValueError: a layer that cannot be made exact (named), or outputs that are not feature maps
            of the input.
    """
    geometry = Geometry(num_axes)
    dual = hasattr(gm, "train_graph") and hasattr(gm, "eval_graph")
    graphs = {"train": gm.train_graph, "eval": gm.eval_graph} if dual else {"any": gm.graph}
    outputs, new_graphs = {}, {}
    for mode, graph in graphs.items():
        rewriter = _Rewriter(gm, graph, geometry, num_axes, inputs, rules=rules)
        outs = rewriter.run()
        allowed = (int, str) if per_item else int
        if any(not isinstance(g, allowed) for g in outs):
            if per_item:
                raise ValueError(
                    "padding_invariant=True: every output must be a feature map of the input, a value of each "
                    "item's own (after a global pool) or a value that does not depend on the input; outputs "
                    f"{[i for i, g in enumerate(outs) if g is None]} (in pytree order) are none of these (a value "
                    "read from the size of a padded map, or a whole split)"
                )
            raise ValueError(
                "padding_invariant=True: every output of the backbone must be a feature map of its input "
                f"(got outputs without a spatial layout: {outs})"
            )
        rewriter.new.lint()
        outputs[mode], new_graphs[mode] = outs, rewriter.new
    if dual:
        gm.train_graph, gm.eval_graph = new_graphs["train"], new_graphs["eval"]
        gm.graph = gm.train_graph if gm.training else gm.eval_graph
    else:
        gm.graph = new_graphs["any"]
    gm.recompile()
    return InvariantRunner(geometry, outputs)
