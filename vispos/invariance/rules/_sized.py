"""The rule for a computation on features with a value read from a map's size: on a padded batch
that size is the canvas's, not the item's, so only one pattern is exact, a sum over every spatial
axis divided by that map's own ``H * W`` (``* D``), which becomes each item's mean.

Registered by :mod:`._builtin` for the divisions (``operator.truediv``, ``torch.div``,
``torch.true_divide``, ``x.div``, ``x.true_divide``) with :meth:`RuleBook.register_sized`; a call
without such an entry is refused with the same reason.

References:
    torch.ao.quantization ``backend_config`` (a pattern's handling as an entry of the table).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.fx as fx

from ._rule import InvarianceRule

__all__ = ["CANVAS_SIZE", "SumOverCanvas"]

#: why a computation on features with a canvas size is refused
CANVAS_SIZE = (
    "it computes on features with a value read from the size of a feature map (x.shape, x.size(), x.numel()), "
    "which on a padded batch is the canvas's size, not the item's; only a sum over every spatial axis divided by "
    "that map's own H * W is rewritten (to each item's mean). Compute the value from a fixed hyper-parameter, or "
    "use x.mean over the spatial axes")


@dataclass(frozen=True)
class SumOverCanvas(InvarianceRule):
    """``total / size``: ``total`` a sum over every spatial axis of a map, ``size`` that map's own
    spatial size, becomes each item's mean over its own cells; anything else is refused."""

    kind = "sized"

    def apply(self, step: Any, node: fx.Node, args: dict[str, Any]) -> None:
        if len(node.args) == 2 and not node.kwargs and step.mean_of_spatial_sum(node, *node.args):
            return
        step.refuse(node, CANVAS_SIZE)
