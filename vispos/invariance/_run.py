"""Running a padding-invariant graph: each batch's paddings in, each level's padding out.

:class:`InvariantRunner` holds what :func:`vispos.invariance._rewrite.make_padding_invariant`
learnt of a graph (its :class:`~vispos.invariance._geometry.Geometry` and the geometry of each
output) and, per batch, replays the convolution arithmetic on the items' boxes, hands the graph
every feature map's :class:`~vispos.Padding` and pairs each output with its own.
:class:`InvariantProjection` is one submodule of an owner traced and rewritten on its own and run
through it: the :class:`~vispos.backbones.Joiner`'s projections (with DETR's nearest rule for a
mask that has no boxes) and a vision transformer's convolutional patch stem.

References:
    Dumoulin and Visin, A guide to convolution arithmetic for deep learning, 2016; Zhu et al.,
    Deformable DETR, ICLR 2021 (``input_proj``: 1x1 / 3x3 stride-2 convolutions + GroupNorm);
    torch.fx (``GraphModule``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.utils import _pytree as pytree

from .. import _tracing
from ..nested_tensor import NestedTensor
from ..padding import Padding, _masks
from ._geometry import Geometry

__all__ = ["InvariantProjection", "InvariantRunner"]


def _box_padding(starts, sizes, canvas, device) -> Padding:
    """The rectangular padding of boxes that :meth:`Geometry.boxes` computed (host ints, already in
    the canvas), as :meth:`Padding.from_sizes` builds it, without checking them again: an item
    with no valid cell gets the canonical empty box ``(0, .., 0)``."""
    empty = tuple(0 for _ in canvas)
    box_starts, box_stops = [], []
    for start, size in zip(starts, sizes):
        if 0 in size:
            box_starts.append(empty)
            box_stops.append(empty)
        else:
            box_starts.append(tuple(start))
            box_stops.append(tuple(s + n for s, n in zip(start, size)))
    return Padding._make("rectangular", len(box_starts), tuple(canvas), device, tuple(box_starts), tuple(box_stops))


def _box_paddings(padding: Padding, boxes: list, device) -> list[Padding]:
    """``padding`` and one rectangular padding per entry of ``boxes`` (as :func:`_box_padding`),
    the same object for the same boxes and canvas (many windows leave the boxes as they were), with
    the masks of the distinct ones built at once: their tables travel to the device in one transfer
    (:func:`vispos.padding._masks.boxes_masks`), so a batch's masks cost one copy and ``n - 1``
    kernels each on a GPU, for any batch."""
    distinct: dict = {}
    own = (padding.starts, padding.sizes, padding.spatial)
    for key in boxes:
        starts, sizes, canvas = key
        if key not in distinct and key != own:
            distinct[key] = _box_padding(starts, sizes, canvas, device)
    if distinct and _tracing.host_facts(device):
        built = list(distinct.values())
        masks = _masks.boxes_masks([(p.starts, p.stops, p.spatial) for p in built], device)
        for key, mask in zip(distinct, masks):
            p = distinct[key]
            distinct[key] = Padding._make("rectangular", p.batch, p.spatial, device, p.starts, p.stops, mask)
    return [padding] + [distinct[key] if key in distinct else padding for key in boxes]


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
            boxes = self.geometry.boxes(padding.starts, padding.sizes, padding.spatial)
            return _box_paddings(padding, boxes[1:], device)
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


class _Projection(nn.Module):
    """``getattr(parent, name)`` as a module of its own, registered under ``label``, so that its
    traced layers keep the owner's names (``input_proj.3.0``, ``patch_embed.proj.1``) in the rule
    book's messages."""

    def __init__(self, parent: nn.Module, name: str, label: str) -> None:
        super().__init__()
        self.label, self.name = label, name
        self.add_module(label, parent)

    def forward(self, x: Tensor) -> Tensor:
        return getattr(getattr(self, self.label), self.name)(x)


