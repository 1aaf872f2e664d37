"""Padding-invariant backbones: a traced graph rewritten so that every item of a padded batch gets,
on its own cells, the features it gets alone.

:func:`make_padding_invariant` walks the FX graph(s) of a backbone (torchvision's feature-extraction
graph, or a timm / any module traced by :func:`trace_dual`) node by node, with the rules of
:mod:`vispos.backbones._invariant_rules`, and rewrites it:

* before every layer that reads neighbours (convolution, pooling) the input's padding is filled
  (zeros; ``-inf`` for max pooling), exactly what the layer's own padding gives the item alone;
* statistics (batch norm in training, group / instance norm, global pooling and means over space,
  squeeze-excitation) are taken over valid cells (:mod:`vispos._masked_layers`);
* every feature map gets a geometry id; :class:`~vispos.backbones._geometry.Geometry` replays the
  convolution arithmetic on each item's box on the host, so each returned level's padding marks
  exactly the cells outside the item's own feature map.

A layer that cannot be made exact is refused when the graph is rewritten (at construction), with
its name. The rewritten graph takes one more argument, ``paddings`` (a tuple with the
:class:`~vispos.Padding` of every geometry id, or None): without it (or with None) it runs exactly
as before. :class:`InvariantRunner` derives the paddings of a batch and pairs each output with its
padding. A zero fill is written in place into the output of the layer that made the map (a
convolution, a norm or a sum, whose backward never reads its output), ahead of the activations
that keep zeros zero, so the convolution after them needs no copy of its input.

References:
    Carion et al., DETR, ECCV 2020 (padded batches; evaluation depends on images per GPU,
    facebookresearch/detr issues 217 and 239); torchvision ``models/feature_extraction.py``
    (``DualGraphModule``); Liu et al., Partial Convolution based Padding, 2018.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx
from torch import Tensor, nn
from torch.utils import _pytree as pytree

from . import _invariant_ops as ops
from . import _invariant_rules as rules
from . import _invariant_values as values
from ._geometry import Geometry, Window
from ._invariant_run import InvariantRunner

__all__ = ["make_padding_invariant"]

_NEG_INF = float("-inf")


class _Rewriter:
    """One pass over one graph (see the module docstring)."""

    def __init__(self, gm: fx.GraphModule, graph: fx.Graph, geometry: Geometry, n_spatial: int) -> None:
        self.gm, self.old, self.geometry, self.n = gm, graph, geometry, n_spatial
        self.new = fx.Graph(tracer_cls=graph._tracer_cls)
        self.env: dict[fx.Node, fx.Node] = {}
        self.gid: dict[fx.Node, Any] = {}  # int, or _Split (channel split); absent: not a feature map
        self.alias: set[fx.Node] = set()  # nodes whose value may be the caller's input
        self.paddings_node: fx.Node | None = None
        self.padding_nodes: dict[int, fx.Node] = {}
        self.needed: set[int] = set()
        self.zeroed: set[fx.Node] = set()  # old nodes whose value has zeros in its padding
        self.nonneg: set[fx.Node] = set()  # ... and no negative value (after a ReLU)
        self.pool_input: fx.Node | None = None
        self.last_path = "the input"
        self.data: set[fx.Node] = set()  # values computed from the input (maps, per-item vectors)
        self.sizes: dict[fx.Node, values.CanvasSize] = {}  # values read from a map's (canvas) size
        self.sums: dict[fx.Node, tuple[int, bool]] = {}  # sums over every spatial axis: (gid, keepdim)
        self.layout: dict[fx.Node, tuple[int, ...]] = {}  # permuted maps: channels-first axis per axis
        self.storage: dict[fx.Node, fx.Node] = {}  # a view or in-place result -> the node that made it
        self.overwritten: set[fx.Node] = set()  # storages written in place by a non zero-preserving op

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
        raise ValueError(
            f"padding_invariant=True cannot run {self.where(node)} exactly on a padded batch: {why}. "
            "Use padding_invariant=False (DETR's behaviour), or a backbone without this layer"
        )

    def mask(self, gid: int) -> fx.Node:
        """The node of geometry ``gid``'s Padding (made once, right after the inputs)."""
        if gid not in self.padding_nodes:
            self.needed.add(gid)
            with self.new.inserting_after(self.paddings_node):
                self.padding_nodes[gid] = self.new.call_function(ops.padding_at, (self.paddings_node, gid))
        return self.padding_nodes[gid]

    def spatial_args(self, node: fx.Node) -> list[fx.Node]:
        found: list[fx.Node] = []
        fx.node.map_arg((node.args, node.kwargs), lambda n: found.append(n) if n in self.gid else None)
        return found

    def copy(self, node: fx.Node, args=None, kwargs=None) -> fx.Node:
        new = self.new.node_copy(node, lambda n: self.env[n])
        if args is not None:
            new.args = args
        if kwargs is not None:
            new.kwargs = kwargs
        return new

    def mapped(self, value: Any) -> Any:
        return fx.node.map_arg(value, lambda n: self.env[n])

    def windowed(self, node: fx.Node, x: fx.Node, window: Window, fill: str | None) -> tuple[int, bool]:
        """Zeros (``fill="zero"``) or ``-inf`` (``"max"``) in ``x``'s padding before a window that
        reads neighbours. Returns the output's geometry id and whether ``-inf`` was written."""
        gid_in = self.gid[x]
        out = self.geometry.child(gid_in, window, self.where(node))
        if fill is None or not window.reads_neighbours:
            return out, False
        if x in self.zeroed and (fill == "zero" or x in self.nonneg):
            return out, False
        if self.zero_at_producer(x, need_nonneg=fill == "max"):
            return out, False
        if fill == "zero":
            self.env[x] = self.new.call_function(ops.fill, (self.env[x], self.mask(gid_in), 0.0, x not in self.alias))
            self.alias.discard(x)
            self.zeroed.add(x)
            return out, False
        # a copy for the max pool alone: -inf must not reach a layer that reads x without a fill
        self.pool_input = self.new.call_function(ops.fill, (self.env[x], self.mask(gid_in), _NEG_INF, False))
        return out, True

    def zero_at_producer(self, x: fx.Node, need_nonneg: bool) -> bool:
        """Writes zeros into the padding right after the layer that made ``x`` (through activations
        that map 0 to 0), when that layer's backward does not read its output. With
        ``need_nonneg`` (a max pool) one of the activations must be a ReLU: its window then has a
        valid cell >= 0, and a 0 in the padding never wins over it, as ``-inf`` would not."""
        chain, cur, nonneg = [], x, False
        while True:
            module = self.gm.get_submodule(cur.target) if cur.op == "call_module" else None
            zero, positive = rules.zero_preserving(cur.op, cur.target, module)
            inputs = [a for a in cur.all_input_nodes if a in self.gid]
            if not zero or len(inputs) != 1 or cur.args[:1] != (inputs[0],):
                break
            chain.append(cur)
            nonneg |= positive
            cur = inputs[0]
        if need_nonneg and not nonneg:
            return False
        if cur in self.alias or not self.fresh(cur):
            return False
        if any(self.storage.get(n, n) in self.overwritten for n in chain + [cur]):
            return False  # written in place since it was made: a fill there would be undone
        with self.new.inserting_after(self.env[cur]):
            self.new.call_function(ops.fill_in_place, (self.env[cur], self.mask(self.gid[cur]), 0.0))
        self.zeroed.update(chain + [cur])
        if nonneg:
            self.nonneg.add(x)
        return True

    def fresh(self, node: fx.Node) -> bool:
        """A new map whose maker's backward does not read it (a fill may write into it)."""
        if node.op == "call_module":
            kind = rules.classify_module(self.gm.get_submodule(node.target), self.n)[0]
            return kind in ("conv", "batch_norm", "group_norm", "instance_norm")
        if node.op == "call_function":
            return node.target in rules.FRESH_FUNCTIONS
        return False

    def finite_padding(self, node: fx.Node, gid: int) -> None:
        """Zeros in a max pool's output padding, where windows of padding alone gave ``-inf``: no
        layer without a fill (a 1x1 convolution) may read a non-finite value, whose product with
        the zero gradient of a padded cell would be NaN in the weights' gradient."""
        self.env[node] = self.new.call_function(ops.fill, (self.env[node], self.mask(gid), 0.0, True))
        self.zeroed.add(node)

    def kernel_of(self, weight: Any, node: fx.Node) -> tuple[int, ...]:
        """The kernel size of a functional convolution from its weight (a get_attr, possibly
        reshaped by weight standardisation)."""
        seen = weight
        while isinstance(seen, fx.Node):
            if seen.op == "get_attr":
                value = self.gm
                for part in seen.target.split("."):
                    value = getattr(value, part)
                if isinstance(value, Tensor) and value.dim() == 2 + self.n:
                    return tuple(int(k) for k in value.shape[2:])
                break
            seen = seen.args[0] if seen.args else None
        self.refuse(node, "its kernel size cannot be read from the graph")
        raise AssertionError  # unreachable

    # ------------------------------------------------------------------------------- nodes
    def run(self) -> list[Any]:
        outputs: list[Any] = []
        first = True
        for node in self.old.nodes:
            if node.op == "placeholder":
                self.env[node] = self.copy(node)
                if first:
                    self.gid[node] = 0
                    self.alias.add(node)
                    self.data.add(node)
                    first = False
                continue
            if self.paddings_node is None:  # after every input of the original graph
                self.paddings_node = self.new.placeholder("paddings", default_value=None)
            if node.op == "output":
                leaves = [n for n in pytree.tree_leaves(node.args[0])]
                for leaf in leaves:
                    if leaf in self.layout:
                        self.refuse(leaf, "the backbone returns a feature map with permuted axes")
                outputs = [self.gid.get(n) if isinstance(n, fx.Node) else None for n in leaves]
                self.copy(node)
                continue
            if node.op == "call_module":
                self.last_path = node.target
            self.step(node)
        return outputs

    def step(self, node: fx.Node) -> None:
        """Rewrites one node: a read of a tensor's facts, a computation on size values, a node
        without feature maps, or a node on feature maps (by the rule book)."""
        inputs = node.all_input_nodes
        from_data = any(n in self.data for n in inputs)
        if from_data and self.reads_facts(node):
            return
        sized = [n for n in inputs if n in self.sizes]
        if sized:
            if from_data:
                return self.sized_features(node)
            size = values.combine_sizes(node, self.sizes)
            if size is not None:
                self.sizes[node] = size
            self.env[node] = self.copy(node)
            return
        spatial = self.spatial_args(node)
        if not spatial:
            self.env[node] = self.copy(node)
        elif any(n in self.layout for n in spatial):
            self.permuted(node, spatial)
        else:
            handler = {"call_module": self.module, "call_function": self.function,
                       "call_method": self.method}.get(node.op)
            if handler is None:  # get_attr cannot take a feature map
                self.refuse(node, f"unexpected graph operation {node.op!r}")
            handler(node, spatial)
        if from_data:
            self.data.add(node)
            self.track_writes(node)

    # ------------------------------------------------------- sizes, layouts, in-place writes
    def reads_facts(self, node: fx.Node) -> bool:
        """A read of a tensor's facts: its size (a :class:`~._invariant_values.CanvasSize` for a
        spatial axis of a feature map), rank, dtype, device, or a new tensor of a given size.
        Returns False for any other node."""
        args = node.args
        if node.op == "call_function" and node.target is getattr:
            src, attr = args[0], args[1]
            if attr == "shape":
                if isinstance(self.gid.get(src), int):
                    self.sizes[node] = values.CanvasSize(self.gid[src], layout=self.layout_of(src))
            elif attr not in values.FACTS:
                self.refuse(node, f"it reads the attribute {attr!r} of a feature map")
        elif node.op == "call_method" and args and args[0] in self.data:
            name, src = node.target, args[0]
            spatial = isinstance(self.gid.get(src), int)
            if name == "size" and spatial:
                dim = args[1] if len(args) > 1 else node.kwargs.get("dim")
                whole = values.CanvasSize(self.gid[src], layout=self.layout_of(src))
                size = whole if dim is None else values.index_size(whole, dim)
                if size is not None:
                    self.sizes[node] = size
            elif name == "numel" and spatial:
                self.sizes[node] = values.CanvasSize(self.gid[src])
            elif name in values.FACTORY_METHODS:
                if any(n in self.sizes for n in node.all_input_nodes):
                    return False
            elif name not in values.FACT_METHODS and name not in ("size", "numel"):
                return False
        else:
            return False
        self.env[node] = self.copy(node)
        return True

    def sized_features(self, node: fx.Node) -> None:
        """A computation on features with a value read from a map's size: a sum over every
        spatial axis divided by the map's own ``H * W`` (``* D``) becomes each item's mean; anything
        else is refused."""
        if len(node.args) == 2 and not node.kwargs and (
                (node.op == "call_function" and node.target in (operator.truediv, torch.div, torch.true_divide))
                or (node.op == "call_method" and node.target in ("div", "true_divide"))):
            total, size = node.args
            summed, canvas = self.sums.get(total), self.sizes.get(size)
            if summed is not None and canvas is not None and canvas.gid == summed[0] and \
                    canvas.axes == tuple(range(2, 2 + self.n)):
                gid, keepdim = summed
                self.env[node] = self.new.call_function(
                    ops.per_item_mean, (self.env[total], self.mask(gid), self.env[size], keepdim))
                self.data.add(node)
                return
        self.refuse(node, (
            "it computes on features with a value read from the size of a feature map (x.shape, "
            "x.size(), x.numel()), which on a padded batch is the canvas's size, not the item's; only "
            "a sum over every spatial axis divided by that map's own H * W is rewritten (to each item's "
            "mean). Compute the value from a fixed hyper-parameter, or use x.mean over the spatial axes"))

    def layout_of(self, node: fx.Node) -> tuple[int, ...]:
        return self.layout.get(node, tuple(range(2 + self.n)))

    def track_writes(self, node: fx.Node) -> None:
        """Follows storages through views and in-place ops: an in-place write that does not keep
        zeros zero (``a.add_(1)``) undoes every fill of that storage's padding, so the next window
        that reads it fills again, at its own time (never at the producer, before the write)."""
        first = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else None
        if first is None or first not in self.data:
            return
        module = self.gm.get_submodule(node.target) if node.op == "call_module" else None
        in_place = values.writes_in_place(node, module)
        if in_place or node in self.alias or (node.op == "call_function" and node.target is operator.getitem) \
                or isinstance(self.gid.get(node), _Split) or node in self.layout:
            self.storage[node] = self.storage.get(first, first)
        if in_place and not rules.zero_preserving(node.op, node.target, module)[0]:
            root = self.storage.get(first, first)
            self.overwritten.add(root)
            self.zeroed = {n for n in self.zeroed if self.storage.get(n, n) != root}
            self.nonneg = {n for n in self.nonneg if self.storage.get(n, n) != root}

    def permute(self, node: fx.Node, x: fx.Node, dims: Any) -> None:
        layout = values.compose_layout(self.layout_of(x), dims)
        if layout is None or layout[0] != 0:
            self.refuse(node, f"it permutes a feature map with dims {dims!r} (only the batch axis first)")
        self.gid[node] = self.gid[x]
        self.env[node] = self.copy(node)
        if layout != tuple(range(2 + self.n)):
            self.layout[node] = layout
        if x in self.alias:
            self.alias.add(node)

    def permuted(self, node: fx.Node, spatial: list[fx.Node]) -> None:
        """A node on a map whose axes were permuted (ConvNeXt's channels-last blocks): elementwise
        ops, a layer norm or linear layer over the last axis when it holds the channels, and a
        reduction over every spatial axis; anything else is refused."""
        layouts = {self.layout_of(n) for n in spatial}
        if len(layouts) != 1:
            self.refuse(node, "it combines feature maps whose axes are in different orders")
        layout = layouts.pop()
        module = self.gm.get_submodule(node.target) if node.op == "call_module" else None
        if node.op == "call_method" and node.target == "permute" or node.target is torch.permute:
            return self.method(node, spatial) if node.op == "call_method" else self.function(node, spatial)
        if module is not None and rules.classify_module(module, self.n)[0] == "permute":
            return self.module(node, spatial)
        kind = rules.channels_last_kind(node.op, node.target, module, node.args, node.kwargs)
        if kind == "pointwise" or (kind == "channels" and layout[-1] == 1):
            self.pointwise(node, spatial, alias=node.op == "call_method" and node.target in rules.ALIAS_METHODS)
            self.layout[node] = layout
            return
        if kind in ("mean", "sum", "max", "norm"):
            a = rules.bind(rules.reduction_signature(node), node.args, node.kwargs)
            dims = a["dim"]
            dims = (dims,) if isinstance(dims, int) else tuple(dims) if dims is not None else ()
            rank = len(layout)
            if sorted(layout[d % rank] for d in dims) == list(range(2, rank)) and rules.plain_reduction(kind, a):
                x = a["input"]
                self.env[node] = self.new.call_function(ops.global_pool_permuted, (
                    self.env[x], self.mask(self.gid[x]), kind, layout, a["keepdim"]))
                return
        what = "over an axis that is not the channels" if kind == "channels" else "on a feature map"
        self.refuse(node, f"it runs {what} whose axes were permuted (channels last), with no rule for it")

    def merge(self, node: fx.Node, spatial: list[fx.Node]) -> int:
        gids = [self.gid[n] for n in spatial]
        if any(not isinstance(g, int) for g in gids):
            self.refuse(node, "it takes a whole split of a feature map")
        for g in gids[1:]:
            self.geometry.require_equal(gids[0], g, self.where(node))
        return gids[0]

    def pointwise(self, node: fx.Node, spatial: list[fx.Node], alias: bool = False) -> None:
        for arg in pytree.tree_leaves((node.args, node.kwargs)):
            if isinstance(arg, fx.Node) and arg not in self.gid and arg.op == "get_attr":
                value = self.gm
                for part in arg.target.split("."):
                    value = getattr(value, part)
                layout = self.layout_of(spatial[0])
                if isinstance(value, Tensor) and value.dim() <= len(layout) and any(
                        size > 1 and layout[len(layout) - value.dim() + i] >= 2 for i, size in enumerate(value.shape)):
                    self.refuse(node, f"it adds a fixed spatial tensor {arg.target} of shape {tuple(value.shape)}")
        self.gid[node] = self.merge(node, spatial)
        self.env[node] = self.copy(node)
        if alias and any(n in self.alias for n in spatial):
            self.alias.add(node)

    def module(self, node: fx.Node, spatial: list[fx.Node]) -> None:
        m = self.gm.get_submodule(node.target)
        kind, detail = rules.classify_module(m, self.n)
        x = node.args[0] if node.args else None
        if kind == "refuse":
            self.refuse(node, detail)
        if kind == "permute":
            return self.permute(node, x, detail)
        if x not in self.gid or len(spatial) != 1:
            self.refuse(node, "its feature map is not its first argument")
        if kind == "pointwise":
            return self.pointwise(node, spatial, alias=isinstance(m, (nn.Identity, nn.Dropout)))
        gid = self.gid[x]
        if kind == "avg_pool":
            window, count_include_pad, divisor = detail
            return self.avg_pool(node, x, window, count_include_pad, divisor)
        if kind in ("conv", "max_pool"):
            out_gid, neg_inf = self.windowed(node, x, detail, "max" if kind == "max_pool" else "zero")
            args = self.mapped(node.args)
            if neg_inf:
                args = (self.pool_input, *args[1:])
            self.env[node] = self.copy(node, args=args)
            if neg_inf:
                self.finite_padding(node, out_gid)
            self.gid[node] = out_gid
            return
        if kind == "global":
            dims = tuple(range(2, 2 + self.n))
            self.env[node] = self.new.call_function(ops.global_pool, (self.env[x], self.mask(gid), detail, dims, True))
            return  # a per-item vector: no geometry
        module_node = self.new.get_attr(node.target)
        if kind == "batch_norm":
            fn, args = ops.batch_norm_module, (self.env[x], self.mask(gid), module_node)
        elif kind == "group_norm":
            fn, args = ops.group_norm, (self.env[x], self.mask(gid), detail, self.new.get_attr(
                f"{node.target}.weight") if m.weight is not None else None, self.new.get_attr(
                f"{node.target}.bias") if m.bias is not None else None, m.eps)
        elif kind == "instance_norm":
            fn, args = ops.instance_norm_module, (self.env[x], self.mask(gid), module_node)
        else:  # norm_act
            fn, args = ops.norm_act, (self.env[x], self.mask(gid), module_node, detail)
        self.env[node] = self.new.call_function(fn, args)
        self.gid[node] = gid

    def avg_pool(self, node: fx.Node, x: fx.Node, window: Window, count_include_pad: bool,
                 divisor: int | None) -> None:
        """Average pooling with each item's own divisor (:func:`vispos._box_layers.box_avg_pool`)."""
        self.gid[node] = self.geometry.child(self.gid[x], window, self.where(node))
        self.env[node] = self.new.call_function(ops.avg_pool, (
            self.env[x], self.mask(self.gid[x]), window.kernel, window.stride, window.pad_lo, window.ceil_mode,
            count_include_pad, divisor))

    def function(self, node: fx.Node, spatial: list[fx.Node]) -> None:
        target = node.target
        if target in rules.POINTWISE_FUNCTIONS:
            return self.pointwise(node, spatial)
        if target is getattr:  # x.shape, x.dtype, ...
            self.env[node] = self.copy(node)
            return
        if target is operator.getitem:
            return self.getitem(node, spatial)
        if target is torch.permute:
            return self.permute(node, node.args[0], node.args[1] if len(node.args) > 1 else node.kwargs["dims"])
        self.by_signature(node, rules.FUNCTION_SIGNATURES.get(target), spatial,
                          "no rule for this function on a feature map")

    def method(self, node: fx.Node, spatial: list[fx.Node]) -> None:
        name = node.target
        if name == "permute":
            dims = node.args[1] if len(node.args) == 2 and isinstance(node.args[1], (tuple, list)) else node.args[1:]
            return self.permute(node, node.args[0], node.kwargs.get("dims", dims))
        if name in rules.SHAPE_METHODS:
            self.env[node] = self.copy(node)
            return
        if name in rules.POINTWISE_METHODS:
            return self.pointwise(node, spatial, alias=name in rules.ALIAS_METHODS)
        self.by_signature(node, rules.METHOD_SIGNATURES.get(name), spatial,
                          "it reshapes, moves or mixes cells without a padding mask")

    def by_signature(self, node: fx.Node, entry: tuple | None, spatial: list[fx.Node], unknown: str) -> None:
        """A call with a rule of :mod:`._invariant_rules`: its arguments read by name, then rewritten."""
        if entry is None:
            self.refuse(node, unknown)
        kind, signature = entry
        try:
            a = rules.bind(signature, node.args, node.kwargs)
        except TypeError:
            self.refuse(node, "its arguments could not be read")
        self.functional(node, kind, a, spatial)

    def getitem(self, node: fx.Node, spatial: list[fx.Node]) -> None:
        src, index = node.args
        gid = self.gid.get(src)
        if isinstance(gid, _Split) and isinstance(index, int):  # one part of a channel split
            self.gid[node] = gid.gid
        elif isinstance(gid, int) and _channel_index(index):
            self.gid[node] = gid
        else:
            self.refuse(node, f"indexing a feature map with {index!r} (only channels may be selected)")
        self.env[node] = self.copy(node)
        if src in self.alias:  # a view of the caller's input
            self.alias.add(node)

    def functional(self, node: fx.Node, kind: str, a: dict[str, Any], spatial: list[fx.Node]) -> None:
        rank = 2 + self.n
        x = a.get("input")
        if kind == "cat":
            dim = a["dim"] % rank if isinstance(a["dim"], int) else None
            if dim != 1:
                self.refuse(node, "it concatenates feature maps along a spatial axis")
            return self.pointwise(node, spatial)
        if kind == "split":
            if x not in self.gid or (a["dim"] % rank) != 1:
                self.refuse(node, "it splits a feature map along a spatial axis")
            self.env[node] = self.copy(node)
            self.gid[node] = _Split(self.gid[x])
            if x in self.alias:
                self.alias.add(node)
            return
        if kind == "flatten":
            self.refuse(node, "it flattens the spatial axes of a feature map")
        if x not in self.gid or len(spatial) != 1:
            self.refuse(node, "its feature map is not its input")
        gid = self.gid[x]
        if kind == "conv":
            kernel = self.kernel_of(a["weight"], node)
            window = rules.window_of(self.n, kernel, a["stride"], a["padding"], a["dilation"])
            self.gid[node] = self.windowed(node, x, window, "zero")[0]
            self.env[node] = self.copy(node, args=self.mapped(node.args), kwargs=self.mapped(node.kwargs))
        elif kind == "max_pool":
            if a["return_indices"]:
                self.refuse(node, "return_indices=True (indices into the padded canvas)")
            window = rules.window_of(self.n, a["kernel_size"], a["stride"], a["padding"], a["dilation"], a["ceil_mode"])
            self.gid[node], neg_inf = self.windowed(node, x, window, "max")
            args, kwargs = self.mapped(node.args), self.mapped(node.kwargs)
            if neg_inf:  # the pooled map is the first argument or the keyword ``input``
                if args:
                    args = (self.pool_input, *args[1:])
                else:
                    kwargs = {**kwargs, "input": self.pool_input}
            self.env[node] = self.copy(node, args=args, kwargs=kwargs)
            if neg_inf:
                self.finite_padding(node, self.gid[node])
        elif kind == "avg_pool":
            window = rules.window_of(self.n, a["kernel_size"], a["stride"], a["padding"], 1, a["ceil_mode"])
            self.avg_pool(node, x, window, a["count_include_pad"], a["divisor_override"])
        elif kind in ("adaptive_mean", "adaptive_max"):
            size = a["output_size"]
            if any(s != 1 for s in (size if isinstance(size, (tuple, list)) else (size,))) or a["return_indices"]:
                self.refuse(node, f"output_size={size!r} (only a global pool has the item's bins)")
            mode = "mean" if kind == "adaptive_mean" else "max"
            self.env[node] = self.new.call_function(
                ops.global_pool, (self.env[x], self.mask(gid), mode, tuple(range(2, rank)), True))
        elif kind in ("mean", "sum", "max", "norm"):
            dims = a["dim"]
            dims = (dims,) if isinstance(dims, int) else tuple(dims) if dims is not None else None
            if dims is None or sorted(d % rank for d in dims) != list(range(2, rank)) or not rules.plain_reduction(kind, a):
                self.refuse(node, f"a reduction over dims {a['dim']!r} (only over every spatial axis)")
            self.env[node] = self.new.call_function(
                ops.global_pool, (self.env[x], self.mask(gid), kind, tuple(range(2, rank)), a["keepdim"]))
            if kind == "sum":
                self.sums[node] = (gid, a["keepdim"])
        elif kind == "batch_norm":
            m = self.mapped
            self.env[node] = self.new.call_function(ops.batch_norm_fn, (
                self.env[x], self.mask(gid), m(a["running_mean"]), m(a["running_var"]), m(a["weight"]),
                m(a["bias"]), a["training"], a["momentum"], a["eps"]))
            self.gid[node] = gid
        elif kind == "group_norm":
            m = self.mapped
            self.env[node] = self.new.call_function(ops.group_norm, (
                self.env[x], self.mask(gid), a["num_groups"], m(a["weight"]), m(a["bias"]), a["eps"]))
            self.gid[node] = gid
        elif kind == "instance_norm":
            if not a["use_input_stats"]:
                return self.pointwise(node, spatial)
            if a["running_mean"] is not None:
                self.refuse(node, "instance norm that tracks running statistics")
            m = self.mapped
            self.env[node] = self.new.call_function(ops.instance_norm_fn, (
                self.env[x], self.mask(gid), m(a["weight"]), m(a["bias"]), a["eps"]))
            self.gid[node] = gid
        else:  # pragma: no cover - every kind of the rule book is handled above
            self.refuse(node, f"no rule for {kind!r}")


