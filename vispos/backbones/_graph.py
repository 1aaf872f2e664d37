"""torchvision feature extraction as padded levels: the machinery shared by the 2D / 3D adapters.

:class:`GraphBackbone` cuts a model at torchvision node names
(:func:`vispos.invariance.trace_features`, as torchvision's ``create_feature_extractor``
does) and holds what :class:`~vispos.backbones.TorchvisionBackbone` (images) and
:class:`~vispos.backbones.VolumeBackbone` (volumes) share: the checkpoint report, frozen batch
norm and stages, stem adaptation and the channels and strides measured by one probe forward.
Those two classes only build the model.

Private module: :class:`GraphBackbone` is a base class, not part of the public API.

References:
    torchvision ``models/feature_extraction.py``; Carion et al., DETR ``models/backbone.py``
    (``return_interm_layers``, ``FrozenBatchNorm2d``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any, Union

import torch
from torch import nn

from .._checks import check_bool, check_int
from ._batch_norm import freeze_batch_norm
from ._checkpoints import load_checkpoint_state, load_state_with_report
from ._freezing import freeze_through
from ._stems import adapt_stem, first_conv
from ..invariance import UntraceableLayer, make_graph_invariant, refuse_swin, trace_features
from .base import BackboneAdapter

__all__ = ["GraphBackbone", "ReturnNodes", "check_return_nodes", "measure_levels"]

ReturnNodes = Union[Sequence[str], Mapping[str, str]]

_STAGE = re.compile(r"^layer(\d+)$")


def check_return_nodes(return_nodes: Any) -> dict[str, str]:
    """``return_nodes`` as a ``{node: output name}`` dict (a list names outputs ``"0"``, ``"1"``, ...).

    Raises:
        TypeError: neither a list of str nor a mapping of str to str, or empty.
    """
    if isinstance(return_nodes, Mapping):
        nodes = dict(return_nodes)
    elif isinstance(return_nodes, Sequence) and not isinstance(return_nodes, str):
        nodes = {str(n): str(i) for i, n in enumerate(return_nodes)}
    else:
        raise TypeError(
            "return_nodes must be a list of node names or a {node: output name} mapping, got "
            f"{return_nodes!r}"
        )
    if not nodes or not all(isinstance(k, str) and isinstance(v, str) for k, v in nodes.items()):
        raise TypeError(f"return_nodes must be a non-empty list or mapping of str, got {return_nodes!r}")
    return nodes


class GraphBackbone(BackboneAdapter):
    """Shared machinery of the torchvision adapters (2D and 3D).

    Subclasses build ``model`` (a private copy the base may modify) and call ``_setup``.
    """

    num_axes: int = 2
    _probe: tuple[int, ...] = (128, 128)

    def _setup(
        self,
        model: nn.Module,
        return_nodes: dict[str, str],
        *,
        in_chans: int | None,
        weights: Any,
        checkpoint_path: str | None,
        train_backbone: bool,
        frozen_stages: int,
        frozen_batch_norm: bool,
        padding_invariant: bool = False,
    ) -> None:
        padding_invariant = check_bool(padding_invariant, "padding_invariant")
        self.weights = weights
        self.checkpoint_path = checkpoint_path
        self.train_backbone = train_backbone
        self.frozen_stages = frozen_stages
        self.frozen_batch_norm = frozen_batch_norm
        if padding_invariant:  # before tracing: torch.fx cannot trace MONAI's Swin encoder
            refuse_swin(model)
        try:
            self.body = trace_features(model, self.num_axes, return_nodes=return_nodes)
        except UntraceableLayer as exc:
            raise ValueError(
                f"{type(model).__name__} cannot be cut at return_nodes {list(return_nodes)}: feature "
                f"extraction traces it with torch.fx, and {exc}. Return a node before this layer, or "
                "make the layer traceable"
            ) from exc
        self.return_nodes = dict(return_nodes)
        stem_name, stem = first_conv(self.body)
        want = stem.in_channels if in_chans is None else check_int(in_chans, "in_chans", minimum=1)
        self.load_report: dict[str, Any] | None = None
        if checkpoint_path is not None:
            state = load_checkpoint_state(checkpoint_path)
            key = f"{stem_name}.weight"
            ckpt_stem = next(
                (v for k, v in state.items() if k == key or k.endswith("." + key)), None
            )
            if ckpt_stem is not None and ckpt_stem.dim() > 1 and ckpt_stem.shape[1] == want:
                adapt_stem(self.body, want)  # the file was trained on want channels already
            self.load_report = load_state_with_report(
                self.body, state, source=os.fspath(checkpoint_path)
            )
        adapt_stem(self.body, want)
        self.in_chans = want
        if frozen_batch_norm:
            freeze_batch_norm(self.body, num_axes=self.num_axes)
        if not train_backbone:
            freeze_through(self.body, None)
        elif frozen_stages >= 0:
            freeze_through(self.body, self._stage_boundary(frozen_stages))
        channels, strides = measure_levels(
            lambda t: list(self.body(t).values()), self.body, self.in_chans, self._probe
        )
        self.num_channels = channels
        self.level_strides = strides  # per axis, tensor axis order
        if padding_invariant:  # rewrites both graphs of torchvision's DualGraphModule in place
            self._invariant = make_graph_invariant(self.body, num_axes=self.num_axes)

    def _own_repr(self) -> str:
        """Subclass hook: the constructor arguments only that subclass has."""
        return ""

    def extra_repr(self) -> str:
        own = self._own_repr()
        return (
            f"name_or_model={self.model_name!r}, return_nodes={list(self.return_nodes)}, "
            f"in_chans={self.in_chans}, {own + ', ' if own else ''}weights={self.weights!r}, "
            f"checkpoint_path={self.checkpoint_path!r}, train_backbone={self.train_backbone}, "
            f"frozen_stages={self.frozen_stages}, frozen_batch_norm={self.frozen_batch_norm}, "
            f"padding_invariant={self.padding_invariant}, num_channels={self.num_channels}, "
            f"strides={self.strides}"
        )

    def _stage_boundary(self, k: int) -> str:
        """Stage 0 is everything before ``layer1``; stage ``k`` ends with ``layer<k>``."""
        tops = [n for n, _ in self.body.named_children()]
        stages = [n for n in tops if _STAGE.match(n)]
        if not stages:
            raise ValueError(
                f"frozen_stages={k} needs ResNet-style stages named layer1, layer2, ...; this model's "
                f"top-level modules are {tops}. Use train_backbone=False, or requires_grad_(False) "
                "on the modules to freeze"
            )
        if k == 0:
            first = tops.index(stages[0])
            if first == 0:
                raise ValueError("frozen_stages=0: the model has no stem before layer1")
            return tops[first - 1]
        if k > len(stages):
            raise ValueError(f"frozen_stages={k} but the feature model has stages {stages}")
        return stages[k - 1]

    @property
    def strides(self) -> list[Any]:
        """Stride of each level: an int when all axes agree, else a per-axis tuple."""
        return [s[0] if len(set(s)) == 1 else tuple(s) for s in self.level_strides]

    def _features(self, tensors):
        return list(self.body(tensors).values())


@torch.no_grad()
def measure_levels(
    forward, module: nn.Module, in_chans: int, probe: Sequence[int]
) -> tuple[list[int], list[tuple[int, ...]]]:
    """Runs ``forward`` once on zeros ``(1, in_chans, *probe)`` in eval mode and reads each output's
    channels and per-axis stride (``probe / output size``). Training mode is restored after.

    Returns:
        ``(channels, strides)``: one int and one tuple of ``len(probe)`` ints per level.
    """
    was_training = module.training
    module.eval()
    try:
        param = next(iter(module.parameters()), None)
        buf = next(iter(module.buffers()), None)
        ref = param if param is not None else buf
        kwargs = {} if ref is None else {"device": ref.device, "dtype": ref.dtype}
        outs = forward(torch.zeros(1, in_chans, *probe, **kwargs))
    finally:
        module.train(was_training)
    channels = [int(o.shape[1]) for o in outs]
    strides = [
        tuple(max(1, round(p / s)) for p, s in zip(probe, o.shape[2:])) for o in outs
    ]
    return channels, strides
