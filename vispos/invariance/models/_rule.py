"""The whole-model rule type: a model class (a detector, a segmenter) made exact as a whole by a
builder that wraps the model's own parts, looked up by :func:`~vispos.make_padding_invariant`.

A :class:`WholeModelRule` names its builder by module path and function name, so registering the
rule (by the model's dotted class name, in :mod:`vispos.invariance.rules._builtin`) imports neither
the model's package nor the builder's module: ``import vispos`` stays free of torchvision's
detection package and of transformers.

References:
    torch.ao.quantization ``backend_config`` (one table of patterns, registered as small config
    objects); torchvision ``models/detection/generalized_rcnn.py`` (a detector as a few parts).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from typing import Any

from torch import nn

from ..rules import InvarianceRule, RewriteStep, rule_for

__all__ = ["WholeModelRule", "whole_model_rule"]


@dataclass(frozen=True)
class WholeModelRule(InvarianceRule):
    """A model made padding invariant as a whole by ``builder(model, probe_size=...)``.

    Args:
        home (str): the module that holds the builder (imported on first use).
        builder (str): the builder's name in ``home``: ``builder(model, probe_size) -> nn.Module``,
            a module with the model's own call and output types that shares the model's
            parameters under their own names.

    Raises:
        TypeError: ``home`` or ``builder`` is not a str.

    References:
        torch.ao.quantization ``backend_config`` (patterns registered as small config objects).
    """

    home: str
    builder: str
    kind = "whole_model"

    def __post_init__(self) -> None:
        for name in ("home", "builder"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"WholeModelRule: {name} must be a str, got {type(getattr(self, name)).__name__}")

    def build(self, model: nn.Module, probe_size: Any = None) -> nn.Module:
        """The model wrapped by the rule's builder (see the class docstring)."""
        return getattr(import_module(self.home), self.builder)(model, probe_size=probe_size)

    def apply(self, step: RewriteStep, node: Any, args: dict[str, Any]) -> None:
        step.refuse(node, "a whole detector or segmenter inside another network (call "
                          "vispos.make_padding_invariant on the model itself)")


def whole_model_rule(model: Any, book: Any = None) -> WholeModelRule | None:
    """The :class:`WholeModelRule` of ``model``'s class (or of a base whose ``forward`` it keeps) in
    ``book`` (a rule book with ``rule_for``; default: the global one), or None."""
    if not isinstance(model, nn.Module):
        return None
    rule = book.rule_for(model) if book is not None and hasattr(book, "rule_for") else rule_for(model)
    return rule if isinstance(rule, WholeModelRule) else None
