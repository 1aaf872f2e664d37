"""torchvision models as sources of padded feature levels, through
``torchvision.models.feature_extraction.create_feature_extractor``.

One private base (:class:`_GraphBackbone`) holds what 2D and 3D share: the feature extractor,
the checkpoint report, frozen batch norm and stages, stem adaptation and the measured channels and
strides. :class:`TorchvisionBackbone` (images) and
:class:`~vispos.backbones.VolumeBackbone` (volumes) only build the model.

References:
    torchvision ``models/feature_extraction.py``; Carion et al., DETR ``models/backbone.py``
    (``return_interm_layers``, ``dilation`` for DC5, ``FrozenBatchNorm2d``).
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any, Union

from torch import nn

from .._checks import check_bool, check_int
from .base import BackboneBase
from ._common import (
    adapt_stem,
    check_freeze_args,
    first_conv,
    freeze_batch_norm,
    freeze_through,
    load_checkpoint_state,
    load_state_with_report,
    measure_levels,
)

__all__ = ["TorchvisionBackbone"]

ReturnNodes = Union[Sequence[str], Mapping[str, str]]

#: DETR's ``return_interm_layers``: ``layer1..4`` (strides 4..32), or ``layer4`` alone.
DETR_INTERM_NODES = ("layer1", "layer2", "layer3", "layer4")
DETR_LAST_NODE = ("layer4",)

_STAGE = re.compile(r"^layer(\d+)$")


def _check_return_nodes(return_nodes: Any) -> dict[str, str]:
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


class _GraphBackbone(BackboneBase):
    """Shared machinery of the torchvision adapters (2D and 3D); not public.

    Subclasses build ``model`` (a private copy the base may modify) and call ``_setup``.
    """

    n_spatial: int = 2
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
    ) -> None:
        self.weights = weights
        self.checkpoint_path = checkpoint_path
        self.train_backbone = train_backbone
        self.frozen_stages = frozen_stages
        self.frozen_batch_norm = frozen_batch_norm
        from torchvision.models.feature_extraction import create_feature_extractor, get_graph_node_names

        try:
            self.body = create_feature_extractor(model, return_nodes=return_nodes)
        except ValueError as exc:
            _, eval_nodes = get_graph_node_names(model)
            tops = [n for n in eval_nodes if "." not in n][:20]
            raise ValueError(
                f"return_nodes {list(return_nodes)} are not all nodes of {type(model).__name__}: {exc}. "
                f"Top-level nodes: {tops}; see torchvision.models.feature_extraction.get_graph_node_names"
            ) from None
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
            freeze_batch_norm(self.body, n_spatial=self.n_spatial)
        if not train_backbone:
            freeze_through(self.body, None)
        elif frozen_stages >= 0:
            freeze_through(self.body, self._stage_boundary(frozen_stages))
        channels, strides = measure_levels(
            lambda t: list(self.body(t).values()), self.body, self.in_chans, self._probe
        )
        self.num_channels = channels
        self.level_strides = strides  # per axis, tensor axis order

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
            f"num_channels={self.num_channels}, strides={self.strides}"
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


class TorchvisionBackbone(_GraphBackbone):
    """A torchvision image model cut at ``return_nodes``, returning one :class:`NestedTensor`
    per node.

    Built on ``torchvision.models.feature_extraction.create_feature_extractor``. Channels and
    strides are **measured** by one forward pass on zeros ``(1, in_chans, 128, 128)`` at
    construction (in eval mode, so batch-norm statistics are untouched), never hard-coded.

    Args:
        name_or_model (str | nn.Module): a torchvision model name
            (``torchvision.models.list_models()``), built with ``weights`` and ``model_kwargs``;
            or a model, which is deep-copied (the caller's model is never modified).
        return_nodes (list[str] | dict[str, str], optional): graph nodes to return, in order
            (``get_graph_node_names``). Default: DETR's choice from ``return_interm_layers``.
        return_interm_layers (bool): when ``return_nodes`` is None, return ``layer1..layer4``
            (strides 4..32, DETR's segmentation setting) instead of ``layer4`` alone. Default False.
        dilation (bool): replace the last stage's stride by dilation (DETR's DC5: ``layer4`` at
            stride 16). Only with a model name from the ResNet family.
        weights (str, optional): torchvision weights name passed to ``get_model``. Default None
            (random); anything else may download unless torchvision's cache holds it.
        checkpoint_path (str, optional): a local state dict to load (prefixes such as DETR's
            ``backbone.0.body.`` are stripped); see ``load_report``.
        in_chans (int, optional): input channels; the stem convolution is adapted (mean of its
            kernels, scaled so equal channels give the same response) when it differs from the
            model's. Default: the model's own.
        train_backbone (bool): False freezes every parameter. Default True.
        frozen_stages (int): ``-1`` trains every stage; ``0`` freezes the stem (every module before
            ``layer1``); ``k`` freezes the stem and ``layer1..layer<k>`` (DETR: 1). ResNet naming.
        frozen_batch_norm (bool): replace batch norm by torchvision's ``FrozenBatchNorm2d``
            (statistics copied), as DETR does. Default False.
        model_kwargs (dict, optional): further keywords for ``torchvision.models.get_model``.

    Attributes:
        num_channels (list[int]), strides (list[int | tuple[int, int]]): measured per level.
        level_strides (list[tuple[int, int]]): measured per level and axis (H, W).
        return_nodes (dict[str, str]), in_chans (int), n_spatial (int): 2.
        load_report (dict | None): as :class:`~vispos.backbones.TimmBackbone`'s.

    Shape:
        - input: NestedTensor ``(B, in_chans, H, W)``, mask ``(B, H, W)`` bool (or none).
        - output: list of NestedTensor ``(B, num_channels[l], H_l, W_l)``, masks ``(B, H_l, W_l)``
          (the input mask resized by nearest neighbour), True = padding.

    Raises:
        TypeError: ``name_or_model`` is neither a str nor an nn.Module; malformed
            ``return_nodes``; non-bool flags; ``forward`` given anything but a NestedTensor.
        ValueError: an unknown model name; a node not in the model (the message lists the
            top-level nodes); ``dilation`` with a model instance or a model that does not take
            it; a bad ``frozen_stages``; wrong input shape, or an input on another device than
            the weights; a corrupt checkpoint or one missing weights.
        FileNotFoundError: ``checkpoint_path`` does not exist.

    References:
        torchvision ``create_feature_extractor``; Carion et al., End-to-End Object Detection with
        Transformers, ECCV 2020 (``models/backbone.py``).
    """

    n_spatial = 2
    _probe = (128, 128)

    def __init__(
        self,
        name_or_model: str | nn.Module,
        return_nodes: ReturnNodes | None = None,
        return_interm_layers: bool = False,
        dilation: bool = False,
        weights: str | None = None,
        checkpoint_path: str | None = None,
        in_chans: int | None = None,
        train_backbone: bool = True,
        frozen_stages: int = -1,
        frozen_batch_norm: bool = False,
        model_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        import torchvision

        for name, value in (("return_interm_layers", return_interm_layers), ("dilation", dilation)):
            check_bool(value, name)
        check_freeze_args(train_backbone, frozen_stages, frozen_batch_norm)
        kwargs = dict(model_kwargs or {})
        if isinstance(name_or_model, str):
            names = torchvision.models.list_models(module=torchvision.models)
            if name_or_model not in names:
                close = [n for n in names if n.startswith(name_or_model[:4])][:10]
                raise ValueError(
                    f"name_or_model {name_or_model!r} is not a torchvision classification model; "
                    f"similar names: {close}"
                )
            if dilation:
                kwargs["replace_stride_with_dilation"] = [False, False, True]
            try:
                model = torchvision.models.get_model(name_or_model, weights=weights, **kwargs)
            except (TypeError, ValueError, NotImplementedError) as exc:
                raise ValueError(f"cannot build {name_or_model!r} with {kwargs}: {exc}") from None
            self.model_name = name_or_model
        elif isinstance(name_or_model, nn.Module):
            if dilation or weights is not None or kwargs:
                raise ValueError(
                    "dilation, weights and model_kwargs apply when building from a name; build "
                    "the model with them and pass it, or pass its name"
                )
            model = copy.deepcopy(name_or_model)
            self.model_name = type(name_or_model).__name__
        else:
            raise TypeError(
                f"name_or_model must be a torchvision model name or an nn.Module, got "
                f"{type(name_or_model).__name__}"
            )
        if return_nodes is None:
            return_nodes = DETR_INTERM_NODES if return_interm_layers else DETR_LAST_NODE
        nodes = _check_return_nodes(return_nodes)
        self.return_interm_layers = return_interm_layers
        self.dilation = dilation
        self._setup(
            model, nodes, in_chans=in_chans, weights=weights, checkpoint_path=checkpoint_path,
            train_backbone=train_backbone, frozen_stages=frozen_stages,
            frozen_batch_norm=frozen_batch_norm,
        )

    def _own_repr(self) -> str:
        return f"dilation={self.dilation}"
