"""The rule book of padding invariance: one open table of rules, keyed by what a traced graph calls.

:mod:`._book` holds the table and its registration (:func:`register_invariance_rule`,
:func:`rule_for`), :mod:`._types` the built-in rule types, :mod:`._functions` the signatures of the
functions and methods the table is keyed by, :mod:`._builtin` every built-in row and :mod:`._monai`
MONAI's rows.
"""

from ._book import (  # noqa: F401
    InvarianceRule, RewriteStep, CellWise, PaddingAware, Refuse, register_invariance_rule, rule_for, rule_for_call, classify_module, registered_functions,
)

__all__ = ["InvarianceRule", "RewriteStep", "CellWise", "PaddingAware", "Refuse", "register_invariance_rule", "rule_for", "rule_for_call", "classify_module", "registered_functions"]
