"""Running a padding-invariant graph: each batch's paddings in, each level's padding out.

:class:`InvariantRunner` holds what :func:`vispos.invariance._rewrite.make_padding_invariant`
learnt of a graph (its :class:`~vispos.invariance._geometry.Geometry` and the geometry of each
output) and, per batch, replays the convolution arithmetic on the items' boxes, hands the graph
every feature map's :class:`~vispos.Padding` and pairs each output with its own.
:func:`window_padding` does the same for the :class:`~vispos.backbones.Joiner`'s extra levels.

References:
    Dumoulin and Visin, A guide to convolution arithmetic for deep learning, 2016; Zhu et al.,
    Deformable DETR, ICLR 2021 (``input_proj``: 1x1 / 3x3 stride-2 convolutions + GroupNorm).
"""

from __future__ import annotations

from torch import nn
from torch.utils import _pytree as pytree

from ..nested_tensor import NestedTensor
from ..padding import Padding
from ._geometry import Geometry, Window

__all__ = ["InvariantRunner", "window_padding"]


class InvariantRunner:
    """Runs a rewritten graph on a :class:`~vispos.NestedTensor` and pairs each output with its
    padding (see :func:`make_padding_invariant`)."""

    def __init__(self, geometry: Geometry, outputs: dict[str, list[int]]) -> None:
        self.geometry, self.outputs = geometry, outputs

    def paddings(self, padding: Padding) -> list[Padding | None]:
        """The padding of every geometry id."""
        kind = padding.kind
        if kind == "arbitrary":
            raise ValueError(
                "padding_invariant=True needs each item's box (a rectangular padding), got an arbitrary "
                "mask; build the batch with vispos.nested_tensor_from_tensor_list / PaddedCollate, or "
                "Padding.from_sizes, or Padding.from_mask(mask, classify=True) for a box mask"
            )
        boxes = self.geometry.boxes(padding.starts, padding.sizes, padding.spatial)
        device = padding.device
        return [
            Padding.from_sizes(sizes, canvas, starts=starts, device=device)
            for starts, sizes, canvas in boxes
        ]

    def __call__(self, body: nn.Module, x: NestedTensor) -> list[NestedTensor]:
        padding = x.padding
        if padding.kind == "none":
            out = body(x.tensors)
            return [NestedTensor(t, None) for t in pytree.tree_leaves(out)]
        paddings = self.paddings(padding)
        out = pytree.tree_leaves(body(x.tensors, tuple(paddings)))
        output_ids = self.outputs.get("any") or self.outputs["train" if body.training else "eval"]
        levels = []
        for t, geometry_id in zip(out, output_ids):
            level = paddings[geometry_id]
            assert tuple(t.shape[2:]) == level.spatial, (tuple(t.shape), level)  # convolution arithmetic
            levels.append(NestedTensor(t, level))
        return levels


def window_padding(padding: Padding, window: Window, layer: str) -> Padding | None:
    """The padding of a sliding window's output by convolution arithmetic on each item's box
    (None for an arbitrary mask, which has no box: the caller falls back to DETR's nearest rule).

    Raises:
        ValueError: as :meth:`Geometry.boxes` (an offset that is not a multiple of the stride, an
            item too small for the window).
    """
    if padding.kind == "arbitrary":
        return None
    geometry = Geometry(padding.n_spatial)
    geometry_id = geometry.child(0, window, layer)
    if padding.kind == "none":
        canvas = tuple(window.out_size(c, a) for a, c in enumerate(padding.spatial))
        return Padding.none(padding.batch, canvas, padding.device)
    starts, sizes, canvas = geometry.boxes(padding.starts, padding.sizes, padding.spatial)[geometry_id]
    return Padding.from_sizes(sizes, canvas, starts=starts, device=padding.device)
