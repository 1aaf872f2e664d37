"""The :class:`~vispos.backbones.Joiner`'s input projections with ``padding_invariant=True``, run by
the rule book of :mod:`vispos.invariance`, as every backbone is.

Each projection ``input_proj[k]`` (Deformable-DETR: a 1x1 convolution + GroupNorm per backbone
level; a 3x3 stride-2 convolution + GroupNorm per extra level) is a
:class:`vispos.invariance.InvariantProjection`: traced with vispos' tracer and rewritten by
:func:`vispos.invariance.make_graph_invariant`, so the convolution reads zeros outside each item,
GroupNorm takes each item's statistics over its valid cells, and the output's padding comes from
convolution arithmetic on each item's box. A mask without boxes (an arbitrary one) keeps DETR's
nearest rule for the output's padding, and the norms' mask fallback.

The graphs call the Joiner's own layers (the same module objects, never copies), and the Joiner
keeps them out of its submodules, so ``state_dict`` keys and ``repr`` stay the Joiner's; a
projection whose layers were replaced since is traced again.

References:
    Zhu et al., Deformable DETR, ICLR 2021 (``models/deformable_detr.py``: ``input_proj``);
    torch.fx (``GraphModule``).
"""

from __future__ import annotations

from torch import nn

from ..invariance import InvariantProjection

__all__ = ["InvariantProjection", "invariant_projections"]


def invariant_projections(
    input_proj: nn.ModuleList, num_axes: int, cached: list[InvariantProjection] | None
) -> list[InvariantProjection]:
    """The rewritten graph of every projection: ``cached`` where its layers are still those of
    ``input_proj``, else traced and rewritten again.

    Raises:
        ValueError: as :class:`~vispos.invariance.InvariantProjection`.
    """
    cached = list(cached or [])
    found = []
    for index, projection in enumerate(input_proj):
        old = cached[index] if index < len(cached) else None
        found.append(old if old is not None and old.fits(projection) else
                     InvariantProjection(input_proj, index, num_axes))
    return found
