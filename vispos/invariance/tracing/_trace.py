"""FX tracing of a backbone into a train / eval pair of graphs that return its feature maps.

One tracer serves every adapter: torchvision models cut at named nodes (torchvision's node names,
as ``get_graph_node_names`` gives them), timm's ``features_only`` models (their own outputs, or, for
the models whose features come from forward hooks, the outputs of the hooked modules) and volume
models. The model is traced once in training and once in eval mode (code that branches on
``self.training``, such as ``DropPath``, bakes its branch into each graph) into a
:class:`~vispos.invariance.tracing._mode_graphs.ModeGraphModule`, which switches graphs with ``train()`` /
``eval()`` and keeps them through deep copies and pickles. The module hierarchy and so the
``state_dict`` keys stay those of the traced module.

Which modules stay one call of the graph is asked of the rule book
(:class:`~vispos.invariance.RuleBook`, the global one unless a call passes its own): every module
it has a rule for or keeps whole (torchvision's ops), timm's "do not trace" modules and functions
(``timm.models._features_fx``) and torch.nn's own modules (FX's default), except the modules the
book traces through; the book also says which modules are traced as another function
(torchvision's ``StochasticDepth``) and what is patched while a network is traced (MONAI's
networks), see :mod:`vispos.invariance.tracing._policy`. A forward's parameters after the first
that have defaults (``forward(x, y=None)``) are traced at their defaults. Every node records the
module it was traced in (``node.meta["vispos_path"]``); an error raised while tracing becomes a
``ValueError`` that names the module being traced.

References:
    torch.fx (``Tracer``, ``GraphModule``); torchvision ``models/feature_extraction.py``
    (``NodePathTracer``, ``create_feature_extractor``); timm ``models/_features_fx.py`` and
    ``models/_features.py`` (``FeatureHookNet``).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import operator
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.fx as fx
from torch import nn
from torch.utils import _pytree as pytree
from torchvision.models.feature_extraction import NodePathTracer

from ..rewrite._rewrite import make_padding_invariant
from ..rewrite._rewrite_base import voice
from ..rules import RuleBook, as_book
from ._mode_graphs import ModeGraphModule
from ._policy import TRACE_LOCK

__all__ = [
    "PathTracer", "UntraceableLayer", "count_outputs", "hooked_features", "make_invariant", "trace_dual",
    "trace_features",
]

#: a feature read by a forward hook: (module, "forward" for its output / "forward_pre" for its input)
HookFeature = tuple[nn.Module, str]


@functools.lru_cache(maxsize=1)
def _timm_notrace() -> tuple[tuple[type, ...], tuple[Any, ...]]:
    try:
        from timm.models._features_fx import get_notrace_functions, get_notrace_modules
    except ImportError:  # pragma: no cover - timm is a dependency; older releases lack the helpers
        return (), ()
    return tuple(get_notrace_modules()), tuple(get_notrace_functions())


def defaults_of(module: nn.Module) -> dict[str, Any]:
    """The parameters of ``module.forward`` after the first that have a default (``y=None``), at
    that default: torch.fx's ``concrete_args``, so the trace runs the forward as a call with one
    input does."""
    try:
        parameters = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        return {}
    return {p.name: p.default for p in parameters[1:]
            if p.default is not inspect.Parameter.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


class UntraceableLayer(ValueError):
    """A layer torch.fx cannot trace symbolically.

    Attributes:
        layer (str): the module path being traced (``""`` for the traced module's own code).
        layer_type (str): its class name.
        reason (str): the tracer's error, ``"TypeError: ..."``.
    """

    def __init__(self, layer: str, layer_type: str, reason: str) -> None:
        self.layer, self.layer_type, self.reason = layer, layer_type, reason
        where = f"layer {layer!r} ({layer_type})" if layer else f"the forward of {layer_type} itself"
        super().__init__(f"torch.fx cannot trace {where}: {reason}")


class PathTracer(NodePathTracer):
    """An FX tracer with vispos' leaves (see the module docstring) that records on every node the
    module it was traced in (``node.meta["vispos_path"]``), torchvision's node names
    (``node_to_qualname``, only with ``qualnames=True``) and, for the modules in ``watch``, their
    last input or output; errors raised while tracing a module become :class:`UntraceableLayer`.

    Args:
        num_axes (int): spatial axes of the feature maps (traced-as functions depend on it).
        qualnames (bool): record torchvision's node names (quadratic in the graph's size; needed
            to cut the graph at named nodes only).
        watch (dict[int, str], optional): ``{id(module): "forward" | "forward_pre"}``.
        rules (RuleBook, optional): the rule book asked. Default: the global one.
    """

    def __init__(self, num_axes: int = 2, qualnames: bool = False, watch: Mapping[int, str] | None = None,
                 rules: RuleBook | None = None) -> None:
        # every argument has a default: a pickled GraphModule re-traces its code with this class
        self.rules = as_book(rules)
        leaves, functions = _timm_notrace()
        mine = tuple(f for f in self.rules.registered_functions() if f not in functions)
        super().__init__(autowrap_modules=(math,), autowrap_functions=functions + mine)
        self._timm_leaves, self._num_axes, self._qualnames = leaves, num_axes, qualnames
        self._watch = dict(watch or {})
        self.seen: dict[int, Any] = {}
        self._path: list[tuple[str, str]] = []

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        book = self.rules
        if book.opens(m):
            return False
        if book.keeps_whole(m):
            return True
        if isinstance(m, self._timm_leaves):
            return not isinstance(m, nn.Sequential)
        return fx.Tracer.is_leaf_module(self, m, module_qualified_name)

    def _here(self) -> tuple[str, str]:
        return self._path[-1] if self._path else ("", type(self.root).__name__)

    def call_module(self, m: nn.Module, forward: Any, args: tuple, kwargs: dict) -> Any:
        try:
            path = self.path_of_module(m)
        except NameError:
            layer, layer_type = self._here()
            raise UntraceableLayer(layer, layer_type, (
                f"it calls a {type(m).__name__} that is not one of its registered submodules (built in "
                "forward), which a traced graph cannot hold")) from None
        substitute = self.rules.substitute_for(m)
        if substitute is not None:  # traced as another function (StochasticDepth, whose function FX keeps whole)
            return substitute(m, args[0], self._num_axes)
        kind = self._watch.get(id(m))
        if kind == "forward_pre" and args:
            self.seen[id(m)] = args[0]
        self._path.append((path, type(m).__name__))
        try:
            out = super().call_module(m, forward, args, kwargs)
        except UntraceableLayer:
            raise
        except Exception as exc:  # FX raises TraceError, TypeError, RuntimeError, NameError ...
            raise UntraceableLayer(path, type(m).__name__, f"{type(exc).__name__}: {exc}") from exc
        finally:
            self._path.pop()
        if kind == "forward":
            self.seen[id(m)] = out[0] if isinstance(out, tuple) else out
        return out

    def create_proxy(self, kind, target, args, kwargs, name=None, type_expr=None, *rest):  # noqa: D102
        if self._qualnames:
            return super().create_proxy(kind, target, args, kwargs, name, type_expr, *rest)
        return fx.Tracer.create_proxy(self, kind, target, args, kwargs, name, type_expr, *rest)

    def create_node(self, *args: Any, **kwargs: Any) -> fx.Node:
        node = super().create_node(*args, **kwargs)
        path, layer_type = self._path[-1] if self._path else ("", type(self.root).__name__)
        node.meta["vispos_path"], node.meta["vispos_layer"] = path, f"{path or 'the model'} ({layer_type})"
        return node

    def trace(self, root: Any, concrete_args: Any = None) -> fx.Graph:  # noqa: D102
        self._path = []
        try:
            with TRACE_LOCK, contextlib.ExitStack() as patches:
                if isinstance(root, nn.Module):
                    for patch in self.rules.patches_for(root, self._num_axes):
                        patches.enter_context(patch)
                return super().trace(root, concrete_args)
        except UntraceableLayer:
            raise
        except Exception as exc:
            raise UntraceableLayer("", type(root).__name__, f"{type(exc).__name__}: {exc}") from exc


#: what torch.fx writes into a graph to check an argument traced at a fixed value
_SPECIALIZED = {getattr(fx._symbolic_trace, "_assert_is_none", None), torch._assert, operator.eq}


def _drop_specialized(graph: fx.Graph) -> None:
    """Removes the inputs torch.fx adds for arguments traced at a fixed value (``concrete_args``)
    and the checks it adds on them, so the graph takes the one input a call with one input gives."""
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    for node in placeholders[1:]:
        checks, stack = [], list(node.users)
        while stack:
            user = stack.pop()
            checks.append(user)
            stack.extend(user.users)
        if not all(c.op == "call_function" and c.target in _SPECIALIZED for c in checks):
            continue
        remaining = set(checks)
        while remaining:
            done = [c for c in remaining if not c.users]
            for check in done:
                graph.erase_node(check)
            remaining.difference_update(done)
        graph.erase_node(node)


def _failing_node(exc: BaseException) -> fx.Node | None:
    """The graph node a rewrite was working on when it raised (the innermost frame with a local
    ``node``)."""
    found, tb = None, exc.__traceback__
    while tb is not None:
        node = tb.tb_frame.f_locals.get("node")
        if isinstance(node, fx.Node):
            found = node
        tb = tb.tb_next
    return found


def make_invariant(gm: fx.GraphModule, num_axes: int, inputs: Any = None, per_item: bool = False,
                   rules: RuleBook | None = None) -> Any:
    """:func:`~vispos.invariance.rewrite._rewrite.make_padding_invariant` on ``gm`` (``inputs``,
    ``per_item`` and ``rules`` as there),
    with every failure a ``ValueError`` that names the layer: a refusal of the rule book as it is,
    an error from inside the rewrite (a value the rules cannot read) with the graph node it was
    rewriting.

    Raises:
        ValueError: a layer that cannot be made exact (named).
    """
    try:
        return make_padding_invariant(gm, num_axes=num_axes, inputs=inputs, per_item=per_item, rules=rules)
    except ValueError:
        raise
    except Exception as exc:
        node = _failing_node(exc)
        where = "a layer" if node is None else (
            f"{node.meta.get('vispos_layer') or type(gm).__name__} (graph node {node.name!r})")
        who, advice = voice()
        raise ValueError(
            f"{who} cannot run {where} exactly on a padded batch: its arguments could not be read "
            f"({type(exc).__name__}: {exc}). {advice}"
        ) from exc


def hooked_features(module: nn.Module) -> list[HookFeature]:
    """The features timm's ``FeatureHookNet`` collects with forward hooks, in output order: each
    hooked module and whether its output (``"forward"``) or input (``"forward_pre"``) is taken.
    Empty for any other module."""
    hooks = getattr(module, "hooks", None)
    order = getattr(hooks, "_hook_ids", None)
    if order is None:
        return []
    found: dict[Any, HookFeature] = {}
    for sub in module.modules():
        for kind, table in (("forward", sub._forward_hooks), ("forward_pre", sub._forward_pre_hooks)):
            for fn in table.values():
                if isinstance(fn, functools.partial) and getattr(fn.func, "__self__", None) is hooks:
                    found[fn.args[0]] = (sub, kind)
    return [found[i] for i in order if i in found]


def count_outputs(gm: fx.GraphModule) -> dict[str, int]:
    """The number of tensors each graph of ``gm`` returns (``{"train": n, "eval": n}``)."""
    graphs = {"train": gm.train_graph, "eval": gm.eval_graph} if hasattr(gm, "train_graph") else {"eval": gm.graph}
    counts = {}
    for mode, graph in graphs.items():
        output = next(n for n in reversed(graph.nodes) if n.op == "output")
        counts[mode] = sum(isinstance(leaf, fx.Node) for leaf in pytree.tree_leaves(output.args[0]))
    return counts


def _cut_at_nodes(graph: fx.Graph, names: Mapping[fx.Node, str], queries: Mapping[str, str], model: str) -> None:
    """Makes ``graph`` return ``{output name: node}``, each query resolved as torchvision does (the
    last node whose name starts with the query up to a dot: ``"layer4"`` is the last node of
    ``layer4``).

    Raises:
        ValueError: a query matches no node (the message lists the top-level nodes).
    """
    outputs, missing = {}, []
    ordered = [n for n in graph.nodes if n in names]
    for query, out_name in queries.items():
        depth = query.count(".")
        found = [n for n in ordered if ".".join(names[n].split(".")[: depth + 1]) == query]
        if not found:
            missing.append(query)
        else:
            outputs[out_name] = found[-1]
    if missing:
        tops = list(dict.fromkeys(names[n].split(".")[0] for n in ordered))[:30]
        raise ValueError(
            f"return_nodes {list(queries)} are not all nodes of {model} ({missing} are not). Top-level "
            f"nodes: {tops}; see torchvision.models.feature_extraction.get_graph_node_names for every node"
        )
    _set_output(graph, outputs)


def _set_output(graph: fx.Graph, value: Any) -> None:
    for node in [n for n in graph.nodes if n.op == "output"]:
        graph.erase_node(node)
    graph.output(value)
    graph.eliminate_dead_code()


def trace_features(
    module: nn.Module,
    num_axes: int,
    return_nodes: Mapping[str, str] | None = None,
    hooks: Sequence[HookFeature] | None = None,
    class_name: str | None = None,
    rules: RuleBook | None = None,
) -> ModeGraphModule:
    """``module`` traced in training and in eval mode, as one :class:`ModeGraphModule` that shares
    ``module``'s submodules (parameters and buffers are the same objects) and keeps its modes.

    Args:
        module (nn.Module): the model.
        num_axes (int): spatial axes of its feature maps.
        return_nodes (dict[str, str], optional): ``{torchvision node name: output name}``: the graphs
            return that dict, cut after its nodes.
        hooks (sequence of (nn.Module, str), optional): modules whose output (``"forward"``) or
            input (``"forward_pre"``) the graphs return, as a list, in order (timm's
            ``FeatureHookNet``, see :func:`hooked_features`).
        class_name (str, optional): the name ``repr`` shows. Default: ``module``'s class name.
        rules (RuleBook, optional): the rule book the tracer asks. Default: the global one.

    Returns:
        ModeGraphModule: its graphs return ``module``'s own outputs when neither ``return_nodes``
        nor ``hooks`` is given.

    Raises:
        UntraceableLayer (a ValueError): torch.fx fails inside a layer (named).
        ValueError: a return node is not in the model; a hooked module is never called.
    """
    watch = {id(m): kind for m, kind in (hooks or ())}
    modes = {name: sub.training for name, sub in module.named_modules()}
    name = class_name or type(module).__name__
    graphs = {}
    try:
        for mode in (True, False):
            module.train(mode)
            tracer = PathTracer(num_axes, qualnames=return_nodes is not None, watch=watch, rules=rules)
            defaults = defaults_of(module)
            graph = tracer.trace(module, defaults or None)
            if defaults:
                _drop_specialized(graph)
            gm = fx.GraphModule(tracer.root, graph, name)  # dead-code elimination asks modules
            if return_nodes is not None:
                _cut_at_nodes(gm.graph, tracer.node_to_qualname, return_nodes, name)
            elif hooks is not None:
                missing = [type(m).__name__ for m, _ in hooks if id(m) not in tracer.seen]
                if missing:
                    raise ValueError(f"the hooked modules {missing} of {name} are never called by its forward")
                _set_output(gm.graph, [getattr(tracer.seen[id(m)], "node", None) for m, _ in hooks])
            graphs[mode] = gm.graph
    finally:
        for sub_name, sub in module.named_modules():
            sub.training = modes[sub_name]
    return ModeGraphModule.of(module, graphs[True], graphs[False], class_name=name)


def trace_dual(module: nn.Module, num_axes: int, n_levels: int | None = None) -> ModeGraphModule:
    """``module`` (a timm ``features_only`` model or any module returning feature maps) traced in
    training and in eval mode; for timm's ``FeatureHookNet`` the graphs return the hooked modules'
    features (forward hooks do not run while FX traces).

    Args:
        module (nn.Module): the feature model (its hooks are removed once traced).
        num_axes (int): spatial axes of its feature maps.
        n_levels (int, optional): the number of feature maps each graph must return.

    Raises:
        ValueError: the module cannot be traced symbolically (the layer named); a graph returns
            another number of feature maps than ``n_levels`` (features FX does not see, such as
            ones collected by forward hooks other than timm's).
    """
    hooks = hooked_features(module)
    try:
        gm = trace_features(module, num_axes, hooks=hooks or None)
    except UntraceableLayer as exc:
        raise ValueError(
            f"padding_invariant=True needs the backbone traced with torch.fx, which fails for "
            f"{type(module).__name__}: {exc}. Use padding_invariant=False, or a model without this layer"
        ) from exc
    finally:  # the graphs return the hooked features: the hooks would only hold on to activations
        if hooks:
            for handle in module.hooks._handles:
                handle.remove()
            module.hooks._feature_outputs.clear()
    counts = count_outputs(gm)
    if n_levels is not None and any(n != n_levels for n in counts.values()):
        raise ValueError(
            f"padding_invariant=True: the traced graph of {type(module).__name__} returns {counts} feature maps "
            f"(train / eval) where {n_levels} levels were asked; its forward collects features torch.fx does not "
            "see (forward hooks, side channels). Use padding_invariant=False, or a model that returns its features"
        )
    return gm
