"""A traced backbone with one graph per mode whose copies keep the mode of every module.

torchvision's ``DualGraphModule`` runs its train graph in training mode and its eval graph in eval
mode (code that branches on ``self.training`` is baked into each graph). Two of its copies lose
that: ``copy.deepcopy`` re-runs its constructor, which puts the copy and every submodule in
training mode (an EMA copy of an eval model then normalises with batch statistics and updates its
running statistics on an "eval" forward), and ``pickle`` keeps only the current graph as a plain
``GraphModule`` (``train()`` / ``eval()`` then no longer switch graphs). :class:`ModeGraphModule`
fixes both: a deep copy and an unpickled copy have both graphs, the graph of the mode they were
copied in, and the training flag of every submodule.

References:
    torchvision ``models/feature_extraction.py`` (``DualGraphModule``); torch.fx ``GraphModule``
    (``__deepcopy__``, ``__reduce__``: pickled as code and re-traced).
"""

from __future__ import annotations

import copy
import threading
import weakref
from typing import Any, Callable

import torch
import torch.fx as fx
from torch import Tensor, nn
from torchvision.models.feature_extraction import DualGraphModule

from ... import _tracing
from ..._tracing import tracing
from ..tokens._tokens import has_hooks

__all__ = ["ModeGraphModule", "check_graph_hooks", "has_hooks", "refuse_unrun_hooks", "set_modes", "unrun_hooks"]


def _hooked(root: nn.Module) -> list[nn.Module]:
    """The modules under ``root`` (itself included) that carry hooks: one walk over ``_modules``,
    without the names ``named_modules`` builds (this runs on every forward: about 0.5 us a module)."""
    found, stack = [], [root]
    pop, extend = stack.pop, stack.extend
    while stack:
        module = pop()
        if module is None:  # a submodule registered as None
            continue
        if (module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                or module._backward_pre_hooks):
            found.append(module)
        extend(module._modules.values())
    return found


#: per traced graph: the ids of the modules it calls as modules and of everything inside them
#: (their own ``forward`` runs, hooks included), held with the modules so an id is never reused,
#: and every path the graph reads (a call_module or get_attr target and each of its prefixes)
_USAGE: "weakref.WeakKeyDictionary[fx.Graph, tuple[tuple[nn.Module, ...], frozenset[int], frozenset[str]]]" = (
    weakref.WeakKeyDictionary())
_USAGE_LOCK = threading.Lock()


def _usage(root: nn.Module, graph: fx.Graph, fresh: bool) -> tuple[frozenset[int], frozenset[str]]:
    with _USAGE_LOCK:
        cached = None if fresh else _USAGE.get(graph)
    if cached is not None:
        return cached[1], cached[2]
    modules: list[nn.Module] = []
    paths: set[str] = set()  # not "": the graph module itself is called, its hooks run
    for node in graph.nodes:
        if node.op not in ("call_module", "get_attr"):
            continue
        parts = node.target.split(".")
        paths.update(".".join(parts[:k]) for k in range(1, len(parts) + 1))
        if node.op == "call_module":
            try:
                modules.extend(root.get_submodule(node.target).modules())
            except AttributeError:  # removed since: the graph fails on its own when run
                continue
    entry = (tuple(modules), frozenset(map(id, modules)), frozenset(paths))
    with _USAGE_LOCK:
        _USAGE[graph] = entry
    return entry[1], entry[2]


def unrun_hooks(root: nn.Module, graph: fx.Graph, modules: Any = None) -> list[tuple[str, nn.Module]]:
    """The ``(name, module)`` pairs under ``root`` whose hooks running ``graph`` would skip.

    A traced graph calls its leaf layers as modules (their hooks run) but runs the code of the
    containers it traced through, and of the layers a rule rewrote, inline: a hooked module the
    graph reads (its path leads to a layer or a parameter the graph uses) and does not call, nor
    sits inside a module it calls, would never see its hooks fire. A module the graph does not
    read at all is not run in this mode by the model either (a training-only branch).

    Args:
        root (nn.Module): the module the graph runs on (a ``GraphModule``).
        graph (fx.Graph): the graph that runs (the current mode's).
        modules (iterable of (str, nn.Module), optional): the modules to check, all of which the
            model runs in this mode (a projection's or a decoder's layers, under the owner's
            names); default every module under ``root`` that the graph reads.

    Returns:
        list of (str, nn.Module): the names as ``root.named_modules()`` gives them; empty when
        every hook would run, the usual case, found in one walk of the modules. Empty while
        compiling or exporting (``torch.compile``, ``torch.export``): the check runs eagerly.
    """
    if tracing():  # compiling or exporting: the check is Python over modules, run eagerly
        return []
    if modules is not None:
        pairs = [(n, m) for n, m in modules if has_hooks(m)]
    else:
        hooked = _hooked(root)
        wanted = set(map(id, hooked))
        pairs = [(n, m) for n, m in root.named_modules() if id(m) in wanted] if hooked else []
    if not pairs:
        return []
    for fresh in (False, True):  # a module replaced since the graph was first read: read it again
        called, paths = _usage(root, graph, fresh)
        unrun = [(n, m) for n, m in pairs if id(m) not in called and (modules is not None or n in paths)]
        if not unrun:
            return []
    return unrun


