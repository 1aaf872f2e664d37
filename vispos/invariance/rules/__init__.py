"""The rule book of padding invariance: one object (:class:`RuleBook`) holding a table of rules,
keyed by what a traced graph calls, and the tracer's policy; the global book is filled with every built-in entry, once, when
:mod:`vispos.invariance` is imported (it imports :mod:`._builtin` last, after the token runners
whose whole-model rules it registers).

:mod:`._rule` holds the rule types a user registers (:class:`InvarianceRule`, :class:`CellWise`,
:class:`PaddingAware`, :class:`Refuse`), :mod:`._book` the :class:`RuleBook` and the global
book's functions (:func:`register_invariance_rule`, :func:`rule_for`, :func:`default_rules`),
:mod:`._types` the built-in rule types, :mod:`._sized` the rule for a sum divided by a map's own
size, :mod:`._functions` the signatures of the functions and methods the table is keyed by,
:mod:`._builtin` every built-in entry and :mod:`._monai` MONAI's rows and tracing patches.
"""

from ._book import (  # noqa: F401
    CellWise, InvarianceRule, PaddingAware, Refuse, RewriteStep, RuleBook, as_book, classify_module, default_rules,
    register_invariance_rule, registered_functions, rule_for, rule_for_call,
)

__all__ = [
    "CellWise", "InvarianceRule", "PaddingAware", "Refuse", "RewriteStep", "RuleBook", "as_book", "classify_module",
    "default_rules", "register_invariance_rule", "registered_functions", "rule_for", "rule_for_call",
]