class _Split:
    """The geometry of the parts of a channel split (``chunk`` / ``split`` along channels): the
    input's, for every part."""

    __slots__ = ("gid",)

    def __init__(self, gid: int) -> None:
        self.gid = gid


def _channel_index(index: Any) -> bool:
    """``x[:, a:b]`` / ``x[:, [..]]``: an index that selects channels only."""
    if not isinstance(index, tuple):
        return False
    if len(index) == 0 or index[0] != slice(None):
        return False
    return all(i == slice(None) or i is Ellipsis for i in index[2:])


def make_padding_invariant(gm: fx.GraphModule, n_spatial: int) -> "InvariantRunner":
    """Rewrites ``gm`` (both graphs of a torchvision ``DualGraphModule``) in place and returns the
    runner that feeds it masks.

    Raises:
        ValueError: a layer that cannot be made exact (named), or outputs that are not feature maps
            of the input.
    """
    geometry = Geometry(n_spatial)
    dual = hasattr(gm, "train_graph") and hasattr(gm, "eval_graph")
    graphs = {"train": gm.train_graph, "eval": gm.eval_graph} if dual else {"any": gm.graph}
    outputs, needed, new_graphs = {}, set(), {}
    for mode, graph in graphs.items():
        rewriter = _Rewriter(gm, graph, geometry, n_spatial)
        outs = rewriter.run()
        if any(not isinstance(g, int) for g in outs):
            raise ValueError(
                "padding_invariant=True: every output of the backbone must be a feature map of its input "
                f"(got outputs without a spatial layout: {outs})"
            )
        rewriter.new.lint()
        outputs[mode], new_graphs[mode] = outs, rewriter.new
        needed |= rewriter.needed
    if dual:
        gm.train_graph, gm.eval_graph = new_graphs["train"], new_graphs["eval"]
        gm.graph = gm.train_graph if gm.training else gm.eval_graph
    else:
        gm.graph = new_graphs["any"]
    gm.recompile()
    return InvariantRunner(geometry, outputs, needed)