class InvariantProjection:
    """One convolutional submodule of an owner (a :class:`~vispos.backbones.Joiner`'s projection
    ``input_proj[k]``, a vision transformer's convolutional patch stem ``patch_embed.proj``) traced
    and rewritten by the rule book, run on a :class:`~vispos.NestedTensor`.

    It is traced twice, in training and in eval mode (as torchvision's feature extractor traces a
    backbone), so code that branches on ``self.training`` inside a traced-through layer (timm's
    ``DropPath``, a custom layer) runs the branch of the mode the submodule is in at each call.
    The graphs call the owner's own layers (the same module objects, never copies) and are kept
    out of the owner's submodules, so its ``state_dict`` keys and ``repr`` stay its own. The graphs
    hold the layers' parameters and buffers as they were when traced: :meth:`fits` tells when any
    was replaced (``load_state_dict(assign=True)``, a new ``nn.Parameter``), and the owner traces
    again.

    Args:
        parent (nn.Module): the module that holds it (the Joiner's ``input_proj``).
        name (int or str): its index or attribute name in ``parent``.
        num_axes (int): spatial axes of its input (2 or 3).
        label (str): ``parent``'s name in messages (default ``"input_proj"``).

    Shape:
        - input: NestedTensor ``(B, C_in, *S)``, any padding (an arbitrary mask gives the output
          the input's mask resized by DETR's nearest rule).
        - output: NestedTensor ``(B, C_out, *S_out)``, its padding by convolution arithmetic on each
          item's box.

    Raises:
        ValueError: a layer that cannot be made exact, or that torch.fx cannot trace (named); at a
            call, a hook on one of its modules that the rewritten graph would not run.

    References:
        Zhu et al., Deformable DETR, ICLR 2021 (``input_proj``); Xiao et al., Early Convolutions
        Help Transformers See Better, NeurIPS 2021 (convolutional patch stems).
    """

    def __init__(self, parent: nn.Module, name: int | str, num_axes: int, label: str = "input_proj") -> None:
        from ._trace import make_invariant, trace_features  # the tracer rewrites through this module

        module = getattr(parent, str(name))
        self.module, self.layers = module, tuple(module.modules())
        self.label = f"{label}.{name}"  # the projection's own name, in messages
        self.tensors = tuple(module.parameters()) + tuple(module.buffers())
        root = _Projection(parent, str(name), label)
        self.graph = trace_features(root, num_axes, class_name=type(module).__name__)
        self.runner = make_invariant(self.graph, num_axes)

    def fits(self, projection: nn.Module) -> bool:
        """Whether ``projection`` still holds the layers, parameters and buffers this graph calls."""
        layers = tuple(projection.modules())
        tensors = tuple(projection.parameters()) + tuple(projection.buffers())
        return (len(layers) == len(self.layers) and all(a is b for a, b in zip(layers, self.layers))
                and len(tensors) == len(self.tensors) and all(a is b for a, b in zip(tensors, self.tensors)))

    def unhooked(self, modules: Any) -> list[tuple[str, nn.Module]]:
        """The ``(name, module)`` pairs of ``modules`` that carry forward or backward hooks but that
        the graph of the current mode neither calls as modules nor runs inside a module it calls
        (it runs their code inline), so their hooks would not run."""
        from ._mode_graphs import unrun_hooks

        return unrun_hooks(self.graph, self.graph.graph, modules)

    def __call__(self, level: NestedTensor) -> NestedTensor:
        """The projection of ``level`` (the graph of the projection's current mode) and its padding
        (boxes by convolution arithmetic; DETR's nearest rule for an arbitrary mask)."""
        from ._mode_graphs import refuse_unrun_hooks
        from ._tokens import has_hooks

        training = self.module.training
        self.graph.use_mode(training)
        if any(has_hooks(m) for m in self.layers):  # names are built only when a hook is there
            refuse_unrun_hooks(self.graph, ((f"{self.label}.{n}".rstrip("."), m) for n, m in self.module.named_modules()),
                               f"padding_invariant=True runs {self.label}")
        paddings = self.runner.paddings(level.padding, nearest=True)
        (out,) = pytree.tree_leaves(self.graph(level.tensors, tuple(paddings)))
        outputs = self.runner.outputs.get("any") or self.runner.outputs["train" if training else "eval"]
        return NestedTensor(out, paddings[outputs[0]])
