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
from typing import Any, Callable

import torch.fx as fx
from torch import Tensor, nn
from torchvision.models.feature_extraction import DualGraphModule

__all__ = ["ModeGraphModule", "set_modes"]


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
