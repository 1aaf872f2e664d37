"""FX tracing of a backbone module (timm's ``features_only`` models, any ``nn.Module``) into a
train / eval pair of graphs, each node annotated with the module it came from.

torchvision's adapters get their graphs from ``create_feature_extractor``; a timm feature model
(``FeatureListNet``) is an ordinary module, traced here the same way: once in training mode and
once in eval mode (code that branches on ``self.training``, such as timm's ``DropPath``, bakes the
branch into the graph), in torchvision's ``DualGraphModule``, which switches graphs with
``train()`` / ``eval()``. The module hierarchy and so the ``state_dict`` keys stay those of the
traced module. Leaves: torch.nn's own modules (FX's default), every module vispos has a rule for
(:func:`vispos.backbones._invariant_rules.classify_module`), and timm's "do not trace" modules and
functions (``timm.models._features_fx``), as timm's own FX feature extraction uses them.

References:
    torch.fx (``Tracer``, ``GraphModule``); torchvision ``models/feature_extraction.py``
    (``DualGraphModule``); timm ``models/_features_fx.py``.
"""

from __future__ import annotations

from typing import Any

import torch.fx as fx
from torch import nn

from ..invariance.rules import classify_module

__all__ = ["trace_dual"]


def _timm_notrace() -> tuple[tuple[type, ...], tuple[Any, ...]]:
    try:
        from timm.models._features_fx import get_notrace_functions, get_notrace_modules
    except ImportError:  # pragma: no cover - timm is a dependency; older releases lack the helpers
        return (), ()
    return tuple(get_notrace_modules()), tuple(get_notrace_functions())


class PathTracer(fx.Tracer):
    """An FX tracer that keeps vispos' rule-book modules and timm's untraceable modules as leaves
    and records on every node (``node.meta["vispos_path"]``) the module it was traced in."""

    def __init__(self, n_spatial: int = 2) -> None:  # a default: GraphModule re-traces on unpickling
        leaves, functions = _timm_notrace()
        super().__init__(autowrap_functions=functions)
        self._leaves, self._n_spatial = leaves, n_spatial
        self._path: list[str] = []

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if isinstance(m, self._leaves) or classify_module(m, self._n_spatial)[0] != "refuse":
            return not isinstance(m, nn.Sequential)
        return super().is_leaf_module(m, module_qualified_name)

    def call_module(self, m: nn.Module, forward: Any, args: tuple, kwargs: dict) -> Any:
        self._path.append(self.path_of_module(m))
        try:
            return super().call_module(m, forward, args, kwargs)
        finally:
            self._path.pop()

    def create_node(self, *args: Any, **kwargs: Any) -> fx.Node:
        node = super().create_node(*args, **kwargs)
        node.meta["vispos_path"] = self._path[-1] if self._path else ""
        return node


def trace_dual(module: nn.Module, n_spatial: int) -> fx.GraphModule:
    """``module`` traced in training and in eval mode, as one torchvision ``DualGraphModule`` that
    shares ``module``'s submodules (parameters and buffers are the same objects).

    Raises:
        ValueError: the module cannot be traced symbolically (control flow on tensor values).
    """
    from torchvision.models.feature_extraction import DualGraphModule

    was_training = module.training
    graphs = {}
    try:
        for mode in (True, False):
            module.train(mode)
            try:
                graphs[mode] = PathTracer(n_spatial).trace(module)
            except Exception as exc:  # FX raises TraceError, TypeError, RuntimeError ...
                raise ValueError(
                    f"padding_invariant=True needs the backbone traced with torch.fx, which failed for "
                    f"{type(module).__name__}: {type(exc).__name__}: {exc}"
                ) from exc
    finally:
        module.train(was_training)
    gm = DualGraphModule(module, graphs[True], graphs[False], class_name=type(module).__name__)
    gm.train(was_training)
    return gm
