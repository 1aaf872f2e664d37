"""One convolutional submodule of an owner traced, rewritten by the rule book and run on a padded
batch: the :class:`~vispos.backbones.Joiner`'s projections and a vision transformer's
convolutional patch stem (:mod:`vispos.invariance.tokens._stem`).

References:
    Zhu et al., Deformable DETR, ICLR 2021 (``input_proj``: 1x1 / 3x3 stride-2 convolutions +
    GroupNorm); Xiao et al., Early Convolutions Help Transformers See Better, NeurIPS 2021;
    torch.fx (``GraphModule``).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn
from torch.utils import _pytree as pytree

from ...nested_tensor import NestedTensor
from ..tracing._mode_graphs import refuse_unrun_hooks, unrun_hooks
from ..tokens._tokens import has_hooks
from ..tracing._trace import make_invariant, trace_features

__all__ = ["InvariantProjection"]


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
        self.graph.use_mode(training)
        if any(has_hooks(m) for m in self.layers):  # names are built only when a hook is there
            refuse_unrun_hooks(self.graph, ((f"{self.label}.{n}".rstrip("."), m) for n, m in self.module.named_modules()),
                               f"padding_invariant=True runs {self.label}")
        paddings = self.runner.paddings(level.padding, nearest=True)
        (out,) = pytree.tree_leaves(self.graph(level.tensors, tuple(paddings)))
        outputs = self.runner.outputs.get("any") or self.runner.outputs["train" if training else "eval"]
        return NestedTensor(out, paddings[outputs[0]])
