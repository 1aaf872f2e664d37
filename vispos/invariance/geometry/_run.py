"""Running a padding-invariant graph: each batch's paddings in, each level's padding out.

:class:`InvariantRunner` holds what :func:`vispos.invariance.rewrite._rewrite.make_padding_invariant`
learnt of a graph (its :class:`~vispos.invariance.geometry._geometry.Geometry` and the geometry of each
output) and, per batch, replays the convolution arithmetic on the items' boxes, hands the graph
every feature map's :class:`~vispos.Padding` and pairs each output with its own.
The :class:`~vispos.backbones.Joiner`'s projections run through it too, with DETR's nearest rule
for a mask that has no boxes.

References:
    Dumoulin and Visin, A guide to convolution arithmetic for deep learning, 2016; Zhu et al.,
    Deformable DETR, ICLR 2021 (``input_proj``: 1x1 / 3x3 stride-2 convolutions + GroupNorm).
"""

from __future__ import annotations

from operator import add
from typing import Any

from torch import nn
from torch.utils import _pytree as pytree

from ... import _tracing
from ...nested_tensor import NestedTensor
from ...padding import Padding, _masks
from ._geometry import Geometry

__all__ = ["InvariantRunner"]


def _box_spans(starts, sizes, canvas) -> tuple:
    """``(starts, stops)`` of boxes that :meth:`Geometry.boxes` computed (host ints, already in the
    canvas), as :meth:`Padding.from_sizes` builds them, without checking them again: an item with
    no valid cell gets the canonical empty box ``(0, .., 0)``."""
    if not any(0 in size for size in sizes):
        return tuple(starts), tuple([tuple(map(add, start, size)) for start, size in zip(starts, sizes)])
    box_starts, box_stops = [], []
    for start, size in zip(starts, sizes):
        if 0 in size:
            empty = tuple(0 for _ in canvas)
            box_starts.append(empty)
            box_stops.append(empty)
        else:
            box_starts.append(tuple(start))
            box_stops.append(tuple(map(add, start, size)))
    return tuple(box_starts), tuple(box_stops)


def _box_paddings(padding: Padding, boxes: list, device, own: tuple | None = None) -> list[Padding]:
    """``padding`` and one rectangular padding per entry of ``boxes`` (see :func:`_box_spans`),
    the same object for the same boxes and canvas (many windows leave the boxes as they were), with
    the masks of the distinct ones built at once: their tables travel to the device in one transfer
    (:func:`vispos.padding._masks.boxes_masks`), so a batch's masks cost one copy and ``n - 1``
    kernels each on a GPU, for any batch. ``own``: ``padding``'s ``(starts, sizes, spatial)`` when
    the caller has them."""
    if own is None:
        own = (padding.starts, padding.sizes, padding.spatial)
    # the same tuple is the same boxes (Geometry.boxes shares them between ids): looked up by
    # identity first, by value (a hash of every item) once per distinct tuple
    slot_of: dict[int, int] = {}  # id(entry of boxes) -> index into spans (-1: padding itself)
    index_of: dict = {}  # boxes -> index into spans
    spans: list = []  # per distinct boxes: (starts, stops, canvas)
    slots = []
    for key in boxes:
        slot = slot_of.get(id(key))
        if slot is None:
            slot = index_of.get(key)
            if slot is None:
                if key == own:
                    slot = -1
                else:
                    slot = len(spans)
                    starts, sizes, canvas = key
                    spans.append((*_box_spans(starts, sizes, canvas), tuple(canvas)))
                index_of[key] = slot
            slot_of[id(key)] = slot
        slots.append(slot)
    if spans and _tracing.host_facts(device):
        masks = _masks.boxes_masks(spans, device)
    else:
        masks = [None] * len(spans)
    built = [Padding._make("rectangular", len(starts), canvas, device, starts, stops, mask)
             for (starts, stops, canvas), mask in zip(spans, masks)]
    return [padding] + [padding if slot < 0 else built[slot] for slot in slots]