def refuse_unrun_hooks(graph: fx.GraphModule, modules: Any, what: str) -> None:
    """Raises ``ValueError`` naming the first of ``modules`` (``(name, nn.Module)`` pairs, all run
    by the model in this mode) whose hooks the rewritten ``graph`` (its current graph) would not
    run; ``what`` opens the message (``"padding_invariant=True runs input_proj.0"``)."""
    unrun = unrun_hooks(graph, graph.graph, modules)
    if unrun:
        name, module = unrun[0]
        raise ValueError(
            f"{what} as a rewritten torch.fx graph, which calls no {name} "
            f"({type(module).__name__}) module (it runs its code inline), so the hooks registered on it "
            "would not run; remove them, or hook one of its convolutions"
        )


def _forward_hooked(body: nn.Module, graph: fx.Graph, hooked: list[nn.Module]) -> list[str]:
    """The names of the modules ``graph`` calls (or that sit inside one it calls) among ``hooked``
    that carry a forward or forward-pre hook, and ``"torch's global module hooks"`` when set."""
    found = []
    if _global_forward_hooks():
        found.append("torch's global module hooks")
    hooked = [m for m in hooked if m._forward_hooks or m._forward_pre_hooks]
    if hooked:
        called, _ = _usage(body, graph, False)
        wanted = {id(m) for m in hooked if id(m) in called}
        found += [f"{n} ({type(m).__name__})" for n, m in body.named_modules() if id(m) in wanted]
    return found


def _padded(padding: Any) -> bool:
    """Some item of ``padding`` (a :class:`~vispos.Padding`) leaves cells of the canvas padded."""
    if padding.kind == "none":
        return False
    if padding.kind != "rectangular":
        return True
    return not (padding.at_origin and all(tuple(size) == padding.spatial for size in padding.sizes))


def _global_forward_hooks() -> bool:
    from torch.nn.modules import module as torch_module

    return bool(torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks)


@_tracing.outside_graph  # a host check of the modules: run eagerly, never traced into a graph
def check_graph_hooks(body: nn.Module, owner: str, padding: Any = None) -> None:
    """Raises ``ValueError`` when a module of the traced backbone ``body`` carries a hook that
    its graphs would not run (see :func:`unrun_hooks`), instead of running without it; with
    ``padding`` (a rewritten graph's input padding), also when a module the graph calls carries a
    forward or forward-pre hook (or torch's global module hooks are set) and the batch is padded:
    the hook runs on the padded map, before or after the zeros the rewrite writes into its
    padding, so the next layer would read what the hook left there.

    Args:
        body (fx.GraphModule): the traced backbone (a ``DualGraphModule``'s graph of the current
            mode: ``train()`` / ``eval()`` switch graphs, and each forward checks its own).
        owner (str): what traced it, for the message (``"padding_invariant=True"``,
            ``"torchvision's feature extraction"``).
        padding (Padding, optional): the batch's padding, for a graph rewritten for padding
            invariance. Default None: no such check.

    Raises:
        ValueError: naming the modules (at most five) and their types.
    """
    hooked = _hooked(body)  # one walk: the usual case, no hook, ends here
    if not hooked and (padding is None or not _global_forward_hooks()):
        return
    if padding is not None:
        hooked = _forward_hooked(body, body.graph, hooked)
        if hooked and _padded(padding):
            raise ValueError(
                f"{owner} runs the backbone as a rewritten torch.fx graph that writes zeros into each map's padding "
                f"before the layers that read it; forward hooks on {', '.join(hooked[:5])} run on the padded maps, "
                "before or after those zeros, so the next layer would read what the hook left in the padding. Remove "
                "the hooks, hook the backbone's output levels, or run items without padding (one item, or items "
                "of one size)")
    unrun = unrun_hooks(body, body.graph)
    if unrun:
        named = ", ".join(f"{n} ({type(m).__name__})" for n, m in unrun[:5])
        more = f" and {len(unrun) - 5} more" if len(unrun) > 5 else ""
        raise ValueError(
            f"{owner} runs the backbone as a torch.fx graph that does not call {named}{more} as a "
            "module (it runs the code of a container it traced through, or of a layer rewritten "
            "to be exact, inline), so the forward / backward hooks registered on it would not run. "
            "Remove those hooks, or hook a layer the graph calls (a convolution, an activation) or "
            "the backbone's output levels"
        )


