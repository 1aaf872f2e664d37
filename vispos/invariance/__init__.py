"""Padding invariance: every item of a padded batch gets, on its own cells, what it gets alone.

One home for the rule book (:mod:`vispos.invariance.rules`, open to a user's own layers through
:func:`register_invariance_rule`), the maths over valid cells (every item's statistics in one
masked reduction) and the rewrite of a traced backbone's graph. The backbones'
``padding_invariant=True``, the :class:`~vispos.backbones.Joiner`'s projections and
:mod:`vispos.monai`'s decoder all use it.

References:
    Carion et al., End-to-End Object Detection with Transformers, ECCV 2020 (padded batches).
"""

from . import _vit  # noqa: F401
from ._network import PaddingInvariant, make_padding_invariant
from ._tokens import TokenModelRule
from .rules import CellWise, InvarianceRule, PaddingAware, Refuse, RewriteStep, register_invariance_rule, rule_for
from . import _builtin_rules  # noqa: F401,E402  (registers every built-in entry of the one rule table)

__all__ = ["CellWise", "InvarianceRule", "PaddingAware", "PaddingInvariant", "Refuse", "RewriteStep",
           "TokenModelRule", "make_padding_invariant", "register_invariance_rule", "rule_for"]
