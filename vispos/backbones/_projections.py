"""The :class:`~vispos.backbones.Joiner`'s input projections with ``padding_invariant=True``, run by
the rule book of :mod:`vispos.invariance`, as every backbone is.

Each projection ``input_proj[k]`` (Deformable-DETR: a 1x1 convolution + GroupNorm per backbone
level; a 3x3 stride-2 convolution + GroupNorm per extra level) is traced with vispos' tracer and
rewritten by :func:`~vispos.invariance._rewrite.make_padding_invariant`: the convolution reads
zeros outside each item, GroupNorm takes each item's statistics over its valid cells, and the
output's padding comes from convolution arithmetic on each item's box. A mask without boxes (an
arbitrary one) keeps DETR's nearest rule for the output's padding, and the norms' mask fallback.

:class:`InvariantProjection` holds the rewritten graph of one projection. The graph calls the
Joiner's own layers (the same module objects, never copies), and the Joiner keeps it out of its
submodules, so ``state_dict`` keys and ``repr`` stay the Joiner's; a projection whose layers were
replaced since is traced again.

References:
    Zhu et al., Deformable DETR, ICLR 2021 (``models/deformable_detr.py``: ``input_proj``);
    torch.fx (``GraphModule``).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn
from torch.utils import _pytree as pytree

from ..invariance._stem import register_stem_tracer
from ..nested_tensor import NestedTensor
from ..invariance._mode_graphs import has_hooks, refuse_unrun_hooks, set_modes, unrun_hooks
from ..invariance._trace import make_invariant, trace_features

__all__ = ["InvariantProjection", "invariant_projections"]


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
    """One projection of a Joiner (or another owner's convolutional submodule, such as a vision
    transformer's convolutional patch stem), traced and rewritten by the rule book.

    It is traced twice, in training and in eval mode (as torchvision's feature extractor traces a
    backbone), so code that branches on ``self.training`` inside a traced-through layer (timm's
    ``DropPath``, a custom layer) runs the branch of the mode the projection is in at each call.
    The graphs hold the layers' parameters and buffers as they were when traced: :meth:`fits`
    tells when any was replaced (``load_state_dict(assign=True)``, a new ``nn.Parameter``), and
    the owner traces again.

    Args:
        parent (nn.Module): the module that holds it (the Joiner's ``input_proj``).
        name (int or str): its index or attribute name in ``parent``.
        num_axes (int): spatial axes of the levels (2 or 3).
        label (str): ``parent``'s name in messages (default ``"input_proj"``).

    Raises:
        ValueError: a layer of the projection that cannot be made exact, or that torch.fx cannot
            trace (named).
    """

    def __init__(self, parent: nn.Module, name: int | str, num_axes: int, label: str = "input_proj") -> None:
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
        return unrun_hooks(self.graph, self.graph.graph, modules)

    def __call__(self, level: NestedTensor) -> NestedTensor:
        """The projection of ``level`` (the graph of the projection's current mode) and its padding
        (boxes by convolution arithmetic; DETR's nearest rule for an arbitrary mask)."""
        training = self.module.training
        set_modes(self.graph, {"": training})
        if any(has_hooks(m) for m in self.layers):  # names are built only when a hook is there
            refuse_unrun_hooks(self.graph, ((f"{self.label}.{n}".rstrip("."), m) for n, m in self.module.named_modules()),
                               f"padding_invariant=True runs {self.label}")
        paddings = self.runner.paddings(level.padding, nearest=True)
        (out,) = pytree.tree_leaves(self.graph(level.tensors, tuple(paddings)))
        outputs = self.runner.outputs.get("any") or self.runner.outputs["train" if training else "eval"]
        return NestedTensor(out, paddings[outputs[0]])


def invariant_projections(
    input_proj: nn.ModuleList, num_axes: int, cached: list[InvariantProjection] | None
) -> list[InvariantProjection]:
    """The rewritten graph of every projection: ``cached`` where its layers are still those of
    ``input_proj``, else traced and rewritten again.

    Raises:
        ValueError: as :class:`InvariantProjection`.
    """
    cached = list(cached or [])
    found = []
    for index, projection in enumerate(input_proj):
        old = cached[index] if index < len(cached) else None
        found.append(old if old is not None and old.fits(projection) else
                     InvariantProjection(input_proj, index, num_axes))
    return found


register_stem_tracer(lambda embed: InvariantProjection(embed, "proj", 2, label="patch_embed"))
