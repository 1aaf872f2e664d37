"""Padding invariance: every item of a padded batch gets, on its own cells, what it gets alone.

One home for the rule book (:mod:`vispos.invariance.rules`: one :class:`RuleBook` object, the
global one from :func:`default_rules`, built when this package is imported with every built-in
entry, open to a user's own layers through :func:`register_invariance_rule` or, for one call, a
copy passed as ``make_padding_invariant(..., rules=book)``), the maths over valid cells (every item's statistics in one
masked reduction) and the rewrite of a traced network's graph.

The entry point is :func:`make_padding_invariant` (any 2D / 3D network, a whole MONAI
segmentation network or a classifier included). It is built from public steps, which the
backbone adapters (``padding_invariant=True``), the :class:`~vispos.backbones.Joiner`'s
projections and :mod:`vispos.monai`'s UNETR decoder use too:

* tracing: :func:`trace_features` (a model traced in training and eval mode into a
  :class:`ModeGraphModule`, cut at torchvision node names if asked), :func:`trace_dual` (a timm
  ``features_only`` model, hooked features included); :class:`UntraceableLayer` names a layer
  torch.fx cannot trace;
* rewriting and running: :func:`make_graph_invariant` (the graph rewritten by the rule book) and
  the :class:`InvariantRunner` it returns (each batch's paddings in, each map's padding out);
  :class:`InvariantProjection` (one submodule of an owner, traced, rewritten and run);
  :class:`Window` (the geometry a rule states); :func:`refuse_swin` (a Swin layer that torch.fx
  cannot reach, refused by name before tracing);
* hooks the rewritten graph would skip: :func:`check_graph_hooks`, :func:`refuse_unrun_hooks`,
  :func:`has_hooks`;
* token models (vision transformers, made exact as a whole): :class:`TokenModelRule`, run by
  :class:`TokenRunner` (padded) and :class:`PackedRunner` (every item's tokens in one sequence),
  with the per-item helpers a rule uses: :func:`item_grids`, :func:`item_pos_embeds`,
  :func:`item_rope_embeds`, :func:`on_canvas`, :func:`key_padding_keep`.

Modules whose names start with ``_`` are private: only this package imports them. The tracing
names (they import torchvision) are imported on first use (PEP 562).

References:
    Carion et al., End-to-End Object Detection with Transformers, ECCV 2020 (padded batches);
    torch.fx; torchvision ``models/feature_extraction.py``.
"""

from .tokens import _vit  # noqa: F401
from ._network import PaddingInvariant, make_graph_invariant, make_padding_invariant
from .tokens._tokens import (
    TokenModelRule, TokenRunner, has_hooks, item_grids, item_pos_embeds, item_rope_embeds, key_padding_keep, on_canvas,
)
from .rules import (
    CellWise, InvarianceRule, PaddingAware, Refuse, RewriteStep, RuleBook, default_rules, register_invariance_rule, rule_for,
)
from .geometry._geometry import Window
from .tokens._packed import PackedRunner
from .geometry._run import InvariantRunner
from .tokens._swin import refuse_swin
from .rules import _builtin  # noqa: F401,E402  (fills the global rule book with every built-in entry, once)

__all__ = [
    "CellWise", "InvarianceRule", "InvariantProjection", "InvariantRunner", "ModeGraphModule", "PackedRunner",
    "PaddingAware", "PaddingInvariant", "Refuse", "RewriteStep", "RuleBook", "TokenModelRule", "TokenRunner",
    "UntraceableLayer", "Window", "check_graph_hooks", "default_rules", "has_hooks", "item_grids", "item_pos_embeds",
    "item_rope_embeds", "key_padding_keep", "make_graph_invariant", "make_padding_invariant", "on_canvas",
    "refuse_swin", "refuse_unrun_hooks", "register_invariance_rule", "rule_for", "trace_dual", "trace_features",
]

#: the public names whose modules import the FX tracer (torchvision): imported on first use, so that
#: ``import vispos.invariance`` (and an encoder config) does not import torchvision
_ON_FIRST_USE = {
    "InvariantProjection": ".geometry._projection", "ModeGraphModule": ".tracing._mode_graphs", "UntraceableLayer": ".tracing._trace",
    "check_graph_hooks": ".tracing._mode_graphs", "refuse_unrun_hooks": ".tracing._mode_graphs", "trace_dual": ".tracing._trace",
    "trace_features": ".tracing._trace",
}


def __getattr__(name: str):
    home = _ON_FIRST_USE.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(home, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