class InvariantRunner:
    """Runs a rewritten graph on a :class:`~vispos.NestedTensor` and pairs each output with its
    padding (see :func:`make_padding_invariant`)."""

    def __init__(self, geometry: Geometry, outputs: dict[str, list[int]]) -> None:
        self.geometry, self.outputs = geometry, outputs

    def paddings(self, padding: Padding, nearest: bool = False) -> list[Padding]:
        """The padding of every geometry id (id 0, the input's, is ``padding`` itself).

        Args:
            padding (Padding): the input's.
            nearest (bool): an arbitrary mask, which has no boxes, gives every map the input's mask
                resized to its canvas by DETR's nearest rule (:meth:`~vispos.Padding.resize`)
                instead of an error. Default False.

        Returns:
            list[Padding]: one per geometry id; boxes by convolution arithmetic for a rectangular
            padding, ``Padding.none`` of each canvas for a batch without padding.

        Raises:
            ValueError: an arbitrary mask without ``nearest``; as :meth:`Geometry.boxes` (an offset
                that is not a multiple of the stride, an item too small for the window).
        """
        kind = padding.kind
        if kind == "arbitrary" and not nearest:
            raise ValueError(
                "padding_invariant=True needs each item's box (a rectangular padding), got an arbitrary "
                "mask; build the batch with vispos.nested_tensor_from_tensor_list / PaddedCollate, or "
                "Padding.from_sizes, or Padding.from_mask(mask, classify=True) for a box mask"
            )
        device = padding.device
        if kind == "rectangular":
            own = (padding.starts, padding.sizes, padding.spatial)
            boxes = self.geometry.boxes(*own)
            return _box_paddings(padding, boxes[1:], device, own)
        canvases = [canvas for _, _, canvas in self.geometry.boxes((), (), padding.spatial)[1:]]
        if kind == "none":
            return [padding] + [Padding.none(padding.batch, canvas, device) for canvas in canvases]
        return [padding] + [padding.resize(canvas) for canvas in canvases]

    def __call__(self, body: nn.Module, x: NestedTensor) -> list[NestedTensor]:
        return self.run(body, x, body.training)

    def run(self, body, x: NestedTensor, training: bool, structured: bool = False) -> Any:
        """Runs ``body`` (the rewritten graph, or any callable ``body(tensors, paddings)``) on ``x``.

        Returns:
            list: each output in pytree order, a map as a NestedTensor with its padding, any other
            value (a per-item vector, a constant) as it is; with ``structured``, the graph's own
            output structure (tuple / list / dict) with those values in it.
        """
        padding = x.padding
        if padding.kind == "none":
            return _levels(self, training, body(x.tensors), None, structured)
        if _tracing.compiling():
            # the host work (convolution arithmetic on the boxes, the masks) runs outside the graph,
            # and the graph sees each map's padding as its mask alone: a new mix of item sizes on
            # the same canvas is new data for the same graph, not a recompile
            paddings, masks = _compiled_inputs(self, padding)
            return _levels(self, training, body(x.tensors, masks), paddings, structured)
        paddings = self.paddings(padding)
        return _levels(self, training, body(x.tensors, tuple(paddings)), paddings, structured)


def _levels(runner: InvariantRunner, training: bool, out, paddings: list[Padding] | None,
            structured: bool = False) -> Any:
    """Each output of the graph with the padding of its geometry id (``paddings`` None: a batch
    without padding); outputs without a geometry id as they are."""
    output_ids = runner.outputs.get("any") or runner.outputs["train" if training else "eval"]
    leaves, spec = pytree.tree_flatten(out)
    levels = []
    for t, geometry_id in zip(leaves, output_ids):
        if not isinstance(geometry_id, int):  # a per-item value or a constant
            levels.append(t)
            continue
        level = None if paddings is None else paddings[geometry_id]
        assert level is None or tuple(t.shape[2:]) == level.spatial, (tuple(t.shape), level)  # convolution arithmetic
        levels.append(NestedTensor(t, level))
    return pytree.tree_unflatten(levels, spec) if structured else levels


_levels = _tracing.outside_graph(_levels)


@_tracing.outside_graph
def _compiled_inputs(runner: InvariantRunner, padding: Padding) -> tuple[list[Padding], tuple[Padding, ...]]:
    """Outside a compiled graph: every map's padding (boxes on the host, masks built at once), and
    the same cells as arbitrary paddings of their masks alone (what the graph reads: tensors whose
    values change between batches, no host ints to guard on), the same object where the padding
    is the same."""
    paddings = runner.paddings(padding)
    as_masks: dict[int, Padding] = {}
    for p in paddings:
        if id(p) not in as_masks:
            as_masks[id(p)] = Padding._make("arbitrary", p.batch, p.spatial, p.device, mask=p.mask)
    return paddings, tuple(as_masks[id(p)] for p in paddings)
