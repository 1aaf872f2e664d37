"""torchvision image models as sources of padded 2D feature levels.

Traced and cut at torchvision's node names (as ``create_feature_extractor`` does) by the shared
:class:`~vispos.backbones._graph.GraphBackbone` (also behind
:class:`~vispos.backbones.VolumeBackbone`); this module only builds the 2D model.

References:
    torchvision ``models/feature_extraction.py``; Carion et al., DETR ``models/backbone.py``
    (``return_interm_layers``, ``dilation`` for DC5, ``FrozenBatchNorm2d``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from torch import nn

from .._checks import check_bool
from .._suggest import close_names
from ._freezing import check_freeze_args
from ._graph import GraphBackbone, ReturnNodes, check_return_nodes
from ._pretrained import cached_torchvision_weights
from ._stages import stage_nodes
from ._stems import first_conv

__all__ = ["TorchvisionBackbone"]

#: DETR's ``return_interm_layers``: ``layer1..4`` (strides 4..32), or ``layer4`` alone.
DETR_INTERM_NODES = ("layer1", "layer2", "layer3", "layer4")
DETR_LAST_NODE = ("layer4",)


class TorchvisionBackbone(GraphBackbone):
    """A torchvision image model cut at ``return_nodes``, returning one :class:`NestedTensor`
    per node.

    Cut by torchvision's node names (``get_graph_node_names``) and traced by vispos' tracer
    (:func:`vispos.invariance.trace_features`, as ``create_feature_extractor`` but with torchvision's
    ``Conv2dNormActivation``, ``SqueezeExcitation`` and ``StochasticDepth`` opened). Channels and
    strides are **measured** by one forward pass on zeros ``(1, in_chans, 128, 128)`` at
    construction (in eval mode, so batch-norm statistics are untouched), never hard-coded.

    Args:
        name_or_model (str | nn.Module): a torchvision model name
            (``torchvision.models.list_models()``), built with ``weights`` and ``model_kwargs``;
            or a model, which is deep-copied (the caller's model is never modified).
        return_nodes (list[str] | dict[str, str], optional): graph nodes to return, in order
            (``get_graph_node_names``; a module's name is its last node). Default: each family's
            stage outputs, chosen by ``return_interm_layers``: ResNets' ``layer4`` (DETR), else the
            last module of the largest stride, measured (see :mod:`vispos.backbones._stages`;
            EfficientNet / MobileNet ``features.N``, RegNet ``trunk_output.block4``, DenseNet
            ``features.norm5``, Inception ``Mixed_7c``).
        return_interm_layers (bool): when ``return_nodes`` is None, return four levels at strides
            4..32 (ResNets: ``layer1..layer4``, DETR's segmentation setting; other families: the last
            module of each of the last four strides >= 4) instead of the last alone. Default False.
        dilation (bool): replace the last stage's stride by dilation (DETR's DC5: ``layer4`` at
            stride 16). Only with a model name from the ResNet family.
        weights (str, optional): torchvision weights name passed to ``get_model`` (``"DEFAULT"``,
            ``"IMAGENET1K_V1"``, ...). Default None (random). Read from the torch hub cache only
            (``torch.hub.get_dir()/checkpoints``): nothing is downloaded, and weights that are not
            cached raise ``FileNotFoundError`` at once, naming the file and how to pass
            ``checkpoint_path`` instead.
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
        padding_invariant (bool): an item in a padded batch (at the origin, DETR's layout) gets on
            its own cells exactly the features it gets alone, on every level, in eval and training
            mode: every layer of the feature-extraction graph that mixes cells is rewritten
            (convolutions and pools see zeros / ``-inf`` outside the item, also where FX traced
            through a ``Conv3d`` subclass; batch norm in training, group / instance norm and global
            pooling take statistics over valid cells), and each level's mask marks exactly the
            cells outside the item's own feature map (convolution arithmetic). Layers that cannot
            be made exact are refused here, by name. Default False: DETR's numbers.

    Attributes:
        num_channels (list[int]), strides (list[int | tuple[int, int]]): measured per level.
        level_strides (list[tuple[int, int]]): measured per level and axis (H, W).
        return_nodes (dict[str, str]), in_chans (int), num_axes (int): 2.
        load_report (dict | None): as :class:`~vispos.backbones.TimmBackbone`'s.

    Shape:
        - input: NestedTensor ``(B, in_chans, H, W)``, mask ``(B, H, W)`` bool (or none).
        - output: list of NestedTensor ``(B, num_channels[l], H_l, W_l)``, masks ``(B, H_l, W_l)``
          (the input mask resized by nearest neighbour), True = padding.

    Raises:
        TypeError: ``name_or_model`` is neither a str nor an nn.Module; malformed
            ``return_nodes``; non-bool flags; ``forward`` given anything but a NestedTensor.
        ValueError: an unknown model name; a node not in the model (the message lists the
            top-level nodes); a layer torch.fx cannot trace (named); with ``return_nodes=None``, a
            model whose stage outputs cannot be measured (it rejects a 160x128 input, or returns no
            channels-first map); ``dilation`` with a model instance or a model that does not take
            it; a bad ``frozen_stages``; wrong input shape, or an input on another device than
            the weights; a corrupt checkpoint or one missing weights; ``weights`` that are not the
            model's; with ``padding_invariant=True``, a layer that cannot be made exact (named),
            and at ``forward`` an arbitrary (non-box) mask or an item too small for the model.
        FileNotFoundError: ``checkpoint_path`` does not exist; ``weights`` are not in the torch
            hub cache.

    References:
        torchvision ``create_feature_extractor``; Carion et al., End-to-End Object Detection with
        Transformers, ECCV 2020 (``models/backbone.py``).
    """

    num_axes = 2
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
        padding_invariant: bool = False,
    ) -> None:
        super().__init__()
        import torchvision

        for name, value in (("return_interm_layers", return_interm_layers), ("dilation", dilation)):
            check_bool(value, name)
        frozen_stages = check_freeze_args(train_backbone, frozen_stages, frozen_batch_norm)
        kwargs = dict(model_kwargs or {})
        if isinstance(name_or_model, str):
            names = torchvision.models.list_models(module=torchvision.models)
            if name_or_model not in names:
                raise ValueError(
                    f"name_or_model {name_or_model!r} is not a torchvision classification model; "
                    f"nearest names: {close_names(name_or_model, names)}"
                )
            if dilation:
                kwargs["replace_stride_with_dilation"] = [False, False, True]
            resolved = cached_torchvision_weights(name_or_model, weights)  # never downloads
            try:
                model = torchvision.models.get_model(name_or_model, weights=resolved, **kwargs)
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
        if return_nodes is None and all(hasattr(model, node) for node in DETR_INTERM_NODES):
            return_nodes = DETR_INTERM_NODES if return_interm_layers else DETR_LAST_NODE
        elif return_nodes is None:  # measured: the last module of each stride
            return_nodes = stage_nodes(model, first_conv(model)[1].in_channels, return_interm_layers,
                                       model_name=self.model_name)
        nodes = check_return_nodes(return_nodes)
        self.return_interm_layers = return_interm_layers
        self.dilation = dilation
        self._setup(
            model, nodes, in_chans=in_chans, weights=weights, checkpoint_path=checkpoint_path,
            train_backbone=train_backbone, frozen_stages=frozen_stages,
            frozen_batch_norm=frozen_batch_norm, padding_invariant=padding_invariant,
        )

    def _own_repr(self) -> str:
        return f"dilation={self.dilation}"