def set_modes(module: nn.Module, modes: dict[str, bool]) -> None:
    """Sets the training flag of ``module`` and of each named submodule from ``modes``
    (``{name: training}``, ``""`` for ``module``) without recursing, so mixed modes (a batch norm
    kept in eval inside a training model) survive. A :class:`ModeGraphModule` also takes the graph
    of its mode. Names ``module`` lacks are skipped."""
    for name, sub in module.named_modules():
        if name not in modes:
            continue
        if isinstance(sub, DualGraphModule) and sub.training != modes[name]:
            sub.graph = sub.train_graph if modes[name] else sub.eval_graph
        sub.training = modes[name]


def _modes(module: nn.Module) -> dict[str, bool]:
    return {name: sub.training for name, sub in module.named_modules()}


def _copy_path(source: nn.Module, target: nn.Module, path: str) -> None:
    """Installs ``source``'s attribute ``path`` (a submodule, parameter or buffer) in ``target``,
    creating empty containers on the way, as ``GraphModule`` builds its hierarchy."""
    *parents, leaf = path.split(".")
    for part in parents:
        source = getattr(source, part)
        child = getattr(target, part, None)
        if child is None:
            child = nn.Module()
            setattr(target, part, child)
        elif child is source:  # a whole module installed already holds the rest of the path
            return
        target = child
    value = getattr(source, leaf)
    if isinstance(value, Tensor) and not isinstance(value, nn.Parameter):
        target.register_buffer(leaf, value)
    else:
        setattr(target, leaf, value)


def _rebuild(
    graphs: tuple[fx.GraphModule, fx.GraphModule], modes: dict[str, bool], class_name: str
) -> "ModeGraphModule":
    """Unpickling: one :class:`ModeGraphModule` over the two re-traced graphs (which share their
    modules: they were pickled together), in the modes it was pickled in."""
    root = nn.Module()
    for gm in graphs:
        for node in gm.graph.nodes:
            if node.op in ("get_attr", "call_module"):
                _copy_path(gm, root, node.target)
    module = ModeGraphModule(root, graphs[0].graph, graphs[1].graph, class_name=class_name)
    set_modes(module, modes)
    return module


class ModeGraphModule(DualGraphModule):
    """torchvision's ``DualGraphModule`` (one graph for training, one for eval, switched by
    ``train()`` / ``eval()``) whose deep copies and pickles keep both graphs and the mode of every
    submodule.

    Args:
        root (nn.Module): the module whose submodules, parameters and buffers the graphs call
            (shared, not copied).
        train_graph (fx.Graph), eval_graph (fx.Graph): the graphs traced in each mode.
        class_name (str): the name ``repr`` shows. Default ``"GraphModule"``.

    Raises:
        TypeError: a graph node's target is not a string (torchvision's check).

    References:
        torchvision ``models/feature_extraction.py`` (``DualGraphModule``).
    """

    @classmethod
    def of(cls, root: nn.Module, train_graph: fx.Graph, eval_graph: fx.Graph, class_name: str) -> "ModeGraphModule":
        """The module over ``root``'s submodules, in ``root``'s mode and its submodules' modes."""
        modes = _modes(root)
        module = cls(root, train_graph, eval_graph, class_name=class_name)
        set_modes(module, modes)
        for name, sub in root.named_modules():  # the shared submodules: __init__ put them in training
            sub.training = modes[name]
        return module

    def use_mode(self, training: bool) -> "ModeGraphModule":
        """Runs the graph of ``training``'s mode from now on: this module's own flag and graph only,
        never its submodules' (they are the model's, shared, and keep their own modes; ``train()``
        would set them all).

        Args:
            training (bool): True for the training graph.

        Returns:
            ModeGraphModule: ``self``.
        """
        set_modes(self, {"": bool(training)})
        return self

    def _deepcopy_init(self) -> Callable[..., None]:
        name = type(self).__name__

        def init(module: ModeGraphModule, root: nn.Module, train_graph: fx.Graph, eval_graph: fx.Graph) -> None:
            ModeGraphModule.__init__(module, root, train_graph, eval_graph, class_name=name)

        return init

    def __deepcopy__(self, memo: dict[int, Any]) -> "ModeGraphModule":
        modes = _modes(self)
        copied = super().__deepcopy__(memo)
        set_modes(copied, modes)
        return copied

    def __reduce__(self) -> tuple[Any, ...]:
        name = type(self).__name__
        graphs = tuple(fx.GraphModule(self, copy.deepcopy(g), name) for g in (self.train_graph, self.eval_graph))
        return (_rebuild, (graphs, _modes(self), name))
